"""A log's window (app.core.hosts.window) holds whole lines only, the head from the start and the tail up to
`end`; following from `end` gives every later line: nothing lost between them, nothing twice. The same window
from the local reader, the SSH host's shell script and the in-memory fake."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.hosts.base import Host
from app.core.hosts.local import LocalHost, _read_window
from app.core.hosts.window import window_from


def _lines(data: bytes) -> list[str]:
    return [part.decode(errors="replace").rstrip("\r") for part in data.split(b"\n")[:-1]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=40), st.booleans(),
       st.integers(0, 60), st.integers(0, 60))
def test_window_is_whole_lines_and_following_from_its_end_loses_nothing(
        parts: list[bytes], partial_last: bool, head: int, tail: int) -> None:
    data = b"".join(p + b"\n" for p in parts) + (b"in progress" if partial_last else b"")
    size = len(data)
    if size <= head + tail:
        window = window_from(data, None, size)
    else:
        window = window_from(data[:head], data[size - tail - 1:], size)
    every = _lines(data)
    assert list(window.head) == every[:len(window.head)]
    assert 0 <= window.end <= size
    before_end = _lines(data[:window.end])
    assert list(window.tail) == before_end[len(before_end) - len(window.tail):]
    after = _lines(data[window.end:])  # what a follow from `end` yields (complete lines)
    assert list(window.tail) + after == every[len(every) - len(window.tail) - len(after):]
    if window.skipped == 0:
        assert list(window.lines) + after == every


def test_the_shell_script_window_matches_the_local_one(tmp_path: Path) -> None:
    """Host.read_window's script (what an SSH host runs) against LocalHost's own reader, on a file with a UTF-8
    character cut at both edges."""
    path = tmp_path / "server.log"
    path.write_bytes(("é" * 7 + "line\n").encode() * 2000 + b"partial")

    via_script = asyncio.run(Host.read_window(LocalHost("shell"), str(path), 1000, 3000))  # the base: the script
    assert via_script == _read_window(str(path), 1000, 3000)
    assert via_script is not None and via_script.skipped > 0 and via_script.tail[-1] == "é" * 7 + "line"
