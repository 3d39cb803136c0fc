"""Provides ServerPanel and ServerView: the server's lifecycle state, identity, phase times and notices.

CRASHED adds the fatal event and the last log lines; STUCK adds the processes still holding GPU memory.
Time in state and uptime are computed from a `now` the caller passes, never from the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from textual.app import ComposeResult
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from app.core.data import Holder, ServerState
from widgets.gpu_panel import NA, format_age

NO_VISIBLE_PROCESS = "(no visible process)"
"""The name a holder shows for GPU memory that no listed process accounts for."""


@dataclass(frozen=True)
class ProgressView:
    """A launch or relaunch under way, as the panel draws it (the core computes it: app.core.server.progress).

    `fraction` 0..1 and `eta_s` are None without an earlier launch to plan from; `phases` are (name, "done" |
    "now" | "next"); `basis` says where the ETA comes from."""

    kind: str
    phase: str | None
    elapsed_s: int
    fraction: float | None = None
    eta_s: int | None = None
    over_s: int = 0
    basis: str = ""
    phases: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ServerView:
    """Everything the server panel shows. `since` is on the caller's clock, the same one as `now`."""

    state: ServerState
    since: float
    pid: int | None = None
    pgid: int | None = None
    port: int | None = None
    uptime_s: float | None = None
    backend: str | None = None
    version: str | None = None
    model: str | None = None
    phase_times: Mapping[str, float] = field(default_factory=dict)
    notices: tuple[str, ...] = ()
    fatal: str | None = None
    last_lines: tuple[str, ...] = ()
    holders: tuple[Holder, ...] = ()  # what still holds GPU memory (shown when the server is STUCK)
    page_cache: str | None = None  # "weights: 41.2 GiB of 54.0 GiB in the page cache (76%, 11 files)"
    progress: ProgressView | None = None  # a launch or relaunch under way: its bar, phases and ETA


_STATE_CLASS = {
    ServerState.READY: "-good",
    ServerState.FREE: "-idle",
    ServerState.WARM: "-idle",
    ServerState.STOPPED: "-idle",
    ServerState.CRASHED: "-bad",
    ServerState.STUCK: "-bad",
    ServerState.KILLING: "-busy",
    ServerState.RELEASING: "-busy",
}
"""State -> CSS class; every other state (LAUNCHING, LOADING, CAPTURING, WARMING) is "-starting"."""


def _or_na(value: object) -> str:
    return NA if value is None else str(value)


def format_duration(seconds: float) -> str:
    """A time in state or an uptime: whole seconds under a minute ("12s"), then as format_age ("3m05s").

    Whole seconds, so these lines change once a second; the app passes `now`, `since` and the uptime on whole
    seconds of the wall clock, so both lines (and the chart's figures) change in the same UI tick: one screen
    update a second instead of one per line per tick."""
    seconds = max(0.0, seconds)
    return f"{int(seconds)}s" if seconds < 60 else format_age(seconds)


def state_line(view: ServerView, now: float) -> str:
    """ "READY for 2m03s"."""
    return f"{view.state.value} for {format_duration(now - view.since)}"


def identity_line(view: ServerView) -> str:
    """pid/pgid, port, uptime, backend and version, model."""
    backend = " ".join(x for x in (view.backend, view.version) if x) or NA
    if view.pid is None and view.pgid is None:
        parts = ["no process"]  # stopped, free or crashed: nothing to show as pid/pgid or uptime
    else:
        parts = [f"pid {_or_na(view.pid)}/{_or_na(view.pgid)}"]
        if view.uptime_s is not None:
            parts.append(f"up {format_duration(view.uptime_s)}")
    parts += [f"port {_or_na(view.port)}", backend]
    if view.model:
        parts.append(view.model)
    return "  ".join(parts)


def phases_line(view: ServerView) -> str:
    """ "last launch: weights 12.1s · kv_cache 3.0s · total 41.3s" or "" when none."""
    if not view.phase_times:
        return ""
    return "last launch: " + " · ".join(f"{name} {secs:.1f}s" for name, secs in view.phase_times.items())


PROGRESS_BAR_CELLS = 24
_PHASE_MARK = {"done": "✓", "now": "▸", "next": "·"}


def progress_bar(fraction: float, cells: int = PROGRESS_BAR_CELLS) -> str:
    """ "█████████░░░░░░░░░░░░░░░" for 0.37 (whole cells; the percentage says the rest)."""
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * cells)
    return "█" * filled + "░" * (cells - filled)


def progress_text(progress: ProgressView | None) -> str:
    """The progress block: the bar with the percentage, the phase and the ETA; the phases; where the ETA is from.
    "" when no launch is under way."""
    if progress is None:
        return ""
    phase = progress.phase or "preflight"
    if progress.fraction is None or progress.eta_s is None:
        head = f"{progress.kind}: {phase}, {format_duration(progress.elapsed_s)} (no ETA yet)"
    else:
        over = f", {progress.over_s}s over plan" if progress.over_s else ""
        head = (f"{progress_bar(progress.fraction)} {progress.fraction * 100:3.0f}%  {phase}  "
                f"ETA {format_duration(progress.eta_s)}{over}")
    steps = " ".join(f"{_PHASE_MARK.get(mark, '·')}{name}" for name, mark in progress.phases)
    lines = [head]
    if steps:
        lines.append(steps)
    if progress.basis:
        lines.append(f"ETA from {progress.basis}" if progress.fraction is not None else progress.basis)
    return "\n".join(lines)


NOTICE_CHARS = 60
"""Notices are cut to their first sentence and at most this many characters (the event log has them whole)."""


def short_notice(text: str, limit: int = NOTICE_CHARS) -> str:
    """ "Overlap scheduler is disabled when spec v2 is off or ... You can set ..." -> its first sentence, cut."""
    first = text.strip().split(". ")[0].rstrip(".")
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


def holders_text(holders: tuple[Holder, ...]) -> str:
    """One line per holder: "GPU0  48921 python  81000 MiB"; memory with no visible process (pid None) as
    "GPU1  0 (no visible process)  1200 MiB"."""
    if not holders:
        return "still held, holders unknown"
    lines = ["GPU memory still held by:"]
    for h in holders:
        mib = f"{h.used_mib} MiB" if h.used_mib is not None else f"{NA} MiB"
        pid = 0 if h.pid is None else h.pid
        lines.append(f"  GPU{h.gpu}  {pid} {h.name or NO_VISIBLE_PROCESS}  {mib}")
    return "\n".join(lines)


class ServerPanel(Widget):
    """The server: state, identity, launch phases, notices, and the crash or stuck details.

    Set `data = (view, now)` (a frozen ServerView and whole seconds of the wall clock) as often as you like: the
    panel redraws only when it differs from the last (a reactive, as Textual's Sparkline holds its data);
    `update(view, now)` shows one at once and `tick(now)` refreshes the time in state.
    The state line carries a CSS class: -good (READY), -bad (CRASHED, STUCK), -busy (KILLING,
    RELEASING), -idle (FREE, STOPPED), -starting (the rest).
    """

    DEFAULT_CSS = """
    ServerPanel {
        height: auto;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        padding: 0 1;
        & > Static { height: auto; }
        .server-state { text-style: bold; color: $primary; }
        .server-state.-good { color: $success; }
        .server-state.-bad { color: $error; }
        .server-state.-busy { color: $warning; }
        .server-state.-idle { color: $text-muted; }
        .server-phases { color: $text-muted; }
        .server-progress { color: $warning; }
        .server-pagecache { color: $text-muted; }
        .server-notices { color: $warning; }
        .server-fatal { color: $error; text-style: bold; }
        .server-lines { color: $text-muted; }
        .server-holders { color: $error; }
        .-empty { display: none; }
    }
    """

    data: reactive[tuple[ServerView, float] | None] = reactive(None, layout=False, repaint=False, init=False)
    """What the panel shows: (view, now); a value equal to the last one changes nothing."""

    MAX_NOTICES = 3
    """How many of the latest notices are shown."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.border_title = "Server"
        self._view: ServerView | None = None
        self._texts: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        """One Static per block; empty blocks are hidden."""
        yield Static("no server", classes="server-state -idle")
        for name in ("identity", "progress", "phases", "pagecache", "notices", "fatal", "lines", "holders"):
            yield Static(classes=f"server-{name} -empty", markup=False)

    def watch_data(self, data: tuple[ServerView, float] | None) -> None:
        if data is not None:
            self.update(*data)

    @property
    def view(self) -> ServerView | None:
        """The last view shown."""
        return self._view

    def update(self, view: ServerView, now: float) -> None:
        """Show a new view of the server."""
        self._view = view
        state = self.query_one(".server-state", Static)
        for cls in ("-good", "-bad", "-busy", "-idle", "-starting"):
            state.set_class(_STATE_CLASS.get(view.state, "-starting") == cls, cls)
        self._set("identity", identity_line(view))
        self._set("progress", progress_text(view.progress))
        self._set("phases", phases_line(view))
        self._set("pagecache", view.page_cache or "")
        notices = view.notices[-self.MAX_NOTICES :]
        self._set("notices", "\n".join(f"! {short_notice(n)}" for n in notices))
        crashed = view.state is ServerState.CRASHED
        self._set("fatal", (view.fatal or "exited before ready, no fatal line found") if crashed else "")
        self._set("lines", "\n".join(view.last_lines) if crashed else "")
        self._set("holders", holders_text(view.holders) if view.state is ServerState.STUCK else "")
        self.tick(now)

    def tick(self, now: float) -> None:
        """Refresh the time in state."""
        if self._view is not None:
            self._set("state", state_line(self._view, now))

    def _set(self, block: str, text: str) -> None:
        old = self._texts.get(block)
        if old == text:
            return
        self._texts[block] = text
        static = self.query_one(f".server-{block}", Static)
        # A layout pass only when the block's height changes: the time in state and the uptime change every tick
        # (tenths of a second under a minute); why: docs/decisions.md#ui-push-rate.
        width = static.content_region.width
        static.update(text, layout=width <= 0)
        if width > 0 and static.get_content_height(static.container_size, self.app.size, width) != (
            static.content_region.height
        ):
            static.refresh(layout=True)
        if block != "state":
            static.set_class(not text, "-empty")
