"""Provides DiffScreen and diff_flags: the pending command line against the running one, flag by flag.

A change is core's FlagChange (app.core.data) holding command-line words: a bare switch is "", an absent
flag None.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from app.core.data import FlagChange

CommandSpec = Sequence[str] | Mapping[str, str | bool | None]
"""An argv list, or a flag dict of command-line words: {"--flag": text, True for a bare switch, None/False absent}."""

COMMAND_KEY = "(command)"
"""The pseudo-flag holding the argv words before the first "--flag"."""


def argv_to_flags(argv: Sequence[str]) -> dict[str, str]:
    """Parse an argv list into {flag: value}.

    Words before the first "--" word form COMMAND_KEY. "--flag=value" and "--flag v1 v2" are both
    read; a bare switch has the value "". A repeated flag keeps every value, space-separated.
    """
    flags: dict[str, str] = {}
    head: list[str] = []
    current: str | None = None
    values: list[str] = []

    def close() -> None:
        if current is not None:
            joined = " ".join(values)
            flags[current] = f"{flags[current]} {joined}".strip() if current in flags else joined

    for word in argv:
        if word.startswith("--") and len(word) > 2:
            close()
            name, eq, value = word.partition("=")
            current, values = name, ([value] if eq else [])
        elif current is None:
            head.append(word)
        else:
            values.append(word)
    close()
    if head:
        flags = {COMMAND_KEY: shlex.join(head), **flags}
    return flags


def _normalise(spec: CommandSpec) -> dict[str, str]:
    if isinstance(spec, Mapping):
        out: dict[str, str] = {}
        for flag, value in spec.items():
            if value is None or value is False:
                continue
            out[flag] = "" if value is True else str(value)
        return out
    return argv_to_flags(spec)


def diff_flags(running: CommandSpec, pending: CommandSpec) -> list[FlagChange]:
    """Removed, added and changed flags from `running` to `pending`, in command-line order."""
    before, after = _normalise(running), _normalise(pending)
    changes: list[FlagChange] = []
    for flag, value in before.items():
        if flag not in after:
            changes.append(FlagChange(flag, value, None))
        elif after[flag] != value:
            changes.append(FlagChange(flag, value, after[flag]))
    changes.extend(FlagChange(flag, None, value) for flag, value in after.items() if flag not in before)
    return changes


def change_line(change: FlagChange) -> str:
    """ "- --flag old", "+ --flag new" or "~ --flag old -> new"."""
    if change.kind == "removed":
        return f"- {change.flag} {change.old}".rstrip()
    if change.kind == "added":
        return f"+ {change.flag} {change.new}".rstrip()
    return f"~ {change.flag} {change.old or '(switch)'} -> {change.new or '(switch)'}"


def _command_line(spec: CommandSpec) -> str:
    if isinstance(spec, Mapping):
        words: list[str] = []
        for flag, value in _normalise(spec).items():
            words.append(flag)
            if value:
                words.append(value)
        return shlex.join(words)
    return shlex.join(spec)


class DiffScreen(ModalScreen[None]):
    """A modal listing the flags the pending command line removes, adds and changes.

    `DiffScreen(running, pending)`; each is an argv list or a flag dict. Escape, q or d closes it.
    `changes` holds the computed FlagChange list.
    """

    DEFAULT_CSS = """
    DiffScreen {
        align: center middle;
        & > Vertical {
            width: 90%;
            max-width: 110;
            height: auto;
            max-height: 90%;
            border: thick $primary;
            background: $surface;
            padding: 0 1;
        }
        VerticalScroll { height: auto; max-height: 20; }
        .diff-removed { color: $error; }
        .diff-added { color: $success; }
        .diff-changed { color: $warning; }
        .diff-none { color: $text-muted; }
        .diff-cmd { color: $text-muted; margin-top: 1; }
        .diff-help { color: $text-muted; margin-top: 1; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,d", "close", "Close", tooltip="Close the diff"),
    ]

    def __init__(self, running: CommandSpec, pending: CommandSpec, title: str = "Pending changes") -> None:
        super().__init__()
        self.running = running
        self.pending = pending
        self.title_text = title
        self.changes = diff_flags(running, pending)

    def compose(self) -> ComposeResult:
        """The change list, then both full command lines."""
        with Vertical() as box:
            box.border_title = self.title_text
            with VerticalScroll():
                if not self.changes:
                    yield Static("no changes: the next launch uses the running command line", classes="diff-none")
                for change in self.changes:
                    yield Static(change_line(change), classes=f"diff-{change.kind}", markup=False)
                yield Static(f"running: {_command_line(self.running)}", classes="diff-cmd", markup=False)
                yield Static(f"pending: {_command_line(self.pending)}", classes="diff-cmd", markup=False)
            yield Static("escape: close", classes="diff-help")

    def action_close(self) -> None:
        """Close the diff."""
        self.dismiss(None)
