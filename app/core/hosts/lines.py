"""LineCutter: bytes read in chunks (a followed file, an SSH channel) turned into lines of at most LOG_LINE_MAX
bytes, a longer line cut there with LOG_LINE_CUT and the rest of it read past, never held."""

from __future__ import annotations

from app.core.data import LOG_LINE_CUT, LOG_LINE_MAX


class LineCutter:
    """Feed it chunks as they arrive; it returns the lines they complete (without "\\n" and a trailing "\\r")."""

    def __init__(self) -> None:
        self._pending = b""  # the start of the line being read, LOG_LINE_MAX bytes at most
        self._cutting = False  # that line passed LOG_LINE_MAX: the rest of it is dropped up to its newline

    def feed(self, chunk: bytes) -> list[str]:
        *lines, rest = chunk.split(b"\n")
        done: list[str] = []
        for line in lines:
            whole = self._pending if self._cutting else self._pending + line
            done.append(_cut_line(whole, self._cutting or len(whole) > LOG_LINE_MAX))
            self._pending, self._cutting = b"", False
        if not self._cutting:
            self._pending += rest
            if len(self._pending) > LOG_LINE_MAX:
                self._pending, self._cutting = self._pending[:LOG_LINE_MAX], True
        return done

    def end(self) -> list[str]:
        """At the end of the stream: the last line when it had no newline (none when it was empty)."""
        if not self._pending and not self._cutting:
            return []
        last = _cut_line(self._pending, self._cutting)
        self._pending, self._cutting = b"", False
        return [last]


def _cut_line(data: bytes, cut: bool) -> str:
    """One line as text: without its "\\r", cut to LOG_LINE_MAX bytes with LOG_LINE_CUT when `cut`."""
    text = data[:LOG_LINE_MAX].decode(errors="replace").rstrip("\r")
    return text + LOG_LINE_CUT if cut else text
