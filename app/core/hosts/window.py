"""Bounded reads of a log on a host: its first and last bytes in whole lines (a LogWindow), never the whole file.

A log of a server that ran for days is hundreds of MB, and a record may name anything (a FIFO, /dev/zero): every
reader that replays a log (`tunedash status`, a dashboard's attach, the fleet, the advisor) reads at most
HEAD_BYTES from its start (where the phases and the ready line are) and TAIL_BYTES from its end (the latest decode
lines, notices and a crash's traceback), and follows from `LogWindow.end` on. Only regular files are read
(NotRegularFile otherwise). On a remote host the cut happens there (head -c, tail -c: WINDOW_SCRIPT), so only
the window crosses the connection. docs/decisions.md#bounded-log-readers has the figures.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from app.core.data import LOG_LINE_CUT, LOG_LINE_MAX
from app.core.errors import TunedashError

HEAD_BYTES = 1 << 20  # 1 MiB from the start: a startup's phases and its ready line
TAIL_BYTES = 2 << 20  # 2 MiB from the end: recent decode lines, notices, the fatal traceback

# $1 the file, $2 head bytes, $3 tail bytes. Prints the size, then "=" lines between base64 blocks (the bytes as
# they are: a cut inside a UTF-8 character or a line of NULs crosses intact). tail -c +N seeks on a regular file.
WINDOW_SCRIPT = (
    'test -e "$1" || exit 44; test -f "$1" || exit 45; '
    'size=$(stat -c %s -- "$1" 2>/dev/null || wc -c < "$1") || exit 46; size=$((size)); echo "$size"; '
    'if [ "$size" -le $(($2 + $3)) ]; then head -c "$size" -- "$1" | base64; '
    'else head -c "$2" -- "$1" | base64; echo =; '
    'tail -c "+$((size - $3))" -- "$1" | head -c "$(($3 + 1))" | base64; fi'
)


class WindowError(TunedashError):
    """What a host's window script printed cannot be read (a host without base64, head or tail)."""

    title = "Unreadable log window"


@dataclass(frozen=True)
class LogWindow:
    """The whole lines of a file's first and last bytes. `end` is the byte offset just past the last whole line
    read (following from there yields every later line exactly once); `skipped` the bytes between the head and
    the tail that were not read (0 when the file fit)."""

    head: tuple[str, ...]
    tail: tuple[str, ...]
    end: int
    skipped: int = 0

    @property
    def lines(self) -> tuple[str, ...]:
        return self.head + self.tail


def _line(data: bytes) -> str:
    """One line as followers yield it: without "\\r", cut at LOG_LINE_MAX bytes with LOG_LINE_CUT."""
    text = data[:LOG_LINE_MAX].decode(errors="replace").rstrip("\r")
    return text + LOG_LINE_CUT if len(data) > LOG_LINE_MAX else text


def _lines(data: bytes) -> tuple[str, ...]:
    return tuple(_line(part) for part in data.split(b"\n")[:-1]) if data else ()


def window_from(head: bytes, tail: bytes | None, size: int) -> LogWindow:
    """The window of a `size`-byte file from its first bytes `head` and, when the file did not fit, its last bytes
    `tail` (read from one byte before the tail's first line could start, so a whole first line is kept)."""
    if tail is None:
        cut = head.rfind(b"\n") + 1
        return LogWindow(_lines(head[:cut]), (), cut)
    head_end = head.rfind(b"\n") + 1
    tail_start = size - len(tail)
    first, last = tail.find(b"\n"), tail.rfind(b"\n")
    if first < 0:  # no line ends in the tail: one line longer than it; follow from the end
        return LogWindow(_lines(head[:head_end]), (), size, size - head_end)
    kept = tail[first + 1: last + 1]
    return LogWindow(_lines(head[:head_end]), _lines(kept), tail_start + last + 1, tail_start + first + 1 - head_end)


def window_from_script(stdout: str) -> LogWindow:
    """The window WINDOW_SCRIPT printed; WindowError when it is not what the script prints."""
    size_text, _, rest = stdout.partition("\n")
    if not size_text.strip().isdigit():
        raise WindowError(f"no file size in {size_text[:40]!r}")
    size = int(size_text)
    lines = rest.split("\n")
    marks = [i for i, line in enumerate(lines) if line == "="]
    blocks = ["".join(lines[:marks[0]]), "".join(lines[marks[0] + 1:])] if marks else ["".join(lines)]
    try:
        parts = [base64.b64decode(block, validate=True) for block in blocks]
    except (binascii.Error, ValueError) as exc:
        raise WindowError(f"not base64 ({exc})") from None
    if len(parts) == 1:
        return window_from(parts[0], None, len(parts[0]))
    return window_from(parts[0], parts[1], size)
