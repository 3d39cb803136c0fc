"""What the dashboard's widgets are given: plain widget data built from the Session's frozen views.

Pure functions (no Textual, no I/O): app.tui.app calls them on its 2 Hz tick and pushes the result only when
it changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.core.data import FlagValue, ServerState, ThroughputPoint, printable
from app.core.flags.toggles import toggle_value
from app.core.hosts.base import ConnectionChanged
from app.core.measure.probe import ProbeStatus
from app.core.profiles.types import Profile
from app.core.server.events import LifecycleView
from app.core.telemetry.pagecache import PageCache
from widgets import ServerView, ToggleRow


def page_cache_line(cache: PageCache) -> str | None:
    """The Server panel's page-cache line: how much of the model's files is in RAM; for a model given as a path
    that cannot be read, why; nothing for a model that is not a path (a hub id, the simulator's model)."""
    if cache.fraction is not None:
        return printable(f"weights: {cache.describe()}")
    if cache.model.startswith(("/", "~", ".")):
        return printable(f"weights: page cache {cache.describe()}")
    return None


def server_view(life: LifecycleView, version: str | None, now_s: int, page_cache: str | None = None) -> ServerView:
    """The server panel's data; times on whole seconds of the wall clock (`now_s`, int(time.time()));
    `page_cache` the line page_cache_line made."""
    record, live, fatal, profile = life.record, life.live, life.fatal, life.profile
    return ServerView(
        state=life.state,
        since=int(life.since),
        pid=record.pid if record and live else None,
        pgid=record.pgid if record and live else None,
        port=profile.port,
        uptime_s=(now_s - int(record.launched_at)) if record and live else None,
        backend=profile.backend,
        version=version,
        model=printable(profile.model),  # the server's own words and the profile's, control characters written out
        phase_times=life.phase_times,
        notices=tuple(printable(n.text) for n in life.notices[-4:]),
        fatal=printable(fatal.text) if fatal and life.state == ServerState.CRASHED else None,
        last_lines=tuple(printable(line) for line in life.last_lines[-8:]) if life.state == ServerState.CRASHED
        else (),
        holders=tuple(life.holders),
        page_cache=page_cache,
    )


def toggle_rows(running: Profile, pending: Mapping[str, FlagValue]) -> list[ToggleRow]:
    """One Flags panel row per toggle: its key, label, flags, the running value and the pending one."""
    return [
        ToggleRow(toggle.key, toggle.label, " ".join(f"--{flag}" for flag in toggle.flags),
                  toggle_value(running.flags, toggle), toggle_value(pending, toggle))
        for toggle in running.toggles
    ]


NO_GPUS = "no GPUs in this profile"
"""The GPU panel's text for a profile with `gpus = []`: the session samples nothing (the host may have no
nvidia-smi, e.g. vLLM on CPU)."""


def connection_note(connection: ConnectionChanged | None, now: float) -> str:
    """The header's note on a remote host's connection: "" while connected (or local), else its state and for how
    long the host has been unreachable: " · connection lost 12 s"."""
    if connection is None or connection.state == "connected":
        return ""
    since = connection.since if connection.since is not None else connection.at
    return f" · connection {connection.state} {max(0, int(now - since))} s"


def latest_figures(points: Sequence[ThroughputPoint], now: float, window_s: float = 30.0, since: float = 0.0) -> str:
    """The newest tok/s per source (within the window, and since `since`: the server's READY time, so a
    relaunch does not show the previous configuration's figures) and the newest acceptance length, as text.

    Points arrive in time order, so this walks from the newest back and stops at the first point older
    than the window (a few dozen points, not the whole series)."""
    latest: dict[str, float] = {}
    accept: float | None = None
    for point in reversed(points):
        if now - point.at > window_s:
            break
        if point.at < since:
            continue
        latest.setdefault(point.source, point.tokens_per_s)
        if accept is None and point.accept_len is not None:
            accept = point.accept_len
    parts = [f"{source} {value:.1f} tok/s" for source, value in sorted(latest.items())]
    if accept is not None:
        parts.append(f"accept {accept:.2f}")
    return " · ".join(parts)


def probe_note(wanted: bool, status: ProbeStatus | None) -> str:
    """The header's note on the probe: " · probe on", " · probe failing (3)", " · probe stopped", or ""."""
    if not wanted:
        return ""
    if status is None or status.state == "running":
        return " · probe on"
    if status.state == "failing":
        return f" · probe failing ({status.failures})"
    return " · probe stopped" if status.error else " · probe on"
