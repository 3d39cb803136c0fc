"""Provides FlagsPanel and ToggleRow: each toggle's key, flag, running value and pending value.

A row whose pending value differs from the running one carries the CSS class "-pending".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.events import Click
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static


@dataclass(frozen=True)
class ToggleRow:
    """One toggle. Values are the flag's text ("3", "true"); None means the flag is absent (off)."""

    key: str
    label: str
    flag: str
    running: str | None
    pending: str | None

    @property
    def is_pending(self) -> bool:
        """True when the next launch would change this flag."""
        return self.running != self.pending


def show_value(value: str | None) -> str:
    """How a flag value is shown: None (absent) as "off"."""
    return "off" if value is None else value


class FlagRow(Horizontal):
    """One toggle row, keyed by flag. Created and updated by FlagsPanel."""

    DEFAULT_CSS = """
    FlagRow {
        height: 1;
        & > Static { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
        .flag-key { width: 5; color: $accent; text-style: bold; }
        .flag-label { width: 1fr; min-width: 10; }
        .flag-running { width: 8; text-align: right; }
        .flag-pending { width: 11; color: $text-muted; }
        &.-pending { background: $warning 15%; }
        &.-pending .flag-pending { color: $warning; text-style: bold; }
        &:hover { background: $boost; }
    }
    """

    def __init__(self, row: ToggleRow) -> None:
        super().__init__(classes="flag-row")
        self.row = row
        self._composed = False

    def compose(self) -> ComposeResult:
        """Key, label, running value, pending value."""
        yield Static(classes="flag-key", markup=False)
        yield Static(classes="flag-label", markup=False)
        yield Static(classes="flag-running", markup=False)
        yield Static(classes="flag-pending", markup=False)

    def on_mount(self) -> None:
        """Show the row it was created with."""
        self._composed = True
        self._render_row(self.row, force=True)

    def show(self, row: ToggleRow) -> None:
        """Show new values (cells are touched only when changed)."""
        old, self.row = self.row, row
        self._render_row(row, force=False, old=old)

    def _render_row(self, row: ToggleRow, force: bool, old: ToggleRow | None = None) -> None:
        if not self._composed:
            return
        if force or old is None or old != row:
            # fixed-size one-line cells: no layout pass (a key's change reaches the screen sooner)
            self.query_one(".flag-key", Static).update(Text(f"[{row.key}]"), layout=False)
            label = self.query_one(".flag-label", Static)
            label.update(row.label, layout=False)
            label.tooltip = row.flag
            self.query_one(".flag-running", Static).update(show_value(row.running), layout=False)
            pending = f" → {show_value(row.pending)}" if row.is_pending else ""
            self.query_one(".flag-pending", Static).update(pending, layout=False)
            self.set_class(row.is_pending, "-pending")
            self.tooltip = f"{row.flag}: running {show_value(row.running)}, next {show_value(row.pending)}"

    def on_click(self, event: Click) -> None:
        """Ask for this toggle to be flipped."""
        self.post_message(FlagsPanel.ToggleRequested(self.row.key, self.row.flag))


class FlagsPanel(Widget):
    """The toggles. Set `data` (a tuple of ToggleRow) as often as you like: the panel redraws only when the rows
    differ from the last (a reactive); `update(rows)` shows them at once. Rows are keyed by flag, so only changed rows
    are touched.

    Posts ToggleRequested when a row is clicked (the app's key bindings do the same through its own
    actions). `pending_count` says how many toggles differ from the running server.
    """

    DEFAULT_CSS = """
    FlagsPanel {
        height: auto;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        border-subtitle-color: $warning;
        padding: 0 1;
        & > .flags-empty { color: $text-muted; }
    }
    """

    class ToggleRequested(Message):
        """The user clicked a toggle."""

        def __init__(self, key: str, flag: str) -> None:
            super().__init__()
            self.key = key
            self.flag = flag

    data: reactive[tuple[ToggleRow, ...]] = reactive((), layout=False, repaint=False, init=False)
    """The rows shown; a value equal to the last one changes nothing."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.border_title = "Flags"
        self._rows: dict[str, FlagRow] = {}

    def compose(self) -> ComposeResult:
        """A placeholder until the first rows."""
        yield Static("no toggles", classes="flags-empty")

    def watch_data(self, rows: tuple[ToggleRow, ...]) -> None:
        self.update(rows)

    @property
    def rows(self) -> list[ToggleRow]:
        """The rows shown, in order."""
        return [r.row for r in self._rows.values()]

    @property
    def pending_count(self) -> int:
        """How many toggles would change on the next launch."""
        return sum(1 for r in self._rows.values() if r.row.is_pending)

    def update(self, rows: Sequence[ToggleRow]) -> None:
        """Show the toggles; re-mounts only when the set or order of flags changes."""
        flags = [r.flag for r in rows]
        if flags != list(self._rows):
            for old in self._rows.values():
                old.remove()
            self.query(".flags-empty").remove()
            self._rows = {r.flag: FlagRow(r) for r in rows}
            self.mount_all(list(self._rows.values()))
        else:
            for row in rows:
                self._rows[row.flag].show(row)
        count = self.pending_count
        subtitle = f"{count} pending · d: diff" if count else ""
        if subtitle != (self.border_subtitle or ""):  # setting it refreshes the panel, even to the same text
            self.border_subtitle = subtitle
