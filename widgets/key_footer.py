"""Provides KeyFooter: Textual's footer, compact, showing the keys that fit the terminal, most important first.

Textual's own footer lays every shown binding out in a row and cuts what passes the right edge, so at 120
columns the dashboard's help and quit keys (last in binding order) were the ones hidden. KeyFooter keeps the
keys its owner ranks most important (`importance`: actions, first = kept first), leaves out whole the ones
that do not fit (never a key without its word), shows them in `order`, and when it left any out the help key
says so ("? All keys"): each left-out key is one `?` away, and in the command palette.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

PALETTE_W = 11
"""The command-palette key on the right ("▏^p palette"), docked there by Textual's footer."""


def key_width(key_display: str, description: str) -> int:
    """Cells one compact footer key takes: the key, a space, the description and the margin after it."""
    return len(key_display) + (1 + len(description) if description else 0) + 1


def fitting(widths: Sequence[tuple[str, int]], importance: Sequence[str], room: int) -> set[str]:
    """The actions to show: in order of importance, each that still fits in `room` cells (a long one left out
    does not stop a shorter, less important one); actions not ranked come last, in the given order."""
    ranked = sorted(range(len(widths)), key=lambda i: (
        importance.index(widths[i][0]) if widths[i][0] in importance else len(importance), i))
    kept: set[str] = set()
    used = 0
    for index in ranked:
        action, width = widths[index]
        if used + width <= room:
            kept.add(action)
            used += width
    return kept


class KeyFooter(Footer):
    """`KeyFooter(help_action="help")`; the owner sets `importance` and `order` (actions) once its bindings are
    known; the footer lays the keys out again when the bindings or its width change."""

    def __init__(self, *, help_action: str = "help", name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes, compact=True)
        self.help_action = help_action
        self.importance: list[str] = [help_action]
        """Actions, most important first: the keys kept when not all fit."""
        self.order: list[str] = []
        """Actions in the order the footer shows them (others after, in binding order)."""
        self.left_out: list[str] = []
        """The actions of the keys the last layout left out (tests, and the help key's word)."""
        self._laid_out_width = -1

    def compose(self) -> ComposeResult:
        widgets = list(super().compose())
        keys = [w for w in widgets if isinstance(w, FooterKey) and not w.has_class("-command-palette")]
        others = [w for w in widgets if not isinstance(w, FooterKey) or w.has_class("-command-palette")]
        width = self.app.size.width
        self._laid_out_width = width
        room = width - (PALETTE_W if others else 0)
        widths = [(k.action, key_width(k.key_display, k.description)) for k in keys]
        kept = fitting(widths, self.importance, room)
        self.left_out = [k.action for k in keys if k.action not in kept]
        if self.left_out:  # make room for the help key's longer word, leaving out one more key if need be
            more = "All keys"
            help_keys = [k for k in keys if k.action == self.help_action]
            if help_keys:
                extra = len(more) - len(help_keys[0].description)
                kept = fitting(widths, self.importance, room - extra)
                self.left_out = [k.action for k in keys if k.action not in kept]
                help_keys[0].description = more
        shown = [k for k in keys if k.action in kept]
        yield from self._in_order(shown)
        yield from others

    def _in_order(self, keys: Iterable[FooterKey]) -> Iterable[Widget]:
        listed = list(keys)
        position = {action: i for i, action in enumerate(self.order)}
        return sorted(listed, key=lambda k: (position.get(k.action, len(position)), listed.index(k)))

    def on_resize(self) -> None:
        """Another width: lay the keys out again (a tmux client of another size attaching, too)."""
        if self.app.size.width != self._laid_out_width and self.is_attached:
            self.call_after_refresh(self.recompose)
