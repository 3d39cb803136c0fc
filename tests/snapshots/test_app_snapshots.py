"""Snapshot tests of the whole dashboard in its main states, from fixed Session data and a frozen clock.

No server, no sampling: a FixedSession never starts anything, and its lifecycle is a plain object with
the fields the app reads. The app's clock is frozen at WALL/MONO and the time zone is UTC, so the
time in state, uptime, sample ages and the event log's timestamps are the same on every run.
"""

from __future__ import annotations

import os
import time
import time as _time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from textual.pilot import Pilot

from app.core.command import CommandView
from app.core.data import (
    EventLevel,
    FatalEvent,
    GpuProcess,
    GpuSample,
    GpuSnapshot,
    Holder,
    LogLine,
    Notice,
    RelaunchMarker,
    ServerState,
    ThroughputPoint,
)
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.core.server.events import ActionLogged, LifecycleView
from app.core.server.jobs import JobRecord
from app.core.server.progress import PhaseTracker
from app.core.session import Session
from app.tui.app import TunedashApp
from tests.helpers import REPO
from widgets import ThroughputChart

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

WALL = 1_750_000_000.0  # the frozen time.time()
MONO = 5_000.0  # the frozen time.monotonic()
DEMO = REPO / "profiles" / "demo.toml"


class FrozenClock:
    """Stands in for the `time` module inside app.tui.dashboard and the widgets."""

    @staticmethod
    def time() -> float:
        return WALL

    @staticmethod
    def monotonic() -> float:
        return MONO

    strftime = staticmethod(_time.strftime)


@pytest.fixture(autouse=True)
def frozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr("app.tui.dashboard.time", FrozenClock)
    # the GPU panel keeps its own clock for its sample ages: frozen too, or an age would be the machine's uptime
    # minus MONO, "stale 57m51s" once the machine has been up longer than MONO seconds
    monkeypatch.setattr("widgets.gpu_panel.time", FrozenClock)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@dataclass
class FixedLifecycle:
    """The lifecycle fields the dashboard reads, set by hand."""

    state: ServerState = ServerState.STOPPED
    state_since: float = WALL - 5
    record: JobRecord | None = None
    phase_times: dict[str, float] = field(default_factory=dict)
    notices: list[Notice] = field(default_factory=list)
    fatal: FatalEvent | None = None
    last_lines: deque[str] = field(default_factory=lambda: deque(maxlen=30))
    holders: tuple[Holder, ...] = ()
    profile: Profile | None = None
    # the real tracker with no history and no run under way: the Server panel shows no progress bar
    phases: PhaseTracker = field(default_factory=lambda: PhaseTracker(None, lambda text, level: None, dict))

    def view(self) -> LifecycleView:
        assert self.profile is not None
        return LifecycleView(state=self.state, since=self.state_since, record=self.record, profile=self.profile,
                             phase_times=dict(self.phase_times), notices=tuple(self.notices), fatal=self.fatal,
                             last_lines=tuple(self.last_lines), holders=self.holders, health_ok=None,
                             last_decode=None)

    async def close(self) -> None:
        return None


class NoTelemetry:
    async def close(self) -> None:
        return None


class FixedSession(Session):
    """A Session that never starts, samples or launches: its fields are the test's fixed data."""

    def __init__(self, profile: Profile, *, readonly: bool = False) -> None:
        # A LocalHost is never used here (start() does nothing); the Session only needs one to exist.
        super().__init__(LocalHost("sim"), profile, readonly=readonly, telemetry=NoTelemetry())  # type: ignore[arg-type]
        self.lifecycle: FixedLifecycle = FixedLifecycle(profile=profile)  # type: ignore[assignment]

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def record(profile: Profile) -> JobRecord:
    return JobRecord(profile.name, "sim", "sglang", profile.model, profile.port, [], dict(profile.flags), 48921,
                     48921, "0", "/tmp/demo.log", "alice", WALL - 3723, list(profile.gpus))


def gpus(used: tuple[int, int], procs: bool = True, age: float = 0.1) -> GpuSnapshot:
    samples = tuple(
        GpuSample(i, f"GPU-{i}", "NVIDIA RTX A6000", mib, 49140, 96 if mib else 0, 71 if mib else 31,
                  281.0 if mib else 22.4,
                  (GpuProcess(48930 + i, f"sglang::scheduler_TP{i}", mib),) if procs and mib else (),
                  taken_at=MONO - age, source="smi")
        for i, mib in enumerate(used)
    )
    return GpuSnapshot(samples, MONO - age)


def event(seconds_ago: float, text: str, level: EventLevel = "info") -> ActionLogged:
    return ActionLogged(text, level, at=WALL - seconds_ago)


STORY = [
    event(290, "launched pid 48921 (group 48921) on sim, log /tmp/demo.log"),
    event(280, "ready after 6.1 s"),
    event(150, "relaunch: steps 1 -> 3"),
    event(149, "SIGTERM to group 48921 (4 processes)"),
    event(148, "GPU0 0 MiB, GPU1 0 MiB after 1.2 s"),
    event(140, "relaunched with steps 1 -> 3: kill 0.3s, release 1.2s, load 4.1s, capture 1.0s, ready 6.3s"),
    event(70, "relaunch: pcg off -> on, overlap sched -> sched+sbo"),
    event(62, "relaunched with pcg off -> on, overlap sched -> sched+sbo: ready 6.2s"),
]


def throughput() -> list[ThroughputPoint]:
    """37 tok/s (steps 1), then ~53 (steps 3, accept ~3), then ~70 (pcg + overlap)."""
    points: list[ThroughputPoint] = []
    for i in range(0, 290, 4):
        ago = 290 - i
        level, accept = (37.0, 1.8) if ago > 140 else (53.0, 3.0) if ago > 52 else (70.0, 3.1)
        if 148 >= ago >= 140 or 60 >= ago >= 52:
            continue  # the relaunch gaps
        points.append(ThroughputPoint(WALL - ago, level + (i % 3) - 1, "log", accept))
        points.append(ThroughputPoint(WALL - ago + 2, level - 2 + (i % 2), "probe"))
    return points


def ready_session(readonly: bool = False) -> FixedSession:
    profile = load_profile(DEMO)
    session = FixedSession(profile, readonly=readonly)
    life = session.lifecycle
    life.state, life.state_since, life.record = ServerState.READY, WALL - 52, record(profile)
    life.phase_times = {"kill": 0.3, "release": 1.2, "start": 0.4, "load": 3.7, "capture": 1.0, "ready": 6.2}
    life.notices = [Notice("auto_disabled", "Disable piecewise CUDA graph because --enable-speculative-decoding is "
                           "set. You can pass --enforce-piecewise-cuda-graph to force it.", LogLine(40, ""))]
    session.snapshot = gpus((44486, 44486))
    session.server_version = "0.5.10"
    session.throughput.extend(throughput())
    session.markers[:] = [RelaunchMarker(WALL - 150, "steps 1 -> 3"),
                          RelaunchMarker(WALL - 60, "pcg off -> on, overlap sched -> sched+sbo")]
    session.events.extend(STORY)
    session.probe_wanted = True
    return session


def stopped_session() -> FixedSession:
    session = FixedSession(load_profile(DEMO))
    session.snapshot = gpus((0, 0))
    return session


def loading_session() -> FixedSession:
    session = stopped_session()
    life = session.lifecycle
    life.state, life.state_since, life.record = ServerState.LOADING, WALL - 3, record(session.profile)
    session.snapshot = gpus((21000, 20500))
    session.command.current = CommandView("launch")
    session.events.extend([event(4, "launched pid 48921 (group 48921) on sim, log /tmp/demo.log")])
    return session


def stuck_session() -> FixedSession:
    session = ready_session()
    life = session.lifecycle
    life.state, life.state_since = ServerState.STUCK, WALL - 2
    life.holders = (Holder(0, 48931, "sglang::scheduler_TP0", 44486), Holder(1, None, "(no visible process)", 1200))
    session.snapshot = gpus((44486, 1200), procs=False)
    session.events.extend([event(61, "SIGTERM to group 48921 (4 processes)"),
                           event(2, "GPU0 44486 MiB (pid 48931 sglang::scheduler_TP0), GPU1 1200 MiB still held "
                                    "after 60.0 s", "error")])
    return session


def crashed_session() -> FixedSession:
    session = stopped_session()
    life = session.lifecycle
    life.state, life.state_since, life.record = ServerState.CRASHED, WALL - 7, record(session.profile)
    life.fatal = FatalEvent("oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                            LogLine(88, ""))
    life.last_lines.extend([
        "[2026-05-01 10:00:01 TP0] Capture cuda graph begin. This can take up to several minutes.",
        "Traceback (most recent call last):",
        '  File "sglang/srt/model_executor/cuda_graph_runner.py", line 310, in capture',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ])
    session.events.extend([event(20, "launched pid 48921 (group 48921) on sim, log /tmp/demo.log"),
                           event(7, "crashed while CAPTURING: torch.OutOfMemoryError: CUDA out of memory", "error")])
    return session


SnapCompare = Callable[..., bool]


async def settle(pilot: Pilot[Any]) -> None:
    """A UI tick, then push the fixed data and force the chart to draw it (its own timer runs every 2 s)."""
    await pilot.pause(0.6)
    app = pilot.app
    assert isinstance(app, TunedashApp)
    app.refresh_view()
    app.query_one(ThroughputChart).replot()
    await pilot.pause()


def snap(snap_compare: SnapCompare, session: Session, size: tuple[int, int] = (120, 40)) -> bool:
    return snap_compare(TunedashApp(session, keymap_file=None), terminal_size=size, run_before=settle)


def test_stopped(snap_compare: SnapCompare) -> None:
    assert snap(snap_compare, stopped_session())


def test_loading(snap_compare: SnapCompare) -> None:
    assert snap(snap_compare, loading_session())


def test_ready_with_chart(snap_compare: SnapCompare) -> None:
    assert snap(snap_compare, ready_session())


def test_ready_with_chart_80x24(snap_compare: SnapCompare) -> None:
    assert snap(snap_compare, ready_session(), size=(80, 24))


def test_stuck_with_holders(snap_compare: SnapCompare) -> None:
    assert snap(snap_compare, stuck_session())


def test_crashed(snap_compare: SnapCompare) -> None:
    assert snap(snap_compare, crashed_session())


def test_read_only(snap_compare: SnapCompare) -> None:
    session = ready_session(readonly=True)
    session.pending_flags["speculative-num-steps"] = 4
    session.pending_flags["speculative-num-draft-tokens"] = 5
    assert snap(snap_compare, session)
