"""Provides EventLog and EventEntry: timestamped actions and outcomes, kept across relaunches, exportable."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar, Literal

from rich.text import Text
from textual.widgets import RichLog

Level = Literal["info", "action", "success", "warning", "error"]
LEVEL_MARKS = {"warning": "! ", "error": "✗ "}
"""The mark before a warning's or an error's text, so the level reads without colour."""


@dataclass(frozen=True)
class EventEntry:
    """One event: wall-clock time (time.time()), text, and level."""

    at: float
    text: str
    level: Level = "info"


def clock_time(at: float) -> str:
    """Local wall-clock "HH:MM:SS" (the default display format)."""
    return time.strftime("%H:%M:%S", time.localtime(at))


def full_time(at: float) -> str:
    """Local "YYYY-MM-DD HH:MM:SS.mmm" (the default export format)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


class EventLog(RichLog):
    """An append-only event log. `add(entry)` / `extend(entries)` append; `export_text()` returns it all.

    Nothing is cleared on relaunch; only `clear_events()` empties it. At most `max_entries` are kept.
    `format_time` formats the displayed time (inject a fixed one for deterministic snapshots) and
    `export_format_time` the exported one.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "event-log--time",
        "event-log--info",
        "event-log--action",
        "event-log--success",
        "event-log--warning",
        "event-log--error",
    }

    DEFAULT_CSS = """
    EventLog {
        height: 1fr;
        min-height: 3;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        background: $surface;
        scrollbar-size-vertical: 1;
        & > .event-log--time { color: $text-muted; }
        & > .event-log--info { color: $text; }
        & > .event-log--action { color: $accent; }
        & > .event-log--success { color: $success; }
        & > .event-log--warning { color: $warning; }
        & > .event-log--error { color: $error; text-style: bold; }
    }
    """

    def __init__(
        self,
        max_entries: int = 5000,
        format_time: Callable[[float], str] = clock_time,
        export_format_time: Callable[[float], str] = full_time,
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(
            max_lines=max_entries,
            min_width=20,
            wrap=True,
            markup=False,
            auto_scroll=True,
            name=name,
            id=id,
            classes=classes,
        )
        self.border_title = "Events"
        self.format_time = format_time
        self.export_format_time = export_format_time
        self._entries: deque[EventEntry] = deque(maxlen=max_entries)
        self._started = False

    @property
    def entries(self) -> list[EventEntry]:
        """All kept entries, oldest first."""
        return list(self._entries)

    def on_mount(self) -> None:
        """Write entries added before mounting."""
        self._started = True
        for entry in self._entries:
            self._write_entry(entry)

    def add(self, entry: EventEntry) -> None:
        """Append one event."""
        self._entries.append(entry)
        if self._started:
            self._write_entry(entry)

    def extend(self, entries: Iterable[EventEntry]) -> None:
        """Append several events."""
        for entry in entries:
            self.add(entry)

    def clear_events(self) -> None:
        """Forget every event."""
        self._entries.clear()
        self.clear()

    def _write_entry(self, entry: EventEntry) -> None:
        line = Text()
        line.append(self.format_time(entry.at) + " ", self.get_component_rich_style("event-log--time", partial=True))
        # a warning or an error says so in a mark too, not in its colour only (NO_COLOR shows it in greys)
        style = self.get_component_rich_style(f"event-log--{entry.level}", partial=True)
        line.append(LEVEL_MARKS.get(entry.level, "") + entry.text, style)
        self.write(line)

    def export_text(self) -> str:
        """Every kept entry as plain text, one per line: "<time>  <level>  <text>"."""
        return "".join(f"{self.export_format_time(e.at)}  {e.level:<7}  {e.text}\n" for e in self._entries)
