"""A/B experiments: arms (a profile plus flag overrides), relaunches through the server's owner, trials, statistics.

An arm is written "F=V F=V ..." (shlex words; `!F` unsets a flag) and applied to the profile with
app.core.profiles.loading.apply_overrides. For each arm: relaunch (kill -> confirm free -> launch -> wait ready),
record the launch with the server's own resolved flags, send the warm-up requests (excluded), then run
its trials; each trial is the same fixed request set (BenchSpec) and its value is the trial's output
tok/s. Order: every trial of A, then every trial of B (one relaunch per arm), or interleaved
(A B B A A B ...: a relaunch at every change of arm) to cancel slow drift of the host.

Every finished trial is written to the history at once; cancelling (Ctrl-C, escape) keeps the finished
trials, marks the run "cancelled" and still reports statistics of what was done. A server that does not
come up for an arm fails the run (ExperimentFailed, Reason.START_FAILED) with the crash detail. After the run
the last arm's server keeps running. Statistics: app.core.measure.stats (t intervals, log-ratio delta method).
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from app.core.data import ServerState
from app.core.errors import Reason, TunedashError
from app.core.hosts.base import Host
from app.core.measure.acceptance import AcceptanceMeter
from app.core.measure.bench import BenchResult, BenchSpec, run_bench
from app.core.measure.client import RequestResult
from app.core.measure.http_probes import server_info
from app.core.measure.stats import ArmStats, RatioStats, arm_stats, ratio_stats, verdict
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import apply_overrides
from app.core.profiles.render import launch_argv
from app.core.profiles.types import Profile, ProfileError
from app.core.server.events import LifecycleEvent, LifecycleView, ServerLogEvent
from app.core.server.preflight import LaunchRefused

ARM_LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class ExperimentFailed(TunedashError):
    """The experiment stopped: a server did not start or could not be relaunched (the reason says which)."""

    def __init__(self, message: str, reason: Reason = Reason.START_FAILED) -> None:
        super().__init__(message, reason)


@dataclass(frozen=True)
class ArmSpec:
    label: str
    profile: Profile
    overrides: str  # as the user wrote it ("speculative-num-steps=3")


def parse_arm(profile: Profile, text: str, label: str) -> ArmSpec:
    """'F=V F=V !F' -> the arm's profile. Bad input raises ProfileError naming the arm and the flag."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ProfileError(f"arm {label} ({text!r}): {exc}; write it as \"FLAG=VALUE FLAG=VALUE\"") from None
    sets = [w for w in words if not w.startswith("!")]
    unsets = [w[1:] for w in words if w.startswith("!")]
    try:
        arm_profile = apply_overrides(profile, sets, unsets)
    except ProfileError as exc:
        raise ProfileError(f"arm {label} ({text!r}): {exc}") from None
    return ArmSpec(label, arm_profile, text)


@dataclass(frozen=True)
class ExperimentSpec:
    arms: list[ArmSpec]
    trials: int
    bench: BenchSpec
    interleave: bool = False
    ready_timeout_s: float = 600.0

    def schedule(self) -> list[tuple[int, int]]:
        """(arm, trial) in run order: arm by arm, or A B B A A B ... when interleaved."""
        n = len(self.arms)
        if not self.interleave:
            return [(a, t) for a in range(n) for t in range(self.trials)]
        order: list[tuple[int, int]] = []
        for t in range(self.trials):
            arms = range(n) if t % 2 == 0 else range(n - 1, -1, -1)
            order.extend((a, t) for a in arms)
        return order

    def params_json(self) -> dict[str, Any]:
        return {"trials": self.trials, "interleave": self.interleave, "bench": self.bench.to_json(),
                "metric": "output tok/s per trial"}


@dataclass(frozen=True)
class ExperimentProgress:
    """One step of a running experiment, for a progress line or bar."""

    kind: str  # relaunch | ready | warmup | request | trial | done | cancelled | failed
    text: str
    arm: int | None = None
    trial: int | None = None
    trials_done: int = 0
    trials_total: int = 0
    requests_done: int = 0
    requests_total: int = 0
    value: float | None = None


@dataclass
class ArmOutcome:
    label: str
    overrides: str
    values: list[float] = field(default_factory=list)
    accept: list[float] = field(default_factory=list)
    errors: int = 0
    requests: int = 0
    output_tokens: int = 0
    phase_times: list[dict[str, float]] = field(default_factory=list)

    @property
    def stats(self) -> ArmStats:
        return arm_stats(self.values)


@dataclass
class ExperimentResult:
    """What the experiment measured (possibly partial: status "cancelled" or "failed")."""

    run_id: int | None
    status: str
    arms: list[ArmOutcome]
    note: str = ""

    def ratio(self, arm: int = 1) -> RatioStats:
        return ratio_stats(self.arms[0].values, self.arms[arm].values)

    def verdicts(self) -> list[str]:
        """One verdict per arm after the first, against the first."""
        first = self.arms[0]
        return [verdict(first.values, arm.values, a_name=first.label, b_name=arm.label) for arm in self.arms[1:]]

    @property
    def verdict(self) -> str:
        return self.verdicts()[0] if len(self.arms) > 1 else ""

    def to_json(self) -> dict[str, Any]:
        return result_json(self.status, [(a.label, a.overrides, a.values, a.accept, a.errors, a.requests,
                                          a.output_tokens) for a in self.arms], run_id=self.run_id, note=self.note)


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def result_json(status: str, arms: list[tuple[str, str, list[float], list[float], int, int, int]], *,
                run_id: int | None = None, note: str = "") -> dict[str, Any]:
    """The JSON of an experiment: per-arm trials/mean/ci95, `ratio` and `ratio_ci` (B/A) and `verdict`.

    Used both for a live result and for a stored run, so `tunedash export` reproduces `tunedash ab --json`.
    """
    out_arms = []
    for label, overrides, values, accept, errors, requests, tokens in arms:
        st = arm_stats(values)
        out_arms.append({
            "label": label, "overrides": overrides, "trials": [round(v, 4) for v in values], "n": st.n,
            "mean": _round(st.mean), "stdev": _round(st.stdev), "cv": _round(st.cv, 5),
            "ci95": None if st.ci95 is None else [round(st.ci95[0], 3), round(st.ci95[1], 3)],
            "accept_len": _round(sum(accept) / len(accept)) if accept else None,
            "errors": errors, "requests": requests, "output_tokens": tokens,
        })
    data: dict[str, Any] = {"run_id": run_id, "status": status, "metric": "output tok/s per trial", "arms": out_arms}
    if len(arms) > 1:
        first = arms[0]
        comparisons = []
        for other in arms[1:]:
            r = ratio_stats(first[2], other[2])
            comparisons.append({
                "arm": other[0], "ratio": _round(r.ratio, 4),
                "ratio_ci": None if r.ci95 is None else [round(r.ci95[0], 4), round(r.ci95[1], 4)],
                "significant": r.significant,
                "verdict": verdict(first[2], other[2], a_name=first[0], b_name=other[0]),
            })
        data.update(ratio=comparisons[0]["ratio"], ratio_ci=comparisons[0]["ratio_ci"],
                    verdict=comparisons[0]["verdict"], comparisons=comparisons)
    if note:
        data["note"] = note
    return data


class ServerOwner(Protocol):
    """Whoever owns the server the experiment relaunches: the dashboard's Session, or the CLI's ServerLifecycle.

    The experiment never drives a lifecycle behind its owner's back, so after a dashboard A/B the log view,
    the chart's markers and the Flags panel's "running" column follow the arms' launches.
    """

    host: Host

    async def relaunch(self, profile: Profile, *, ready_timeout_s: float | None = None,
                       change: str | None = None) -> ServerState: ...

    def subscribe(self, listener: Callable[[LifecycleEvent], None]) -> Callable[[], None]: ...

    def view(self) -> LifecycleView: ...


class Experiment:
    """Runs one ExperimentSpec through the server's owner, writing to a HistoryStore (optional) as trials finish."""

    def __init__(self, spec: ExperimentSpec, owner: ServerOwner, store: HistoryStore | None = None,
                 *, on_progress: Callable[[ExperimentProgress], None] | None = None) -> None:
        if len(spec.arms) < 2:
            raise ValueError("an experiment needs at least two arms")
        self.spec = spec
        self.owner = owner
        self.store = store
        self.on_progress = on_progress
        self.run_id: int | None = None
        self.result = ExperimentResult(None, "running", [ArmOutcome(a.label, a.overrides) for a in spec.arms])
        self._meter: AcceptanceMeter | None = None

    def _emit(self, kind: str, text: str, **kw: Any) -> None:
        if self.on_progress is not None:
            self.on_progress(ExperimentProgress(kind, text, **kw))

    def _on_lifecycle(self, event: LifecycleEvent) -> None:
        if self._meter is not None and isinstance(event, ServerLogEvent):
            self._meter.feed(event.event)

    async def run(self) -> ExperimentResult:
        spec = self.spec
        first = spec.arms[0].profile
        if self.store is not None:
            self.run_id = self.store.start_run(
                "ab", profile=first.name, host=first.host, backend=first.backend, model=first.model,
                params=spec.params_json(),
                arms=[(a.label, a.overrides, dict(a.profile.flags)) for a in spec.arms])
            self.result.run_id = self.run_id
        unsubscribe = self.owner.subscribe(self._on_lifecycle)
        status, note = "failed", ""
        try:
            await self._run_schedule()
            status = "done"
        except asyncio.CancelledError:
            status, note = "cancelled", "cancelled; the finished trials are kept"
            self._emit("cancelled", note)
            raise
        except ExperimentFailed as exc:
            note = str(exc)
            self._emit("failed", note)
            raise
        finally:
            unsubscribe()
            self.result.status = status
            self.result.note = note
            if self.store is not None and self.run_id is not None:
                data = self.result.to_json()
                self.store.finish_run(self.run_id, status, summary=data, verdict=data.get("verdict"), note=note or None)
        self._emit("done", self.result.verdict, trials_done=len(spec.schedule()), trials_total=len(spec.schedule()))
        return self.result

    async def _run_schedule(self) -> None:
        spec = self.spec
        order = spec.schedule()
        current: int | None = None
        for done, (arm_idx, trial_idx) in enumerate(order):
            if arm_idx != current:
                await self._relaunch(arm_idx, done, len(order))
                current = arm_idx
            await self._trial(arm_idx, trial_idx, done, len(order))

    async def _relaunch(self, arm_idx: int, done: int, total: int) -> None:
        arm = self.spec.arms[arm_idx]
        self._emit("relaunch", f"arm {arm.label}: relaunch with {arm.overrides or 'the profile as is'}",
                   arm=arm_idx, trials_done=done, trials_total=total)
        started = time.time()
        try:
            state = await self.owner.relaunch(arm.profile, ready_timeout_s=self.spec.ready_timeout_s,
                                              change=f"arm {arm.label}: {arm.overrides or 'the profile as is'}")
        except LaunchRefused as refused:
            self._record_launch(arm_idx, arm.profile, None, "refused")
            raise ExperimentFailed(f"arm {arm.label}: {refused}", refused.reason) from None
        life = self.owner.view()
        times = life.phase_times
        if state != ServerState.READY:
            self._record_launch(arm_idx, arm.profile, None, state.value.lower())
            raise ExperimentFailed(
                f"arm {arm.label} ({arm.overrides}): the server did not become ready (state {state.value}"
                f"{'' if state != ServerState.CRASHED else ': ' + life.crash_detail()}); see the log "
                f"{life.record.log_path if life.record else ''}".rstrip(), Reason.START_FAILED)
        url = await self.owner.host.http_base(arm.profile.port)
        info = await server_info(url, arm.profile.backend)
        self._record_launch(arm_idx, arm.profile, info, "ready", times)
        self.result.arms[arm_idx].phase_times.append(times)
        self._emit("ready", f"arm {arm.label}: ready after {time.time() - started:.1f} s", arm=arm_idx,
                   trials_done=done, trials_total=total)
        if self.spec.bench.warmup > 0:
            self._emit("warmup", f"arm {arm.label}: {self.spec.bench.warmup} warm-up requests (not counted)",
                       arm=arm_idx, trials_done=done, trials_total=total)
            warm = replace(self.spec.bench, requests=self.spec.bench.warmup, warmup=0)
            await run_bench(url, arm.profile.model, warm)

    def _record_launch(self, arm_idx: int, profile: Profile, info: dict[str, Any] | None, outcome: str,
                       times: dict[str, float] | None = None) -> None:
        if self.store is None:
            return
        server_flags = None
        if info is not None:
            server_flags = {k: v for k, v in info.items() if not isinstance(v, (dict, list)) or k == "speculative"}
        self.store.add_launch(run_id=self.run_id, arm_idx=arm_idx, profile=profile.name, host=profile.host,
                              argv=launch_argv(profile), flags=dict(profile.flags), server_flags=server_flags,
                              phase_times=times or {}, outcome=outcome)

    async def _trial(self, arm_idx: int, trial_idx: int, done: int, total: int) -> None:
        arm = self.spec.arms[arm_idx]
        bench = replace(self.spec.bench, warmup=0)
        url = await self.owner.host.http_base(arm.profile.port)
        meter = AcceptanceMeter(arm.profile.backend, url)
        await meter.start()
        self._meter = meter
        finished = 0

        def on_result(_i: int, _r: RequestResult) -> None:
            nonlocal finished
            finished += 1
            self._emit("request", f"arm {arm.label} trial {trial_idx + 1}: {finished}/{bench.requests}",
                       arm=arm_idx, trial=trial_idx, trials_done=done, trials_total=total,
                       requests_done=finished, requests_total=bench.requests)

        try:
            result: BenchResult = await run_bench(url, arm.profile.model, bench, on_result=on_result)
        finally:
            self._meter = None
        accept, source = await meter.stop(result.summary.accept_len)
        summary = result.summary
        value = summary.output_tok_s
        outcome = self.result.arms[arm_idx]
        if value is not None:
            outcome.values.append(value)
        if accept is not None:
            outcome.accept.append(accept)
        outcome.errors += summary.errors
        outcome.requests += summary.requests
        outcome.output_tokens += summary.output_tokens
        if self.store is not None and self.run_id is not None:
            self.store.add_trial(self.run_id, arm_idx, trial_idx, value=value, summary=summary.to_json(),
                                 accept_len=accept, accept_source=source, requests=result.results)
        shown = "no successful request" if value is None else f"{value:.1f} tok/s"
        errors = f", {summary.errors} errors" if summary.errors else ""
        self._emit("trial", f"arm {arm.label} trial {trial_idx + 1}: {shown}{errors}", arm=arm_idx,
                   trial=trial_idx, trials_done=done + 1, trials_total=total, value=value)
