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

Parallel slots (`--slots N`, TuneRunner(slots=[(Slot, owner), ...]), docs/decisions.md "Tune: parallel slots at run
time"): one task per launch in flight, all in one asyncio.TaskGroup of `run` (a cancel or a failed launch cancels
the others; nothing outlives the run). Whenever a slot is free the rule decides on the launches finished so far and
app.core.tune.slots_stats.pick_slot_assignment says which candidate of its `next` goes on which free slot (the
history it balances includes the launches in flight); the budget counts the launches in flight. Once the rule is
done (or the time budget is spent) while launches are still in flight, those are cancelled, not waited for: they
could change nothing the rule decided, as one slot stops at the same point (their stored rows read back as partial,
not counted). Each slot has its
own owner (its own lifecycle: job record, driver lock, release watch, under the slot's profile name,
app.core.measure.slots.slot_profile), every launch row stores its slot (index, GPUs, port) and every observation
carries it, so the rule blocks on the slot. A resumed run reads the slots back with the launches. The warm-cache
order (below) is the single-slot path's only. At the end the winner runs on slot 0 (the profile's own GPUs and
port); the caller stops the other slots' servers.

Objectives (TuneSettings.objective): output tok/s per stream (the bench's output tok/s over the concurrency), total
output tok/s, goodput (requests/s within the [bench] SLOs) or J/token; the rule wants higher-better values above 0,
so J/token races as tokens/J and goodput 0 reads as no value. Constraints (ttft_p95_ms, tpot_p95_ms): a launch whose
p95 at a shape is over the limit gives no value there (the candidate cannot win that shape); a candidate over a
limit at every shape of its latest launch is out, with why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.core.data import ServerState
from app.core.measure.allocation import AllocationEnding, check_fits
from app.core.measure.bench import run_bench
from app.core.measure.experiment import EnergyFor, ServerOwner
from app.core.measure.http_probes import server_info
from app.core.measure.slots import Slot, slot_profile
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
from app.core.tune.slots_stats import pick_slot_assignment


@dataclass(frozen=True)
class TuneProgress:
    """One step of a running tune, for a progress line, a bar or the screen."""

    kind: str  # launch | ready | shape | decision | restore | done | cancelled | failed
    text: str
    launches_done: int = 0
    launches_budget: int = 0
    eta_s: float | None = None
    decision: Decision | None = None
    slot: int | None = None  # the slot of a launch, ready or shape step (`--slots N`); None without slots
    candidate: str | None = None  # the candidate of a launch, ready or shape step (its label)


class TuneRunner:
    """Runs one TuneSpec through the server's owner, writing to a HistoryStore as launches and trials finish.

    `resume`: a stored run of this spec (its launches are the start; module docstring). `slots`: the parallel slots
    and each one's owner, slot 0 first (the profile's own GPUs and port, `owner` unless given); two or more run
    launches at once (module docstring); None or one slot: one launch at a time on `owner`."""

    def __init__(self, spec: TuneSpec, owner: ServerOwner, store: HistoryStore | None = None, *,
                 resume: RunRow | None = None, on_progress: Callable[[TuneProgress], None] | None = None,
                 energy_for: EnergyFor | None = None,
                 slots: Sequence[tuple[Slot, ServerOwner]] | None = None) -> None:
        self.spec = spec
        self.slots: list[tuple[Slot, ServerOwner]] = (
            list(slots) if slots else [(Slot(0, tuple(spec.profile.gpus), spec.profile.port), owner)])
        if [slot.index for slot, _ in self.slots] != list(range(len(self.slots))):
            raise ValueError("slots must be numbered 0, 1, ... in order")
        self.parallel = len(self.slots) > 1
        self.owner = self.slots[0][1]
        self.store = store
        self.on_progress = on_progress
        self.energy_for = energy_for
        self.run_id: int | None = resume.id if resume is not None else None
        self.state = state_from_run(resume, len(spec.shapes)) if resume is not None else TuneState()
        self.resumed = resume is not None
        # launches carry their slot when this run uses slots now or did before it was resumed with one: a launch
        # on the profile's own GPUs is then slot 0's (state_from_run reads an unslotted one back so too)
        self.slotted = self.parallel or any(ln.slot is not None for ln in self.state.launches)
        if self.slotted:  # an unslotted run resumed on slots: its launches ran on slot 0's GPUs and port
            self.state.launches = [ln if ln.slot is not None else replace(ln, slot=0) for ln in self.state.launches]
        self.status = "running"
        self.note = ""
        self.ended_on: str = ""  # what the server runs at the end, said by the CLI
        self.decision: Decision | None = None
        self._started = 0.0
        self._launch_walls: list[float] = []
        self._running: dict[int, int] = {}  # slot -> the candidate its server runs now (this session's launches)
        self._in_flight: dict[int, int] = {}  # slot -> the candidate launching or measuring on it now
        self._reserved: dict[int, set[int]] = {}  # candidate -> its launch numbers in flight

    @property
    def _current(self) -> int | None:
        """The candidate slot 0's server runs now (the profile's own server)."""
        return self._running.get(0)

    @_current.setter
    def _current(self, candidate: int | None) -> None:
        if candidate is None:
            self._running.pop(0, None)
        else:
            self._running[0] = candidate

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
                obs.append(Obs(names[ln.candidate], shape, ln.launch, () if value is None else (value,), ln.slot))
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
    def _emit(self, kind: str, text: str, decision: Decision | None = None, slot: int | None = None,
              candidate: str | None = None) -> None:
        if self.on_progress is None:
            return
        spent = self.state.spent()
        left = max(0, self.spec.max_launches - spent)
        eta = None
        if self._launch_walls and decision is not None and not decision.done:
            per = sum(self._launch_walls) / len(self._launch_walls)
            eta = per * min(left, max(1, len(decision.next)))
            if self.parallel:  # launches side by side: rounds of as many as there are slots
                eta = per * -(-min(left, max(1, len(decision.next))) // len(self.slots))
        self.on_progress(TuneProgress(kind, text, spent, self.spec.max_launches, eta, decision, slot, candidate))

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
            decision = await (self._race_slots() if self.parallel else self._race())
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
        except AllocationEnding as ending:  # kept and resumable on a new allocation
            status, note = "stopped", (f"stopped: allocation ending. {ending}; `tunedash tune {self.spec.profile.name}"
                                       f" --resume {self.run_id}` on a new allocation goes on")
            self._emit("failed", note)
            raise TuneFailed(note, ending.reason) from None
        finally:
            self.status, self.note = status, note
            if self.store is not None and self.run_id is not None:
                data = tune_results(self.spec, self.state, self.decision or self.decide(), status=status,
                                    run_id=self.run_id, note=note, ended_on=self.ended_on).to_json()
                if status != "done":
                    data["resumable"] = True
                if self.parallel:
                    data["slots"] = self.slots_json()
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

    async def _race_slots(self) -> Decision:
        """The race on two or more slots at once (module docstring)."""
        names = self.names()
        changed = asyncio.Event()
        free = [slot.index for slot, _ in self.slots]
        ended: set[int] = set()  # slots whose own allocation cannot hold a launch any more (AllocationEnding)
        tasks: dict[int, asyncio.Task[None]] = {}  # slot -> its launch in flight

        async def one(candidate: int, k: int, slot: int, number: int) -> None:
            try:
                await self._launch(candidate, slot, k, number)
            except AllocationEnding as ending:  # each slot's allocation ends on its own; the run only with the last
                ended.add(slot)
                if len(ended) == len(self.slots):
                    raise
                self._emit("slot", f"slot {slot} takes no more launches: {ending}; the other slots go on",
                           slot=slot)
            finally:
                self._in_flight.pop(slot, None)
                tasks.pop(slot, None)
                self._reserved.get(candidate, set()).discard(k)
                if slot not in ended:
                    free.append(slot)
                    free.sort()
                changed.set()

        try:
            async with asyncio.TaskGroup() as group:
                while True:
                    changed.clear()
                    decision = self.decide()
                    stop = decision.done
                    budget = self.spec.time_budget_s
                    if not stop and budget is not None and self.elapsed() >= budget:
                        decision = replace(decision, done=True, next=(),
                                           why_done=f"time budget spent: {self.elapsed():.0f} s of {budget:.0f} s")
                        self.decision, stop = decision, True
                    if not self._in_flight or not stop:
                        self._emit("decision", decision.why_done or f"next: {', '.join(decision.next[:4])}"
                                   + (" ..." if len(decision.next) > 4 else ""), decision)
                    flying_now = [t for t in tasks.values() if not t.cancelling()]
                    if stop and flying_now:  # decided (or out of time): what is in flight can change nothing now
                        self._emit("slot", f"{decision.why_done}: {len(flying_now)} launch"
                                   f"{'es' if len(flying_now) > 1 else ''} in flight cancelled (not counted)")
                        for task in flying_now:
                            task.cancel()
                    left = self.spec.max_launches - self.state.spent() - len(self._in_flight)
                    if not stop and left > 0 and free:
                        history: dict[str, list[int]] = {}
                        for ln in self.counted():
                            if ln.slot is not None:
                                history.setdefault(names[ln.candidate], []).append(ln.slot)
                        for slot, c in self._in_flight.items():
                            history.setdefault(names[c], []).append(slot)
                        flying = {names[c] for c in self._in_flight.values()}
                        pairs = pick_slot_assignment(decision.next, free, history, flying)
                        if not pairs and not self._in_flight and decision.next:  # cannot happen (all slots free)
                            pairs = [(decision.next[0], free[0])]
                        for name, slot in pairs[:left]:
                            c = names.index(name)
                            k = self._next_number(c)
                            self._reserved.setdefault(c, set()).add(k)
                            free.remove(slot)
                            self._in_flight[slot] = c
                            number = self.state.spent() + len(self._in_flight)
                            tasks[slot] = group.create_task(one(c, k, slot, number),
                                                            name=f"tune: {name} on slot {slot}")
                    if not self._in_flight:
                        return self.decision or decision
                    await changed.wait()
        except BaseExceptionGroup as failed:  # a launch that failed (the others were cancelled): raised as itself
            first: BaseException = failed
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None

    def _next_number(self, candidate: int) -> int:
        """The next launch number of `candidate`, past the stored ones and those in flight."""
        return max(self.state.next_launch(candidate), max(self._reserved.get(candidate, ()), default=-1) + 1)

    def slots_json(self) -> dict[str, Any]:
        """The slots (GPUs, port) with each one's estimated effect and the A/A across slots (results' "slots")."""
        fx = self.decision.slots if self.decision is not None else None
        rows = []
        for slot, _ in self.slots:
            effect = next((e for e in fx.effects if e.slot == slot.index), None) if fx is not None else None
            rows.append({"index": slot.index, "gpus": list(slot.gpus), "port": slot.port,
                         "launches": sum(1 for ln in self.counted() if ln.slot == slot.index),
                         "factor": None if effect is None else effect.factor,
                         "ci": None if effect is None or effect.ci is None else list(effect.ci)})
        return {"slots": rows, "aa": None if fx is None else fx.aa_text,
                "differ": None if fx is None else fx.significant,
                "estimated": None if fx is None else fx.estimated}

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

    async def _launch(self, candidate: int, slot_index: int = 0, k: int | None = None,
                      number: int | None = None) -> None:
        """One launch of `candidate` on a slot (slot 0, the profile's own, without slots): relaunch, warm-up, every
        shape; appended to the state once complete (or failed to come up)."""
        spec = self.spec
        c = spec.candidates[candidate]
        k = self.state.next_launch(candidate) if k is None else k
        slot, owner = self.slots[slot_index]
        at = slot if self.parallel else None  # launched as the slot (its name, GPUs, port)
        kept = slot if self.slotted else None  # the slot stored with the launch (slot 0 of a resumed slotted run)
        where = None if kept is None else kept.index
        profile = slot_profile(self._profile(candidate), slot) if at is not None else self._profile(candidate)
        number = self.state.spent() + 1 if number is None else number
        on = f" on slot {slot.index}" if at is not None else ""
        which = f"launch {number}/{spec.max_launches}{on}: {c.label} (its launch {k + 1})"
        await check_fits(owner.host, max(self._launch_walls, default=0.0), f"candidate {c.label}{on}")
        self._emit("launch", which + (f" [GPUs {','.join(map(str, slot.gpus))}, port {slot.port}]" if on else ""),
                   slot=where, candidate=c.label)
        started = time.monotonic()
        try:
            state = await owner.relaunch(profile, ready_timeout_s=spec.ready_timeout_s, change=f"tune {which}")
        except LaunchRefused as refused:
            await self._record_launch(candidate, k, profile, None, "refused", slot=kept)
            raise TuneFailed(f"candidate {c.label}{on}: {refused}", refused.reason) from None
        self._running[slot.index] = candidate
        life = owner.view()
        if state != ServerState.READY:
            outcome = state.value.lower()
            await self._record_launch(candidate, k, profile, None, outcome, slot=kept)
            self.state.launches.append(LaunchDone(candidate, k, outcome, slot=where))
            detail = life.crash_detail() if state == ServerState.CRASHED else ""
            self._emit("ready", f"{which}: did not become ready (state {state.value}{': ' + detail if detail else ''})",
                       slot=where, candidate=c.label)
            return
        url = await owner.host.http_base(profile.port)
        info = await server_info(url, profile.backend)
        await self._record_launch(candidate, k, profile, info, "ready", life.phase_times, slot=kept)
        self._emit("ready", f"{which}: ready after {time.monotonic() - started:.1f} s", slot=where, candidate=c.label)
        if spec.profile.bench.warmup > 0:
            widest = max(spec.shapes, key=lambda s: s.concurrency)
            warm = replace(spec.bench(widest), requests=spec.profile.bench.warmup)
            await run_bench(url, profile.model, warm)
        trials = []
        for s, shape in enumerate(spec.shapes):
            trials.append(await self._shape(candidate, k, s, shape, profile, url, at))
        self.state.launches.append(LaunchDone(candidate, k, "ready", tuple(trials), time.monotonic() - started,
                                              where))
        self._launch_walls.append(time.monotonic() - started)

    async def _record_launch(self, candidate: int, k: int, profile: Profile, info: dict[str, Any] | None,
                             outcome: str, times: dict[str, float] | None = None, *,
                             slot: Slot | None = None) -> None:
        if self.store is None:
            return
        server_flags = None
        if info is not None:
            server_flags = {k2: v for k2, v in info.items() if not isinstance(v, (dict, list)) or k2 == "speculative"}
        await self.store.in_thread(
            self.store.add_launch, run_id=self.run_id, arm_idx=candidate, profile=profile.name, host=profile.host,
            argv=launch_argv(profile), flags=dict(profile.flags), server_flags=server_flags,
            phase_times=times or {}, outcome=outcome, launch_idx=k,
            slot=None if slot is None else slot.to_json())

    async def _shape(self, candidate: int, k: int, s: int, shape: TuneShape, profile: Profile,
                     url: str, slot: Slot | None = None) -> ShapeTrial:
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
        where = "" if slot is None else f"[slot {slot.index}: {self.spec.candidates[candidate].label}] "
        self._emit("shape", f"  {where}{shape.label}: {shown}" + (f" ({trial.over})" if trial.over else "")
                   + (f", {summary.errors} errors" if summary.errors else ""),
                   slot=None if slot is None else slot.index, candidate=self.spec.candidates[candidate].label)
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
        self._running[0] = target
        self.ended_on = f"{label} ({why})" + ("" if state == ServerState.READY else f", state {state.value}")
