"""A launch or relaunch you see coming: its progress over the phases and an ETA from the last launch like it.

A run is one launch or relaunch (RunStarted .. READY): its phases, in order, are PHASE_ORDER (kill, release, the
weight cache daemon's start, start, load, capture, warmup; each only when it happens). Every run that reaches
READY is recorded (`RunRecord`) in the history, keyed by the launch's configuration (`config_key`: host, backend,
model, GPUs, warm, flags) and the weight cache's state (RunStarted.cache: cold, fill or warm), with the offset
from the run's start at which each phase began, so the gaps between phases (preflight, the record write, the
spawn) count where they fall. The next run of the same key and cache state is planned from the last one
(`plan_from`): its progress is `progress_at` (pure), which the Server panel draws and `tunedash launch --wait`
/ `relaunch` print (`progress_line`, `PlainProgress`); without such a run it falls back to the last run of the
same profile, host and cache state with other flags (said in the basis), else shows the elapsed time only.

The ETA while phase p runs = what the plan had left after p + what the plan gave p less the time p has run
(never below 0: a phase that overruns its plan holds the ETA at the rest of the plan and says "over"). The
fraction is the plan's offset of p plus its time in p (capped at p's planned length) over the plan's total,
below 1 until READY. A phase the plan lacks (a daemon start the last run did not have) adds nothing to the ETA.

`PhaseTracker` follows one lifecycle's events: on RunStarted it asks the store for the plan (in a thread, as
the history store is always used from async code), on READY it writes the run and says what the warm path saved
("relaunch 19.6 s; weights from the cache 0.9 s instead of 31.1 s"): the weights figure is the backend's own
(`Load weight end. elapsed=`), and "instead of" is the last disk load of the same weights (`weights_key`: the
cache key's flags) on record.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TextIO

from app.core.data import EventLevel, Phase, PhaseEvent, ServerState
from app.core.errors import TunedashError
from app.core.flags.weight_cache import key_table
from app.core.profiles.types import Profile
from app.core.server.events import LifecycleEvent, RunStarted, ServerLogEvent, StateChanged

# (phase, the mark it begins with), in the order a run goes through them.
PHASE_ORDER: tuple[tuple[str, str], ...] = (
    ("kill", "KILLING"),
    ("release", "RELEASING"),
    ("daemon", "DAEMON"),
    ("start", "LAUNCHING"),
    ("load", "LOADING"),
    ("capture", "CAPTURING"),
    ("warmup", "WARMING"),
)
PHASE_NAMES = tuple(name for name, _ in PHASE_ORDER)
CACHE_WORDS = {"cold": "no weight cache", "fill": "the weight cache filling", "warm": "weights from the cache"}
END_STATES = (ServerState.READY, ServerState.CRASHED, ServerState.STOPPED)
BAR_WIDTH = 20
TERMINAL_PERIOD_S = 0.5  # how often a terminal's progress line is rewritten


def config_key(profile: Profile) -> str:
    """What "the same config" means for a plan: host, backend, model, GPUs, warm and every flag (a short hash)."""
    text = json.dumps({"host": profile.host, "backend": profile.backend, "model": profile.model,
                       "gpus": list(profile.gpus), "warm": profile.warm,
                       "flags": {k: profile.flags[k] for k in sorted(profile.flags)}}, default=str, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def weights_key(profile: Profile) -> str:
    """What makes two launches load the same weights: host, backend, model, GPUs and the cache key's flags
    (app.core.flags.weight_cache); a cold launch and a warm one of the same weights share it."""
    key_flags = {flag for flags in key_table(profile.backend).values() for flag in flags}
    text = json.dumps({"host": profile.host, "backend": profile.backend, "model": profile.model,
                       "gpus": list(profile.gpus),
                       "flags": {k: profile.flags[k] for k in sorted(profile.flags) if k in key_flags}},
                      default=str, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunRecord:
    """One finished run as the history holds it."""

    config_key: str
    weights_key: str
    cache: str  # cold | fill | warm
    profile: str
    host: str
    kind: str  # launch | relaunch
    offsets: dict[str, float]  # phase -> seconds from the run's start to the phase's begin
    phase_times: dict[str, float]
    total_s: float  # the run's start to READY
    weights_s: float | None  # the backend's own weights figure (the longest rank's), None when it printed none
    at: float = field(default_factory=time.time)


class PhaseStore(Protocol):
    """Where runs are kept (app.core.measure.store.HistoryStore implements it); called in a thread."""

    def add_phase_run(self, run: RunRecord) -> None: ...

    def phase_runs(self, *, profile: str, host: str, cache: str, limit: int = 20) -> list[RunRecord]: ...

    def weights_runs(self, weights_key: str, limit: int = 20) -> list[RunRecord]: ...


@dataclass(frozen=True)
class PhasePlan:
    """What the next run is expected to take: each phase's begin offset and the total, and where that came from."""

    offsets: dict[str, float]
    total_s: float
    basis: str  # "the last relaunch of this config (weights from the cache), 2 min ago"


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 0):.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def plan_from(runs: Sequence[RunRecord], key: str, kind: str, now: float | None = None) -> PhasePlan | None:
    """The plan for a run of config `key` and `kind` from earlier runs of the same profile, host and cache state
    (newest first): the last run of the same key and kind, else of the same key, else any (other flags)."""
    now = time.time() if now is None else now
    same_key = [r for r in runs if r.config_key == key]
    for pool, what in (([r for r in same_key if r.kind == kind], "this config"), (same_key, "this config"),
                       (list(runs), "this profile with other flags")):
        if pool:
            run = max(pool, key=lambda r: r.at)
            words = CACHE_WORDS.get(run.cache, run.cache)
            return PhasePlan(dict(run.offsets), run.total_s,
                             f"the last {run.kind} of {what} ({words}), {_ago(now - run.at)}")
    return None


@dataclass(frozen=True)
class LaunchProgress:
    """Where a run is now: what the Server panel draws and the CLI prints (progress_line)."""

    kind: str
    cache: str
    phase: str | None  # the phase under way; None when finished
    elapsed_s: float
    fraction: float | None  # 0..1; None without a plan
    eta_s: float | None  # seconds to READY; None without a plan
    over_s: float = 0.0  # how far the phase under way has run past its planned length
    basis: str = "no earlier launch of this config on record: no ETA yet"
    done: bool = False
    phases: tuple[tuple[str, str], ...] = ()  # (phase, "done" | "now" | "next") for the plan's or the seen phases


def run_offsets(marks: Mapping[str, float]) -> dict[str, float]:
    """Each phase's begin offset from the run's start ("BEGIN") in lifecycle marks (ServerLifecycle.marks)."""
    begin = marks.get("BEGIN")
    if begin is None:
        return {}
    return {name: round(marks[mark] - begin, 3) for name, mark in PHASE_ORDER
            if mark in marks and marks[mark] >= begin}


def progress_at(kind: str, cache: str, marks: Mapping[str, float], plan: PhasePlan | None,
                now: float) -> LaunchProgress:
    """The run's progress at `now` (time.monotonic()) from its marks and its plan (module docstring)."""
    begin = marks.get("BEGIN", now)
    elapsed = max(now - begin, 0.0)
    if "READY" in marks:
        total = marks["READY"] - begin
        seen = tuple((name, "done") for name in run_offsets(marks))
        return LaunchProgress(kind, cache, None, total, 1.0, 0.0, basis=plan.basis if plan else "", done=True,
                              phases=seen)
    seen_offsets = run_offsets(marks)
    current = max(seen_offsets, key=lambda p: (seen_offsets[p], PHASE_NAMES.index(p))) if seen_offsets else None
    in_phase = elapsed - seen_offsets[current] if current is not None else elapsed
    names = [n for n in PHASE_NAMES if n in seen_offsets or (plan is not None and n in plan.offsets)]
    at = PHASE_NAMES.index(current) if current is not None else -1
    phases = tuple((n, "done" if PHASE_NAMES.index(n) < at else "now" if n == current else "next") for n in names)
    if plan is None or plan.total_s <= 0:
        return LaunchProgress(kind, cache, current, elapsed, None, None, phases=phases)
    planned = sorted(plan.offsets.items(), key=lambda item: PHASE_NAMES.index(item[0]))
    later = [off for name, off in planned if PHASE_NAMES.index(name) > at]
    next_offset = min(later) if later else plan.total_s
    if current is not None and current in plan.offsets:
        start = plan.offsets[current]
        length = max(next_offset - start, 0.0)
        eta = (plan.total_s - next_offset) + max(length - in_phase, 0.0)
        position = start + min(in_phase, length)
        over = max(in_phase - length, 0.0)
    else:  # before the first phase, or in one the plan lacks: the plan's rest from its next phase on
        eta = plan.total_s - next_offset + (max(next_offset - elapsed, 0.0) if current is None else 0.0)
        position = plan.total_s - eta
        over = 0.0
    fraction = min(max(position / plan.total_s, 0.0), 0.99)
    return LaunchProgress(kind, cache, current, elapsed, fraction, eta, over, plan.basis, phases=phases)


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = round(fraction * width)
    return "#" * filled + "." * (width - filled)


def progress_line(progress: LaunchProgress) -> str:
    """One line: `relaunch [########............] 41%  capture  12.0 s, ETA 14 s (the last relaunch ...)`."""
    head = f"{progress.kind} "
    if progress.done:
        return f"{head}[{bar(1.0)}] 100%  ready after {progress.elapsed_s:.1f} s"
    phase = progress.phase or "preflight"
    if progress.fraction is None or progress.eta_s is None:
        return f"{head}{phase}  {progress.elapsed_s:.1f} s ({progress.basis})"
    over = f", {progress.over_s:.0f} s over its plan" if progress.over_s >= 1 else ""
    return (f"{head}[{bar(progress.fraction)}] {progress.fraction * 100:3.0f}%  {phase}  {progress.elapsed_s:.1f} s, "
            f"ETA {progress.eta_s:.0f} s{over} (from {progress.basis})")


def saved_text(kind: str, total_s: float, cache: str, weights_s: float | None, disk: tuple[float, str] | None,
               last_cold_total_s: float | None = None) -> str:
    """The event log's line after a run: what the weight cache saved ("relaunch 19.6 s; weights from the cache
    0.9 s instead of 31.1 s"), or what the run took with its cache state. `disk`: (seconds, what they are, "" for
    the backend's own weights figure of a cold launch), from disk_reference."""
    text = f"{kind} {total_s:.1f} s"
    if cache == "warm" and weights_s is not None:
        if disk is not None:
            text += f"; weights from the cache {weights_s:.1f} s instead of {disk[1]}{disk[0]:.1f} s"
        else:
            text += f"; weights from the cache {weights_s:.1f} s (no disk load of these weights on record)"
    elif cache == "fill":
        text += "; the weight cache daemon loaded the weights (the next relaunch maps them from the cache)"
    elif weights_s is not None:
        text += f"; weights from disk {weights_s:.1f} s"
    if last_cold_total_s is not None and cache == "warm":
        text += f" (a cold {kind} of this config took {last_cold_total_s:.1f} s)"
    return text


def disk_reference(runs: Sequence[RunRecord], kind: str,
                   cold_key: str) -> tuple[tuple[float, str] | None, float | None]:
    """From earlier runs of the same weights: the last disk load's seconds and what they are (the backend's
    weights figure of a cold run, else the daemon's whole start of a fill run), and the total of the last cold run
    of the same kind and flags (`cold_key`: config_key of the profile without warm)."""
    cold = sorted((r for r in runs if r.cache == "cold"), key=lambda r: r.at, reverse=True)
    disk: tuple[float, str] | None = None
    loaded = [r for r in cold if r.weights_s is not None]
    if loaded:
        disk = (loaded[0].weights_s or 0.0, "")
    else:
        fills = sorted((r for r in runs if r.cache == "fill" and "daemon" in r.phase_times),
                       key=lambda r: r.at, reverse=True)
        if fills:
            disk = (fills[0].phase_times["daemon"], "the daemon's start from disk ")
    same = [r for r in cold if r.kind == kind and r.config_key == cold_key]
    return disk, same[0].total_s if same else None


class PhaseTracker:
    """One lifecycle's runs: the plan of the run under way, its progress, and its record at READY."""

    def __init__(self, store_factory: Callable[[], PhaseStore | None] | None,
                 say: Callable[[str, EventLevel], None], marks: Callable[[], dict[str, float]]) -> None:
        self.store_factory = store_factory  # None: no history (no ETA, no "instead of"); set before the first run
        self._store: PhaseStore | None = None
        self._store_tried = False
        self.say = say
        self._marks = marks
        self.run: RunStarted | None = None
        self.plan: PhasePlan | None = None
        self.finished: LaunchProgress | None = None
        self._weights: list[float] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.saved: str | None = None  # the last saved line (tests, the CLI)

    def _store_now(self) -> PhaseStore | None:
        if not self._store_tried:
            self._store_tried = True
            if self.store_factory is not None:
                try:
                    self._store = self.store_factory()
                except (TunedashError, OSError) as exc:  # a history that cannot open costs the ETA, not the launch
                    self.say(f"launch history unavailable ({exc}): no ETA", "warning")
        return self._store

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_event(self, event: LifecycleEvent) -> None:
        if isinstance(event, RunStarted):
            self.run, self.plan, self.finished, self._weights = event, None, None, []
            self._spawn(self._load_plan(event))
        elif isinstance(event, ServerLogEvent) and not event.replayed and self.run is not None:
            payload = event.event
            if isinstance(payload, PhaseEvent) and payload.phase == Phase.WEIGHTS and not payload.begin \
                    and payload.seconds is not None:
                self._weights.append(payload.seconds)
        elif isinstance(event, StateChanged) and self.run is not None and event.state == ServerState.KILLING \
                and "LAUNCHING" in self._marks():
            self.run = None  # a kill of the run's own server before READY: the run is over
        elif isinstance(event, StateChanged) and self.run is not None and event.state in END_STATES:
            run = self.run
            marks = self._marks()
            if event.state == ServerState.READY and "BEGIN" in marks and "READY" in marks:
                self.finished = progress_at(run.kind, run.cache, marks, self.plan, marks["READY"])
                self._spawn(self._record(run, marks, max(self._weights) if self._weights else None))
            self.run = None

    def abort(self) -> None:
        """The run ended without READY (refused, cancelled): no progress to show any more."""
        self.run = None

    def progress(self, now: float | None = None) -> LaunchProgress | None:
        """The run under way's progress, None when none is (the panel then shows no bar)."""
        if self.run is None:
            return None
        return progress_at(self.run.kind, self.run.cache, self._marks(), self.plan,
                           time.monotonic() if now is None else now)

    async def _load_plan(self, run: RunStarted) -> None:
        store = self._store_now()
        if store is None:
            return
        profile = run.profile
        runs = await asyncio.to_thread(store.phase_runs, profile=profile.name, host=profile.host, cache=run.cache)
        if self.run is run:
            self.plan = plan_from(runs, config_key(profile), run.kind)

    async def _record(self, run: RunStarted, marks: Mapping[str, float], weights_s: float | None) -> None:
        profile = run.profile
        offsets = run_offsets(marks)
        total = round(marks["READY"] - marks["BEGIN"], 3)
        times = {name: round(later - off, 3) for (name, off), later in
                 zip(sorted(offsets.items(), key=lambda i: i[1]),
                     [*sorted(offsets.values())[1:], total], strict=True)}
        record = RunRecord(config_key(profile), weights_key(profile), run.cache, profile.name, profile.host,
                           run.kind, offsets, times, total, weights_s or None)
        store = self._store_now()
        earlier: list[RunRecord] = []
        if store is not None:
            earlier = await asyncio.to_thread(store.weights_runs, record.weights_key)
            await asyncio.to_thread(store.add_phase_run, record)
        disk, cold_total = disk_reference(earlier, run.kind, config_key(replace(profile, warm=False)))
        self.saved = saved_text(run.kind, total, run.cache, record.weights_s, disk, cold_total)
        self.say(self.saved, "info")

    async def wait_idle(self, timeout_s: float = 5.0) -> None:
        """Until the plan lookup or record write under way has finished (tests, the CLI's close)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Let the plan lookup and the record write under way finish (`launch --wait` ends right after READY),
        then close the store this tracker opened."""
        await self.wait_idle(timeout_s)
        for task in list(self._tasks):
            task.cancel()
        store, self._store, self._store_tried = self._store, None, False
        closer = getattr(store, "close", None)
        if callable(closer):
            closer()


class PlainProgress:
    """The headless commands' progress: on a terminal one line rewritten in place every TERMINAL_PERIOD_S;
    piped, a plain line each time the phase changes (and the finished line)."""

    def __init__(self, tracker: PhaseTracker, out: TextIO, *, terminal: bool | None = None) -> None:
        self.tracker = tracker
        self.out = out
        self.terminal = out.isatty() if terminal is None else terminal
        self._last_phase: str | None = "-"
        self._width = 0

    def tick(self, now: float | None = None) -> None:
        progress = self.tracker.progress(now)
        if progress is None:
            return
        line = progress_line(progress)
        if self.terminal:
            pad = " " * max(self._width - len(line), 0)
            self.out.write("\r" + line + pad)
            self._width = len(line)
            self.out.flush()
        elif progress.phase != self._last_phase:
            self._last_phase = progress.phase
            self.out.write(line + "\n")
            self.out.flush()

    def clear(self) -> None:
        """Wipe a terminal's progress line (before another line is printed; the next tick redraws it)."""
        if self.terminal and self._width:
            self.out.write("\r" + " " * self._width + "\r")
            self.out.flush()
            self._width = 0

    def finish(self) -> None:
        """The finished line (READY), after wiping the live one."""
        done = self.tracker.finished
        self.clear()
        if done is not None:
            self.out.write(progress_line(done) + "\n")
        self.out.flush()

    async def run(self, period_s: float = TERMINAL_PERIOD_S) -> None:
        """Tick until cancelled (the CLI cancels it once the run ends)."""
        while True:
            self.tick()
            await asyncio.sleep(period_s if self.terminal else min(period_s, 0.2))
