"""ValuePrompt: a small modal asking for one flag's value (empty clears the flag), or one option's (`--slots`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class ValuePrompt(ModalScreen[str | None]):
    """Ask for a value; Enter answers, Escape cancels (None)."""

    DEFAULT_CSS = """
    ValuePrompt { align: center middle; }
    ValuePrompt > Vertical {
        width: 70; height: auto; padding: 1 2;
        border: round $primary; background: $surface;
    }
    ValuePrompt Label.help { color: $text-muted; width: 100%; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, flag: str, help_text: str, initial: str, choices: Sequence[str] = (),
                 empty_help: str = "empty = remove the flag") -> None:
        super().__init__()
        self.empty_help = empty_help
        self.flag = flag
        self.help_text = help_text
        self.initial = initial
        self.choices = tuple(choices)

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"--{self.flag}"
            yield Label(self.help_text, classes="help")
            if self.choices:
                yield Label("choices: " + ", ".join(self.choices), classes="help")
            yield Label(self.empty_help, classes="help")
            yield Input(value=self.initial, id="value")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
