"""Provides ErrorModal: an error's title, message and what to do about it, closed with enter or escape."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ErrorModal(ModalScreen[None]):
    """Show an error: `ErrorModal(title, message, hint="")`. Enter, escape or the OK button close it."""

    DEFAULT_CSS = """
    ErrorModal {
        align: center middle;
        & > Vertical {
            width: 72;
            max-width: 95%;
            height: auto;
            max-height: 90%;
            border: thick $error;
            border-title-color: $error;
            background: $surface;
            padding: 0 2;
        }
        VerticalScroll { height: auto; max-height: 16; margin-top: 1; }
        .error-hint { color: $text-muted; margin-top: 1; }
        Horizontal { height: auto; margin: 1 0; align-horizontal: right; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,enter", "close", "Close", tooltip="Close")]

    def __init__(self, title: str, message: str, hint: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.message = message
        self.hint = hint

    def compose(self) -> ComposeResult:
        """Title in the border, message, hint, OK."""
        with Vertical() as box:
            box.border_title = self.title_text
            with VerticalScroll():
                yield Static(self.message, classes="error-message", markup=False)
                if self.hint:
                    yield Static(self.hint, classes="error-hint", markup=False)
            with Horizontal():
                yield Button("OK", id="ok", variant="primary")

    def on_mount(self) -> None:
        """Focus OK."""
        self.query_one("#ok", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Close on OK."""
        event.stop()
        self.dismiss(None)

    def action_close(self) -> None:
        """Close from a key."""
        self.dismiss(None)
