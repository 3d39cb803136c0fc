"""Provides ConfirmModal: a yes/no question answered with y, n or escape; the safe choice has focus."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmModal(ModalScreen[bool]):
    """Ask before doing something. Dismisses with True (y / the yes button) or False (n, escape, no).

    `ConfirmModal(question, detail="", yes_label="Yes", no_label="No", danger=True)`. The "no" button
    has focus, so a stray enter does nothing harmful. With `danger` the yes button is styled as an error.
    """

    DEFAULT_CSS = """
    ConfirmModal {
        align: center middle;
        & > Vertical {
            width: 64;
            max-width: 95%;
            height: auto;
            border: thick $warning;
            background: $surface;
            padding: 1 2;
        }
        .confirm-question { text-style: bold; }
        .confirm-detail { color: $text-muted; margin-top: 1; }
        Horizontal { height: auto; margin-top: 1; align-horizontal: right; }
        Button { margin-left: 2; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", tooltip="Confirm"),
        Binding("n,escape", "answer(False)", "No", tooltip="Cancel"),
    ]

    def __init__(
        self,
        question: str,
        detail: str = "",
        yes_label: str = "Yes",
        no_label: str = "No",
        danger: bool = True,
    ) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.yes_label = yes_label
        self.no_label = no_label
        self.danger = danger

    def compose(self) -> ComposeResult:
        """Question, detail, and the two buttons."""
        with Vertical():
            yield Static(self.question, classes="confirm-question", markup=False)
            if self.detail:
                yield Static(self.detail, classes="confirm-detail", markup=False)
            with Horizontal():
                yield Button(f"{self.yes_label} (y)", id="yes", variant="error" if self.danger else "primary")
                yield Button(f"{self.no_label} (n)", id="no", variant="default")

    def on_mount(self) -> None:
        """Focus the safe choice."""
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Answer with the pressed button."""
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        """Answer from a key."""
        self.dismiss(answer)
