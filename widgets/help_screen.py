"""Provides HelpScreen: the key bindings, given as (key, description) pairs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

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
            width: 70;
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

    def __init__(self, bindings: Sequence[tuple[str, str]], title: str = "Keys") -> None:
        super().__init__()
        self.key_bindings = list(bindings)
        self.title_text = title

    def compose(self) -> ComposeResult:
        """A two-column table of keys."""
        with Vertical() as box:
            box.border_title = self.title_text
            table: DataTable[str] = DataTable(cursor_type="row", zebra_stripes=True, show_cursor=False)
            table.add_columns("key", "does")
            for key, description in self.key_bindings:
                table.add_row(key, description)
            yield table
            yield Static("escape: close", classes="help-footer")

    def action_close(self) -> None:
        """Close help."""
        self.dismiss(None)
