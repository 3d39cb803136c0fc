"""The tune runner: candidates raced over request shapes, one launch measuring every shape, stored as it goes.

Each launch goes through the server's owner exactly as an A/B launch does (app.core.measure.experiment's
ServerOwner: the dashboard's Session or the CLI's lifecycle; relaunch = kill -> confirm free -> launch -> wait
ready), then sends the warm-up requests (left out) and one bench (app.core.measure.bench.run_bench) per request
shape: a shape needs no relaunch, so one launch buys one observation per shape. What launches next is the racing
rule's (app.core.tune.race.decide) after every launch: among the candidates it names with the fewest launches, a
warm profile (app.core.server.warm) takes first the one whose weight-cache key equals the running server's, so the
daemon restarts as rarely as the order allows; otherwise the rule's own interleaved order.

Stored (app.core.measure.store, in its thread worker): a run of kind "tune" whose arms are the candidates; every
launch row (arm = candidate, launch_idx = the candidate's launch number) and every trial (trial_idx = the shape's
index) is committed when it is known. Resume (`--resume ID`, TuneRunner(resume=RunRow)): the observations are the
stored launches; a launch that came up but whose trials are not all there (a crash, a quit or a lost connection
between the launch and its trials) does not count and is launched again under the next launch number, its partial
trials kept in the history; a launch that failed to come up counts as spent (the rule drops a candidate that keeps
failing). Nothing measured is lost and no complete launch is repeated.

Objectives (TuneSettings.objective): output tok/s per stream (the bench's output tok/s over the concurrency), total
output tok/s, goodput (requests/s within the [bench] SLOs) or J/token; the rule wants higher-better values above 0,
so J/token races as tokens/J and goodput 0 reads as no value. Constraints (ttft_p95_ms, tpot_p95_ms): a launch whose
p95 at a shape is over the limit gives no value there (the candidate cannot win that shape); a candidate over a
limit at every shape of its latest launch is out, with why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from app.core.data import ServerState
from app.core.measure.bench import run_bench
from app.core.measure.experiment import EnergyFor, ServerOwner
from app.core.measure.http_probes import server_info
from app.core.measure.store import HistoryStore, RunRow
from app.core.profiles.render import launch_argv
from app.core.profiles.types import Profile, TuneShape
from app.core.server.preflight import LaunchRefused
from app.core.server.warm import key_change, key_flags
from app.core.tune.model import (
    KIND,
    OBJECTIVE_TEXT,
    LaunchDone,
    ShapeTrial,
    TuneFailed,
    TuneSpec,
    TuneState,
    p95_ms,
    race_value,
    state_from_run,
)
from app.core.tune.race import Decision, Obs, decide
from app.core.tune.results import tune_results


@dataclass(frozen=True)
class TuneProgress:
    """One step of a running tune, for a progress line, a bar or the screen."""

    kind: str  # launch | ready | shape | decision | restore | done | cancelled | failed
    text: str
    launches_done: int = 0
    launches_budget: int = 0
    eta_s: float | None = None
    decision: Decision | None = None


class TuneRunner:
    """Runs one TuneSpec through the server's owner, writing to a HistoryStore as launches and trials finish.

    `resume`: a stored run of this spec (its launches are the start; module docstring)."""

    def __init__(self, spec: TuneSpec, owner: ServerOwner, store: HistoryStore | None = None, *,
                 resume: RunRow | None = None, on_progress: Callable[[TuneProgress], None] | None = None,
                 energy_for: EnergyFor | None = None) -> None:
        self.spec = spec
        self.owner = owner
        self.store = store
        self.on_progress = on_progress
        self.energy_for = energy_for
        self.run_id: int | None = resume.id if resume is not None else None
        self.state = state_from_run(resume, len(spec.shapes)) if resume is not None else TuneState()
        self.resumed = resume is not None
        self.status = "running"
        self.note = ""
        self.ended_on: str = ""  # what the server runs at the end, said by the CLI
        self.decision: Decision | None = None
        self._started = 0.0
        self._launch_walls: list[float] = []
        self._current: int | None = None  # the candidate the server runs now (this session's launches)

    # ---- names ---------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return [c.label for c in self.spec.candidates]

    def shape_names(self) -> list[str]:
        return [s.label for s in self.spec.shapes]

    def counted(self) -> list[LaunchDone]:
        """The launches the rule sees: complete and failed ones (not the partial ones being re-done)."""
        return [ln for ln in self.state.launches if ln.outcome != "partial"]

    def observations(self) -> tuple[list[str], list[Obs], dict[str, str]]:
        """(candidates still racing, observations, candidates out for a constraint -> why)."""
        names, shapes, objective = self.names(), self.shape_names(), self.spec.settings.objective
        obs: list[Obs] = []
        latest: dict[int, LaunchDone] = {}
        for ln in self.counted():
            if ln.trials:
                latest[ln.candidate] = ln
            by_shape = {t.shape: t for t in ln.trials}
            for s, shape in enumerate(shapes):
                trial = by_shape.get(s)
                value = race_value(objective, trial) if trial is not None else None
                obs.append(Obs(names[ln.candidate], shape, ln.launch, () if value is None else (value,)))
        out = {names[c]: "over a constraint at every shape: " + "; ".join(
            f"{shapes[t.shape]}: {t.over}" for t in ln.trials)
            for c, ln in latest.items() if ln.trials and all(t.over for t in ln.trials)}
        racing = [n for n in names if n not in out]
        return racing, [o for o in obs if o.candidate in racing], out

    def decide(self) -> Decision:
        racing, obs, out = self.observations()
        if not racing:
            decision = Decision((), dict(out), (), True, "no candidate left: every one broke a constraint",
                                self.state.spent())
        else:
            decision = decide(racing, self.shape_names(), obs, self.spec.rule())
            if out:
                decision = replace(decision, eliminated={**decision.eliminated, **out})
        self.decision = decision
        return decision

    # ---- progress -----------------------------------------------------------------------------------
    def _emit(self, kind: str, text: str, decision: Decision | None = None) -> None:
        if self.on_progress is None:
            return
        spent = self.state.spent()
        left = max(0, self.spec.max_launches - spent)
        eta = None
        if self._launch_walls and decision is not None and not decision.done:
            per = sum(self._launch_walls) / len(self._launch_walls)
            eta = per * min(left, max(1, len(decision.next)))
        self.on_progress(TuneProgress(kind, text, spent, self.spec.max_launches, eta, decision))

    def elapsed(self) -> float:
        return time.monotonic() - self._started if self._started else 0.0

    # ---- the run --------------------------------------------------------------------------------------
    async def run(self) -> Decision:
        spec = self.spec
        self._started = time.monotonic()
        if self.store is not None and self.run_id is None:
            first = spec.profile
            self.run_id = await self.store.in_thread(
                self.store.start_run, KIND, profile=first.name, host=first.host, backend=first.backend,
                model=first.model, params=spec.params_json(),
                arms=[(c.label, c.overrides(first.flags), dict(c.flags)) for c in spec.candidates])
        if self.resumed:
            self._emit("launch", f"resuming run #{self.run_id}: {len(self.counted())} launches kept"
                       + (f", {self.state.partial} without all their trials to do again" if self.state.partial
                          else ""))
        status, note = "failed", ""
        try:
            decision = await self._race()
            status, note = "done", decision.why_done
            await self._end(decision)
        except asyncio.CancelledError:
            status, note = "cancelled", (f"cancelled; every finished launch is kept (`tunedash tune "
                                         f"{self.spec.profile.name} --resume {self.run_id}` goes on)")
            self._emit("cancelled", note)
            raise
        except TuneFailed as exc:
            note = str(exc)
            self._emit("failed", note)
            raise
        finally:
            self.status, self.note = status, note
            if self.store is not None and self.run_id is not None:
                data = tune_results(self.spec, self.state, self.decision or self.decide(), status=status,
                                    run_id=self.run_id, note=note, ended_on=self.ended_on).to_json()
                if status != "done":
                    data["resumable"] = True
                await self.store.in_thread(self.store.finish_run, self.run_id, status, summary=data,
                                           verdict=data.get("verdict"), note=note or None)
        self._emit("done", note, decision)
        return decision

    async def _race(self) -> Decision:
        while True:
            decision = self.decide()
            self._emit("decision", decision.why_done or f"next: {', '.join(decision.next[:4])}"
                       + (" ..." if len(decision.next) > 4 else ""), decision)
            if decision.done:
                return decision
            budget = self.spec.time_budget_s
            if budget is not None and self.elapsed() >= budget:
                decision = replace(decision, done=True, next=(),
                                   why_done=f"time budget spent: {self.elapsed():.0f} s of {budget:.0f} s")
                self.decision = decision
                return decision
            await self._launch(self._pick(decision))

    def _pick(self, decision: Decision) -> int:
        """The candidate to launch: the rule's first; for a warm profile, the first among those with as few
        launches as the rule's first whose cache key equals the running server's (module docstring)."""
        names = self.names()
        order = [names.index(n) for n in decision.next]
        if not self.spec.profile.warm or self._current is None:
            return order[0]
        counts = {c: sum(1 for ln in self.counted() if ln.candidate == c) for c in order}
        least = counts[order[0]]
        now = key_flags(self._profile(self._current))
        for c in order:
            if counts[c] == least and not key_change(self.spec.profile.backend, now, key_flags(self._profile(c))):
                return c
        return order[0]

    def _profile(self, candidate: int) -> Profile:
        return replace(self.spec.profile, flags=dict(self.spec.candidates[candidate].flags))

    async def _launch(self, candidate: int) -> None:
        spec = self.spec
        c = spec.candidates[candidate]
        k = self.state.next_launch(candidate)
        profile = self._profile(candidate)
        which = f"launch {self.state.spent() + 1}/{spec.max_launches}: {c.label} (its launch {k + 1})"
        self._emit("launch", which)
        started = time.monotonic()
        try:
            state = await self.owner.relaunch(profile, ready_timeout_s=spec.ready_timeout_s,
                                              change=f"tune {which}")
        except LaunchRefused as refused:
            await self._record_launch(candidate, k, profile, None, "refused")
            raise TuneFailed(f"candidate {c.label}: {refused}", refused.reason) from None
        self._current = candidate
        life = self.owner.view()
        if state != ServerState.READY:
            outcome = state.value.lower()
            await self._record_launch(candidate, k, profile, None, outcome)
            self.state.launches.append(LaunchDone(candidate, k, outcome))
            detail = life.crash_detail() if state == ServerState.CRASHED else ""
            self._emit("ready", f"{which}: did not become ready (state {state.value}{': ' + detail if detail else ''})")
            return
        url = await self.owner.host.http_base(profile.port)
        info = await server_info(url, profile.backend)
        await self._record_launch(candidate, k, profile, info, "ready", life.phase_times)
        self._emit("ready", f"{which}: ready after {time.monotonic() - started:.1f} s")
        if spec.profile.bench.warmup > 0:
            widest = max(spec.shapes, key=lambda s: s.concurrency)
            warm = replace(spec.bench(widest), requests=spec.profile.bench.warmup)
            await run_bench(url, profile.model, warm)
        trials = []
        for s, shape in enumerate(spec.shapes):
            trials.append(await self._shape(candidate, k, s, shape, profile, url))
        self.state.launches.append(LaunchDone(candidate, k, "ready", tuple(trials), time.monotonic() - started))
        self._launch_walls.append(time.monotonic() - started)

    async def _record_launch(self, candidate: int, k: int, profile: Profile, info: dict[str, Any] | None,
                             outcome: str, times: dict[str, float] | None = None) -> None:
        if self.store is None:
            return
        server_flags = None
        if info is not None:
            server_flags = {k2: v for k2, v in info.items() if not isinstance(v, (dict, list)) or k2 == "speculative"}
        await self.store.in_thread(
            self.store.add_launch, run_id=self.run_id, arm_idx=candidate, profile=profile.name, host=profile.host,
            argv=launch_argv(profile), flags=dict(profile.flags), server_flags=server_flags,
            phase_times=times or {}, outcome=outcome, launch_idx=k)

    async def _shape(self, candidate: int, k: int, s: int, shape: TuneShape, profile: Profile,
                     url: str) -> ShapeTrial:
        spec = self.spec
        bench = spec.bench(shape)
        energy = self.energy_for(profile) if self.energy_for is not None else None
        result = await run_bench(url, profile.model, bench, energy=energy)
        summary = result.summary
        ok = [r for r in result.results if r.ok]
        total = summary.output_tok_s
        stream = None if total is None else total / shape.concurrency
        jpt = summary.energy.get("j_per_token") if summary.energy else None
        ttft95 = p95_ms([r.ttft_s for r in ok])
        tpot95 = p95_ms([r.tpot_s for r in ok])
        st = spec.settings
        over = []
        if st.ttft_p95_ms is not None and ttft95 is not None and ttft95 > st.ttft_p95_ms:
            over.append(f"TTFT p95 {ttft95:.0f} ms > {st.ttft_p95_ms:g} ms")
        if st.tpot_p95_ms is not None and tpot95 is not None and tpot95 > st.tpot_p95_ms:
            over.append(f"TPOT p95 {tpot95:.1f} ms > {st.tpot_p95_ms:g} ms")
        value = {"stream_tok_s": stream, "total_tok_s": total, "goodput": summary.goodput_rps,
                 "j_per_token": jpt}[st.objective]
        trial = ShapeTrial(candidate, k, s, value, total, stream, summary.goodput_rps, jpt, ttft95, tpot95,
                           summary.errors, "; ".join(over))
        if self.store is not None and self.run_id is not None:
            await self.store.in_thread(self.store.add_trial, self.run_id, candidate, s, value=value,
                                       summary={**summary.to_json(), "tune": trial.to_json()},
                                       accept_len=summary.accept_len, accept_source=summary.accept_source,
                                       requests=result.results, launch_idx=k)
        shown = "no value" if value is None else f"{value:.4g} {OBJECTIVE_TEXT[st.objective]}"
        self._emit("shape", f"  {shape.label}: {shown}" + (f" ({trial.over})" if trial.over else "")
                   + (f", {summary.errors} errors" if summary.errors else ""))
        return trial

    async def _end(self, decision: Decision) -> None:
        """The server ends on the winner of the profile's own shape, or on the starting config with restore."""
        spec = self.spec
        if spec.restore:
            target, why = 0, "the starting config (--restore)"
        else:
            board = decision.boards[spec.own_shape()] if decision.boards else None
            best = board.leader or board.front if board is not None else None
            if best is None:
                self.ended_on = "what it ran last (no candidate measured a value: no winner)"
                return
            target = self.names().index(best)
            shape = spec.shapes[spec.own_shape()].label
            why = (f"the winner at {shape}" if board is not None and board.leader == best
                   else f"ahead at {shape}, not separated within the budget")
        label = spec.candidates[target].label
        if self._current == target:
            self.ended_on = f"{label} ({why}), already running"
            return
        self._emit("restore", f"relaunching {label}: {why}")
        try:
            state = await self.owner.relaunch(self._profile(target), ready_timeout_s=spec.ready_timeout_s,
                                              change=f"tune: end on {why}")
        except LaunchRefused as refused:
            self.ended_on = f"{label} could not be launched: {refused}"
            return
        self._current = target
        self.ended_on = f"{label} ({why})" + ("" if state == ServerState.READY else f", state {state.value}")
