"""The fleet table: one row per server (host, backend, state and time in it, tok/s, acceptance, GPU memory bars,
who drives, connection), updated cell by cell; Enter on a row posts FleetTable.Opened."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from app.core.data import ServerState

NA = "n/a"
BAR_LEVELS = " ▁▂▃▄▅▆▇█"
"""One character per GPU: its used/total memory in eighths (a blank is an empty GPU); "·" when not read."""

COLUMNS = (("host", "host"), ("server", "server"), ("state", "state"), ("tok", "tok/s"), ("accept", "accept"),
           ("gpus", "GPU mem"), ("connection", "connection"), ("driver", "driver"), ("backend", "backend"))
"""Left to right by what a glance needs: at 80 columns everything up to the connection shows (the table scrolls
sideways for the rest)."""

STATE_STYLE = {
    ServerState.READY: "bold green",
    ServerState.CRASHED: "bold red",
    ServerState.STUCK: "bold red",
    ServerState.STOPPED: "dim",
    ServerState.FREE: "dim",
    ServerState.WARM: "dim",
}
CONNECTION_STYLE = {"unreachable": "bold red", "failed": "bold red", "lost": "yellow", "reconnecting": "yellow"}


@dataclass(frozen=True)
class FleetRowView:
    """One server as the fleet table shows it (plain data; app.tui.fleet builds it)."""

    key: str  # unique per row (the profile file)
    host: str
    server: str  # the profile's name
    backend: str  # "sglang 0.5.10", or the backend alone when the version is unknown
    state: ServerState | None  # None: not known yet
    since: int | None  # whole seconds of the wall clock when the state began; None: unknown
    tokens_per_s: float | None
    accept_len: float | None
    gpu_fractions: tuple[float | None, ...]  # used/total per GPU of the profile; None: not read
    connection: str  # "local", "connected", "lost", "reconnecting", "failed", "unreachable", "connecting"
    driver: str | None  # who drives, short; None: nobody


def memory_bars(fractions: tuple[float | None, ...]) -> str:
    """ "█▇  " for four GPUs: one character each (BAR_LEVELS), "·" for one not read, "-" for a profile without."""
    if not fractions:
        return "-"
    out = []
    for fraction in fractions:
        if fraction is None:
            out.append("·")
            continue
        level = round(min(1.0, max(0.0, fraction)) * (len(BAR_LEVELS) - 1))
        out.append("▁" if level == 0 else BAR_LEVELS[level])
    return "".join(out)


def coarse_duration(seconds: float) -> str:
    """A time in state for the fleet: "42s" under a minute, then "17m", "3h05m", "2d04h". Past a minute it changes
    once a minute, so a table of long-running servers is not redrawn every second (docs/architecture.md#the-fleet)."""
    seconds = int(max(0.0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def state_cell(view: FleetRowView, now_s: int) -> Text:
    """ "READY 17m", "STOPPED", "…" while not known, "n/a" for a host that cannot be reached."""
    if view.state is None:  # not known: the host has not answered yet, or cannot be reached
        return Text(NA if view.connection in ("unreachable", "failed") else "…", style="dim")
    text = view.state.value if view.since is None else f"{view.state.value} {coarse_duration(now_s - view.since)}"
    return Text(text, style=STATE_STYLE.get(view.state, ""))


def row_cells(view: FleetRowView, now_s: int) -> tuple[str | Text, ...]:
    """The cells of one row, in COLUMNS order."""
    tokens = NA if view.tokens_per_s is None else f"{view.tokens_per_s:.0f}"
    accept = NA if view.accept_len is None else f"{view.accept_len:.2f}"
    gpus = memory_bars(view.gpu_fractions)
    return (view.host, view.server, state_cell(view, now_s), tokens, accept, gpus,
            Text(view.connection, style=CONNECTION_STYLE.get(view.connection, "")), view.driver or "-", view.backend)


class FleetTable(DataTable[str | Text]):
    """The servers of the fleet; `update(rows, now_s)` changes only the cells that changed."""

    DEFAULT_CSS = """
    FleetTable { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Open dashboard", tooltip="The full dashboard of the row (Escape: back)"),
    ]

    class Opened(Message):
        """Enter (or a click) on a row: open that server's dashboard."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._shown: dict[str, tuple[str | Text, ...]] = {}
        self._order: list[str] = []

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def update(self, rows: list[FleetRowView], now_s: int) -> None:
        """Show `rows` in their order: rebuilt when the set or order of rows changed, else cell by cell."""
        order = [row.key for row in rows]
        cells = {row.key: row_cells(row, now_s) for row in rows}
        if order != self._order:
            selected = self._order[self.cursor_row] if 0 <= self.cursor_row < len(self._order) else None
            self.clear()
            for key in order:
                self.add_row(*cells[key], key=key)
            self._order, self._shown = order, cells
            if selected in order:
                self.move_cursor(row=order.index(selected))
            return
        for key, new in cells.items():
            old = self._shown.get(key)
            for (column, _label), before, after in zip(COLUMNS, old or (), new, strict=False):
                if before != after:
                    self.update_cell(key, column, after, update_width=True)
            self._shown[key] = new

    def on_data_table_row_selected(self, message: DataTable.RowSelected) -> None:
        message.stop()
        if message.row_key.value is not None:
            self.post_message(self.Opened(message.row_key.value))
