"""What the log-parser tests share: the fixture folder, a whole log parsed, one line parsed, events of a type."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from app.core.data import LogEvent
from app.core.logs.parser import LogParser, parse_lines, read_log_lines

T = TypeVar("T")

LOGS = Path(__file__).resolve().parent / "data" / "logs"


def parse(name: str) -> list[LogEvent]:
    """Every event of the fixture log tests/data/logs/NAME."""
    return list(parse_lines(read_log_lines(LOGS / name)).events)


def of_type(events: list[LogEvent], kind: type[T]) -> list[T]:
    return [event for event in events if isinstance(event, kind)]


def feed(line: str, backend: str | None) -> list[LogEvent]:
    """The events of one line fed to a fresh parser (and what a flush gives after it)."""
    parser = LogParser(backend)
    return parser.feed(line) + parser.flush()
