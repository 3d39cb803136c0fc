"""Provides HelpScreen: the key bindings, given as (key, description) pairs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static


class HelpScreen(ModalScreen[None]):
    """`HelpScreen(bindings, title="Keys")` lists each (key, description); escape, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
        & > Vertical {
            width: 100;
            max-width: 95%;
            height: auto;
            max-height: 90%;
            border: thick $primary;
            background: $surface;
            padding: 0 1;
        }
        DataTable { height: auto; max-height: 30; }
        .help-footer { color: $text-muted; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "Close", tooltip="Close help")]

    def __init__(self, bindings: Sequence[tuple[str, str]], title: str = "Keys", note: str = "") -> None:
        super().__init__()
        self.key_bindings = list(bindings)
        self.title_text = title
        self.note = note

    def compose(self) -> ComposeResult:
        """A two-column table of keys."""
        with Vertical() as box:
            box.border_title = self.title_text
            table: DataTable[str] = DataTable(cursor_type="row", zebra_stripes=True, show_cursor=False)
            table.add_columns("key", "does")
            for key, description in self.key_bindings:
                table.add_row(escape(key), escape(description))  # cells are markup: "[bench]" stays text
            yield table
            yield Static(f"escape: close · ↑↓ scroll{f' · {self.note}' if self.note else ''}", classes="help-footer")

    def on_mount(self) -> None:
        """The table takes the keys (↑↓ scroll it) and leaves the close line on screen on a small terminal."""
        self.query_one(DataTable).focus()
        self.on_resize()

    def on_resize(self) -> None:
        """As many rows as the terminal has room for, under the border and above the close line."""
        self.query_one(DataTable).styles.max_height = max(4, min(30, self.app.size.height - 6))

    def action_close(self) -> None:
        """Close help."""
        self.dismiss(None)
