"""A/B experiments: arms (a profile plus flag overrides), relaunches through the server's owner, trials, statistics.

An arm is written "F=V F=V ..." (shlex words; `!F` unsets a flag) and applied to the profile with
app.core.profiles.loading.apply_overrides. For each arm: relaunch (kill -> confirm free -> launch -> wait ready),
record the launch with the server's own resolved flags, send the warm-up requests (excluded), then run
its trials; each trial is the same fixed request set (BenchSpec) and its value is the trial's output
tok/s. Each arm runs `launches` launches (default 2) of `trials` trials each: the launch is the unit of the
statistics (a launch's mean is one observation: app.core.measure.stats, launch_ratio_stats), because two
launches of one config differ more than two trials of one launch. Order of the launches: interleaved
A B B A A B B A ... (a relaunch before every launch, the same arm's included) so slow drift of the host
cancels, or arm by arm (A A B B) with interleave=False.

Every finished trial is written to the history at once; cancelling (Ctrl-C, escape) keeps the finished
trials, marks the run "cancelled" and still reports statistics of what was done. A server that does not
come up for an arm fails the run (ExperimentFailed, Reason.START_FAILED) with the crash detail. After the run
the last arm's server keeps running. Statistics: app.core.measure.stats (launch level: the pooled t interval on
log launch means). When the trials' summaries carry "energy" (joules and output tokens over the measured
window, the method named), each arm gets J/token (sum of joules / sum of tokens, and per launch) and the
verdict gives both; energy missing in any trial reads "energy not measured", never 0.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

from app.core.data import ServerState
from app.core.errors import Reason, TunedashError
from app.core.hosts.base import Host
from app.core.measure.acceptance import AcceptanceMeter
from app.core.measure.allocation import AllocationEnding, check_fits
from app.core.measure.bench import BenchResult, BenchSpec, run_bench
from app.core.measure.client import RequestResult
from app.core.measure.http_probes import server_info
from app.core.measure.results import ArmData, ExperimentReport, TrialEnergy, experiment_report
from app.core.measure.stats import LaunchArmStats, RatioStats, launch_arm_stats, launch_ratio_stats
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import apply_overrides
from app.core.profiles.render import launch_argv
from app.core.profiles.types import Profile, ProfileError
from app.core.server.events import LifecycleEvent, LifecycleView, ServerLogEvent
from app.core.server.preflight import LaunchRefused
from app.core.telemetry.energy import EnergyMeter

# A fresh energy meter for an arm's profile (app.core.telemetry.energy.energy_meter_for), one per trial.
EnergyFor = Callable[[Profile], EnergyMeter]

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


class Step(NamedTuple):
    """One trial of the schedule: the arm, the launch within the arm (0-based), the trial within the launch."""

    arm: int
    launch: int
    trial: int


@dataclass(frozen=True)
class ExperimentSpec:
    arms: list[ArmSpec]
    trials: int  # per launch
    bench: BenchSpec
    interleave: bool = True
    ready_timeout_s: float = 600.0
    launches: int = 2  # per arm
    slots: int = 1  # 2: A and B side by side, crossed over the slots (app.core.measure.slot_ab)

    def launch_order(self) -> list[tuple[int, int]]:
        """(arm, launch) in run order: A B B A A B ... when interleaved, else every launch of A, then of B; on two
        slots, round by round (A and B of one round run at the same time)."""
        n = len(self.arms)
        if self.slots > 1:
            return [(a, k) for k in range(self.launches) for a in range(n)]
        if not self.interleave:
            return [(a, k) for a in range(n) for k in range(self.launches)]
        order: list[tuple[int, int]] = []
        for k in range(self.launches):
            arms = range(n) if k % 2 == 0 else range(n - 1, -1, -1)
            order.extend((a, k) for a in arms)
        return order

    def schedule(self) -> list[Step]:
        """Every trial in run order: each launch of launch_order() followed by its trials."""
        return [Step(a, k, t) for a, k in self.launch_order() for t in range(self.trials)]

    def params_json(self) -> dict[str, Any]:
        params: dict[str, Any] = {"trials": self.trials, "launches": self.launches, "interleave": self.interleave,
                                  "bench": self.bench.to_json(), "metric": "output tok/s per trial", "unit": "launch"}
        if self.slots > 1:
            params.update(slots=self.slots, design="crossover")
        return params


@dataclass(frozen=True)
class ExperimentProgress:
    """One step of a running experiment, for a progress line or bar."""

    kind: str  # relaunch | ready | warmup | request | trial | done | cancelled | failed
    text: str
    arm: int | None = None
    trial: int | None = None  # within the launch
    launch: int | None = None  # within the arm
    trials_done: int = 0
    trials_total: int = 0
    requests_done: int = 0
    requests_total: int = 0
    value: float | None = None


@dataclass
class ArmOutcome:
    label: str
    overrides: str
    values: list[float] = field(default_factory=list)  # every successful trial, in order
    launches: list[list[float]] = field(default_factory=list)  # the same values, one list per launch
    energy: list[TrialEnergy] = field(default_factory=list)  # every trial, in order
    accept: list[float] = field(default_factory=list)
    errors: int = 0
    requests: int = 0
    output_tokens: int = 0
    phase_times: list[dict[str, float]] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # the slot of each launch (only on two slots)

    @property
    def stats(self) -> LaunchArmStats:
        return launch_arm_stats(self.launches)

    def data(self) -> ArmData:
        return ArmData(self.label, self.overrides, self.values, self.accept, self.errors, self.requests,
                       self.output_tokens, self.launches, list(self.energy),
                       launch_slots=list(self.slots) if self.slots else None)


@dataclass
class ExperimentResult:
    """What the experiment measured (possibly partial: status "cancelled" or "failed")."""

    run_id: int | None
    status: str
    arms: list[ArmOutcome]
    note: str = ""
    slot_labels: list[str] = field(default_factory=list)  # on two slots: each slot's GPUs and port

    def ratio(self, arm: int = 1) -> RatioStats:
        """B/A from the launches (launch_ratio_stats)."""
        return launch_ratio_stats(self.arms[0].launches, self.arms[arm].launches)

    def verdicts(self) -> list[str]:
        """One verdict per arm after the first, against the first (speed and energy)."""
        return [c.verdict for c in self.report().comparisons]

    @property
    def verdict(self) -> str:
        return self.verdicts()[0] if len(self.arms) > 1 else ""

    def report(self) -> ExperimentReport:
        """What was measured so far, typed (app.core.measure.results): for the screens and the text report."""
        return experiment_report(self.status, [a.data() for a in self.arms], run_id=self.run_id, note=self.note,
                                 slot_labels=self.slot_labels)

    def to_json(self) -> dict[str, Any]:
        return self.report().to_json()


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
                 *, on_progress: Callable[[ExperimentProgress], None] | None = None,
                 energy_for: EnergyFor | None = None) -> None:
        if len(spec.arms) < 2:
            raise ValueError("an experiment needs at least two arms")
        self.spec = spec
        self.owner = owner
        self.store = store
        self.on_progress = on_progress
        self.energy_for = energy_for  # None: trials carry no energy ("energy not measured")
        self.run_id: int | None = None
        self.result = ExperimentResult(None, "running", [ArmOutcome(a.label, a.overrides) for a in spec.arms])
        self._meters: dict[int, AcceptanceMeter] = {}  # id(owner) -> the meter of the trial running there

    def _owners(self) -> list[ServerOwner]:
        """Every owner the experiment relaunches (one; two on slots)."""
        return [self.owner]

    def _placed(self, arm_idx: int, launch_idx: int) -> tuple[ServerOwner, Profile, str]:
        """Where an arm's launch runs: the owner, the profile it launches and a few words for the progress."""
        return self.owner, self.spec.arms[arm_idx].profile, ""

    def _launch_flags(self, arm_idx: int, launch_idx: int, profile: Profile) -> dict[str, Any]:
        """The flags a launch row stores."""
        return dict(profile.flags)

    def _emit(self, kind: str, text: str, **kw: Any) -> None:
        if self.on_progress is not None:
            self.on_progress(ExperimentProgress(kind, text, **kw))

    def _listener(self, owner: ServerOwner) -> Callable[[LifecycleEvent], None]:
        def on_lifecycle(event: LifecycleEvent) -> None:
            meter = self._meters.get(id(owner))
            if meter is not None and isinstance(event, ServerLogEvent):
                meter.feed(event.event)

        return on_lifecycle

    async def run(self) -> ExperimentResult:
        spec = self.spec
        first = spec.arms[0].profile
        if self.store is not None:
            self.run_id = await self.store.in_thread(
                self.store.start_run, "ab", profile=first.name, host=first.host, backend=first.backend,
                model=first.model,
                params=spec.params_json(),
                arms=[(a.label, a.overrides, dict(a.profile.flags)) for a in spec.arms])
            self.result.run_id = self.run_id
        unsubscribes = [owner.subscribe(self._listener(owner)) for owner in self._owners()]
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
            for unsubscribe in unsubscribes:
                unsubscribe()
            self.result.status = status
            self.result.note = note
            report = self.result.report()  # the launch statistics once, for the store and the "done" line
            if self.store is not None and self.run_id is not None:
                await self.store.in_thread(self.store.finish_run, self.run_id, status, summary=report.to_json(),
                                           verdict=report.verdict, note=note or None)
        self._emit("done", report.verdict or "", trials_done=len(spec.schedule()),
                   trials_total=len(spec.schedule()))
        return self.result

    async def _run_schedule(self) -> None:
        spec = self.spec
        order = spec.schedule()
        current: tuple[int, int] | None = None
        longest, started = 0.0, None
        for done, step in enumerate(order):
            if (step.arm, step.launch) != current:
                if started is not None:
                    longest = max(longest, time.monotonic() - started)
                try:
                    await check_fits(self.owner.host, longest, f"arm {self.spec.arms[step.arm].label}")
                except AllocationEnding as ending:
                    raise ExperimentFailed(str(ending), ending.reason) from None
                started = time.monotonic()
                await self._relaunch(step.arm, step.launch, done, len(order))
                current = (step.arm, step.launch)
                self.result.arms[step.arm].launches.append([])
            await self._trial(step, done, len(order))

    async def _relaunch(self, arm_idx: int, launch_idx: int, done: int, total: int) -> None:
        arm = self.spec.arms[arm_idx]
        owner, profile, place = self._placed(arm_idx, launch_idx)
        which = f"arm {arm.label} launch {launch_idx + 1}/{self.spec.launches}{place}"
        self._emit("relaunch", f"{which}: relaunch with {arm.overrides or 'the profile as is'}",
                   arm=arm_idx, launch=launch_idx, trials_done=done, trials_total=total)
        started = time.time()
        try:
            state = await owner.relaunch(profile, ready_timeout_s=self.spec.ready_timeout_s,
                                         change=f"{which}: {arm.overrides or 'the profile as is'}")
        except LaunchRefused as refused:
            await self._record_launch(arm_idx, launch_idx, profile, None, "refused")
            raise ExperimentFailed(f"arm {arm.label}: {refused}", refused.reason) from None
        life = owner.view()
        times = life.phase_times
        if state != ServerState.READY:
            await self._record_launch(arm_idx, launch_idx, profile, None, state.value.lower())
            raise ExperimentFailed(
                f"arm {arm.label} ({arm.overrides}): the server did not become ready (state {state.value}"
                f"{'' if state != ServerState.CRASHED else ': ' + life.crash_detail()}); see the log "
                f"{life.record.log_path if life.record else ''}".rstrip(), Reason.START_FAILED)
        url = await owner.host.http_base(profile.port)
        info = await server_info(url, profile.backend)
        await self._record_launch(arm_idx, launch_idx, profile, info, "ready", times)
        self.result.arms[arm_idx].phase_times.append(times)
        self._emit("ready", f"{which}: ready after {time.time() - started:.1f} s", arm=arm_idx,
                   launch=launch_idx, trials_done=done, trials_total=total)
        if self.spec.bench.warmup > 0:
            self._emit("warmup", f"{which}: {self.spec.bench.warmup} warm-up requests (not counted)",
                       arm=arm_idx, launch=launch_idx, trials_done=done, trials_total=total)
            warm = replace(self.spec.bench, requests=self.spec.bench.warmup, warmup=0)
            await run_bench(url, profile.model, warm)

    async def _record_launch(self, arm_idx: int, launch_idx: int, profile: Profile, info: dict[str, Any] | None,
                             outcome: str, times: dict[str, float] | None = None) -> None:
        if self.store is None:
            return
        server_flags = None
        if info is not None:
            server_flags = {k: v for k, v in info.items() if not isinstance(v, (dict, list)) or k == "speculative"}
        await self.store.in_thread(
            self.store.add_launch, run_id=self.run_id, arm_idx=arm_idx, profile=profile.name, host=profile.host,
            argv=launch_argv(profile), flags=self._launch_flags(arm_idx, launch_idx, profile),
            server_flags=server_flags,
            phase_times=times or {}, outcome=outcome, launch_idx=launch_idx)

    async def _trial(self, step: Step, done: int, total: int) -> None:
        arm_idx, launch_idx, trial_idx = step
        arm = self.spec.arms[arm_idx]
        owner, profile, place = self._placed(arm_idx, launch_idx)
        where = (f"arm {arm.label} launch {launch_idx + 1}/{self.spec.launches}{place} trial {trial_idx + 1}/"
                 f"{self.spec.trials}")
        bench = replace(self.spec.bench, warmup=0)
        url = await owner.host.http_base(profile.port)
        meter = AcceptanceMeter(profile.backend, url)
        await meter.start()
        self._meters[id(owner)] = meter
        finished = 0

        def on_result(_i: int, _r: RequestResult) -> None:
            nonlocal finished
            finished += 1
            self._emit("request", f"{where}: {finished}/{bench.requests}",
                       arm=arm_idx, trial=trial_idx, launch=launch_idx, trials_done=done, trials_total=total,
                       requests_done=finished, requests_total=bench.requests)

        try:
            energy = self.energy_for(profile) if self.energy_for is not None else None
            result: BenchResult = await run_bench(url, profile.model, bench, on_result=on_result, energy=energy)
        finally:
            self._meters.pop(id(owner), None)
        accept, source = await meter.stop(result.summary.accept_len)
        summary = result.summary
        summary_json = summary.to_json()
        value = summary.output_tok_s
        outcome = self.result.arms[arm_idx]
        if value is not None:
            outcome.values.append(value)
            outcome.launches[-1].append(value)
        outcome.energy.append(TrialEnergy.of(launch_idx, summary_json))
        if accept is not None:
            outcome.accept.append(accept)
        outcome.errors += summary.errors
        outcome.requests += summary.requests
        outcome.output_tokens += summary.output_tokens
        if self.store is not None and self.run_id is not None:
            await self.store.in_thread(self.store.add_trial, self.run_id, arm_idx, trial_idx, value=value,
                                       summary=summary_json, accept_len=accept, accept_source=source,
                                       requests=result.results, launch_idx=launch_idx)
        shown = "no successful request" if value is None else f"{value:.1f} tok/s"
        errors = f", {summary.errors} errors" if summary.errors else ""
        self._emit("trial", f"{where}: {shown}{errors}", arm=arm_idx, launch=launch_idx,
                   trial=trial_idx, trials_done=done + 1, trials_total=total, value=value)
