"""Log event -> server state: the one rule by which a starting server moves, and how long each phase took (pure).

A starting server (LAUNCHING, LOADING, CAPTURING, WARMING) moves on its log's events: a ready line makes it
READY; the begin of a CUDA graph capture (full or piecewise; on SGLang 0.5.14+ any capture of any role, target
or draft, decode, verify, extend or prefill) CAPTURING; warm-up WARMING; the init, weights
or KV-cache phases move LAUNCHING to LOADING. The end of a capture moves nothing, and neither does any event
once the server is READY or no longer starting. The lifecycle applies the rule live; `tunedash status`
replays a whole log through it (state_from_log). phase_durations turns the moments the states began
into the seconds each phase took.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app.core.data import FatalEvent, LogEvent, Phase, PhaseEvent, ReadyEvent, ServerState

LIVE_STATES = {
    ServerState.LAUNCHING,
    ServerState.LOADING,
    ServerState.CAPTURING,
    ServerState.WARMING,
    ServerState.READY,
}
STARTING_STATES = LIVE_STATES - {ServerState.READY}
# Which fatal event explains a crash best: the cause (OOM, port, the exception) over its echo ("a child failed");
# a child's exit code ("crashed with exit code -9": no traceback, often the OOM killer) tells more than the echo.
FATAL_RANK = {"child_failed": 0, "child_crashed": 1, "error": 2, "traceback": 3, "port_in_use": 4, "oom": 4,
              "weight_cache_died": 4}

# (phase, the state it begins with, the state it ends with), for phase_durations.
PHASES = (
    ("kill", "KILLING", "RELEASING"),
    ("release", "RELEASING", "FREE"),
    ("daemon", "DAEMON", "DAEMON_READY"),  # the weight cache daemon's start, when a launch starts it
    ("start", "LAUNCHING", "LOADING"),
    ("load", "LOADING", "CAPTURING"),
    ("capture", "CAPTURING", "WARMING"),
    ("warmup", "WARMING", "READY"),
    ("ready", "LAUNCHING", "READY"),
)
_LOADING_PHASES = (Phase.INIT, Phase.WEIGHTS, Phase.KV_CACHE)
_CAPTURE_PHASES = (Phase.CUDA_GRAPH, Phase.PIECEWISE_CUDA_GRAPH)


def state_after(state: ServerState, event: LogEvent) -> ServerState | None:
    """The state a log event moves a starting server to; None when it does not move it (module docstring)."""
    if state not in STARTING_STATES:
        return None
    target: ServerState | None = None
    if isinstance(event, ReadyEvent):
        target = ServerState.READY
    elif isinstance(event, PhaseEvent):
        if event.phase in _CAPTURE_PHASES and event.begin:
            target = ServerState.CAPTURING
        elif event.phase == Phase.WARMUP:
            target = ServerState.WARMING
        elif state == ServerState.LAUNCHING and event.phase in _LOADING_PHASES:
            target = ServerState.LOADING
    return None if target == state else target


def gone_state(outcome: str) -> ServerState:
    """The state of a server whose process group is gone, by its record's outcome: it died on its own (CRASHED)
    unless it was killed or never got further than "launching" (STOPPED)."""
    return ServerState.CRASHED if outcome in ("running", "ready", "crashed") else ServerState.STOPPED


def state_from_log(events: Iterable[LogEvent]) -> ServerState:
    """The state a server launched with this log is in after it: its events applied from LAUNCHING on."""
    state = ServerState.LAUNCHING
    for event in events:
        state = state_after(state, event) or state
    return state


def telling_fatal(current: FatalEvent | None, event: FatalEvent) -> FatalEvent:
    """The fatal event that explains a crash better: the higher FATAL_RANK, the later one on a tie."""
    if current is None or FATAL_RANK.get(event.kind, 0) >= FATAL_RANK.get(current.kind, 0):
        return event
    return current


def phase_durations(marks: Mapping[str, float]) -> dict[str, float]:
    """Seconds per phase (start, load, capture, warmup, ready; kill, release) from when each state began.

    `marks` holds a monotonic time per state value ("LOADING": ...). Without a capture, load runs to WARMING.
    Without a kill there is no release either (only phases that happened are named: the event log, the panel).
    """
    times: dict[str, float] = {}
    for name, begin, end in PHASES:
        if begin in marks and end in marks and marks[end] >= marks[begin]:
            times[name] = round(marks[end] - marks[begin], 3)
    if "release" not in times and "RELEASING" in marks and "WARM" in marks and marks["WARM"] >= marks["RELEASING"]:
        times["release"] = round(marks["WARM"] - marks["RELEASING"], 3)  # a warm profile's engine: released to WARM
    if "load" not in times and "LOADING" in marks and "WARMING" in marks and "CAPTURING" not in marks:
        times["load"] = round(marks["WARMING"] - marks["LOADING"], 3)
    if "kill" not in times:
        times.pop("release", None)  # a launch from a stopped server: its free check released nothing
    return times
