"""Provides AdvisorScreen: the advisor's findings as text, with keys to apply the fixes or A/B them."""

from __future__ import annotations

from typing import ClassVar, Literal

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

AdvisorChoice = Literal["apply", "ab"]


class AdvisorScreen(Screen[AdvisorChoice | None]):
    """`AdvisorScreen(text, fixes)`: the advice (one finding per block: what, evidence, why, fix); `a` applies the
    fixes as pending flags, `b` applies them and A/Bs the running config against them, escape closes.

    It dismisses with "apply", "ab" or None; the app does the rest (nothing here knows about a server)."""

    DEFAULT_CSS = """
    AdvisorScreen { layout: vertical; }
    AdvisorScreen #title { padding: 0 1; text-style: bold; }
    AdvisorScreen VerticalScroll { height: 1fr; border: round $primary; padding: 0 1; }
    AdvisorScreen #hint { padding: 0 1; color: $text-muted; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "choose('apply')", "Apply fixes", tooltip="Set every fix as pending flags (r relaunches)"),
        Binding("b", "choose('ab')", "A/B it", tooltip="Apply the fixes, then A/B the running config against them"),
        Binding("escape", "close", "Close"),
    ]

    def __init__(self, text: str, fixes: str) -> None:
        super().__init__()
        self.text = text
        self.fixes = fixes  # "" when there is nothing to apply

    def compose(self) -> ComposeResult:
        yield Static("advisor: slower than before? / left on the table", id="title")
        with VerticalScroll():
            yield Static(self.text, markup=False, id="advice")
        hint = f"a: apply {self.fixes} as pending · b: A/B it · escape: close" if self.fixes else \
            "nothing to apply · escape: close"
        yield Static(hint, markup=False, id="hint")
        yield Footer()

    def action_choose(self, choice: AdvisorChoice) -> None:
        """Apply or A/B (only when there is a fix)."""
        if self.fixes:
            self.dismiss(choice)

    def action_close(self) -> None:
        self.dismiss(None)
