"""What a server lifecycle publishes: its events (for listeners) and its frozen view (for readers).

ServerLifecycle (app.core.server.lifecycle) emits these; the Session, the CLI's narrator, an Experiment and
the TUI consume them. Plain data: no I/O here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.core import tasks
from app.core.data import (
    ConnectionState,
    DecodeStats,
    EventLevel,
    FatalEvent,
    GpuSnapshot,
    Holder,
    LogEvent,
    Notice,
    ServerState,
    ThroughputPoint,
)
from app.core.hosts.base import ConnectionChanged
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.release import FreeProgress


@dataclass(frozen=True)
class StateChanged:
    state: ServerState
    previous: ServerState
    at: float  # time.time()


@dataclass(frozen=True)
class ActionLogged:
    """A line for the event log: an action or an outcome ("SIGTERM to group 48921")."""

    text: str
    level: EventLevel = "info"
    at: float = field(default_factory=time.time)


CONNECTION_LEVELS: dict[ConnectionState, EventLevel] = {
    "connected": "info", "lost": "warning", "reconnecting": "warning", "failed": "error"}
"""How a remote host's connection change reads in the event log."""


@dataclass(frozen=True)
class ServerLogEvent:
    event: LogEvent
    replayed: bool = False  # read from the log as it was when tunedash re-attached (old news, not live)


@dataclass(frozen=True)
class Launched:
    """A launch started a server and its job record is written (the log to follow is record.log_path)."""

    record: jobs.JobRecord
    profile: Profile


@dataclass(frozen=True)
class GpuSampled:
    """The Session's GPU panel sample is a newer one (its own sampler's, or the release watch's that proved FREE or
    STUCK). Emitted by the Session only, never by a lifecycle."""

    snapshot: GpuSnapshot


@dataclass(frozen=True)
class ThroughputAdded:
    """A point joined the Session's throughput series (the probe, /metrics, a decode log line), or a relaunch
    marker joined its markers (`point` None). Emitted by the Session only."""

    point: ThroughputPoint | None


@dataclass(frozen=True)
class RunStarted:
    """A launch or a relaunch began (app.core.server.progress follows it to READY): what it launches, and the
    weight cache's state for it: "cold" (no weight cache), "fill" (the daemon starts and loads from disk first),
    "warm" (the running daemon's key matches: the weights come from the cache). `began` is time.monotonic()."""

    kind: str  # "launch" | "relaunch"
    profile: Profile
    cache: str
    began: float


# ConnectionChanged (app.core.hosts.base): a remote host's connection was lost / is back / failed.
LifecycleEvent = (StateChanged | ActionLogged | ServerLogEvent | FreeProgress | ConnectionChanged | Launched
                  | GpuSampled | ThroughputAdded | RunStarted)


@dataclass(frozen=True)
class LifecycleView:
    """A frozen copy of what a lifecycle knows now: what a screen or an experiment reads, never the live object."""

    state: ServerState
    since: float  # time.time() when the state began
    record: jobs.JobRecord | None
    profile: Profile
    phase_times: dict[str, float]
    notices: tuple[Notice, ...]
    fatal: FatalEvent | None
    last_lines: tuple[str, ...]
    holders: tuple[Holder, ...]
    health_ok: bool | None
    last_decode: DecodeStats | None

    @property
    def live(self) -> bool:
        """A server process runs (or is being killed): pid, pgid and uptime mean something."""
        return self.state not in (ServerState.STOPPED, ServerState.FREE, ServerState.CRASHED)

    def crash_detail(self) -> str:
        """The fatal event, or the last log lines when there is none."""
        return self.fatal.text if self.fatal else "; ".join(self.last_lines[-3:])


class Listeners(tasks.Listeners[LifecycleEvent]):
    """Who receives a publisher's LifecycleEvents: subscribe returns the function that unsubscribes; one listener
    that raises is logged and the others still get the event (app.core.tasks.Listeners)."""

    def __init__(self, owner: str = "lifecycle", on_failure: Callable[[str], None] | None = None) -> None:
        super().__init__(owner, on_failure)
