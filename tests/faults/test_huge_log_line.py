"""A 50 MB log line (a server that prints a tensor, a binary blob in its log) is cut at 64 KiB with a marker where
lines enter: LocalHost.follow, SshHost's stream reader (its follow and telemetry streams), read_log_lines/parse_lines
and LogParser.feed. Before the cut, follow held the line whole (about 7 s here to read it) and parse_lines took 13 s
on it; the lines around it must come through intact."""

from __future__ import annotations

import contextlib
import sys
import tracemalloc
from pathlib import Path

import pytest

from app.core.data import LOG_LINE_CUT, LOG_LINE_MAX, FatalEvent
from app.core.hosts.local import LocalHost
from app.core.logs.parser import LogParser, parse_lines, read_log_lines
from tests.integration.sshd import Sshd

HUGE = 50 * 1024 * 1024
FIRST = "[2026-01-01 00:00:00] starting the server"
LAST = "[2026-01-01 00:00:01] The server is fired up and ready to roll!"
CUT_LINE = "x" * LOG_LINE_MAX + LOG_LINE_CUT


@pytest.fixture
def huge_log(tmp_path: Path) -> Path:
    path = tmp_path / "server.log"
    with path.open("wb") as handle:
        handle.write(FIRST.encode() + b"\n")
        for _ in range(HUGE // (1 << 20)):
            handle.write(b"x" * (1 << 20))
        handle.write(b"\r\n" + LAST.encode() + b"\n")
    return path


async def test_follow_cuts_the_line_and_never_holds_it(huge_log: Path) -> None:
    lines: list[str] = []
    tracemalloc.start()
    try:
        async with contextlib.aclosing(LocalHost().follow(str(huge_log))) as followed:
            async for line in followed:
                lines.append(line)
                if len(lines) == 3:
                    break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [FIRST, CUT_LINE, LAST]
    assert peak < 4 * 1024 * 1024  # a few 64 KiB reads, not 50 MB


def test_parse_lines_reads_the_file_with_the_line_cut(huge_log: Path) -> None:
    tracemalloc.start()
    try:
        lines = list(read_log_lines(huge_log))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [FIRST + "\n", CUT_LINE + "\n", LAST + "\n"] and peak < 4 * 1024 * 1024
    parsed = parse_lines(read_log_lines(huge_log), "sglang")
    assert parsed.lines == 3 and parsed.skipped == 2  # the first line and the cut one say nothing
    assert [type(event).__name__ for event in parsed.events] == ["ReadyEvent"]


def test_feed_cuts_a_huge_line_before_reading_it_and_leaves_a_cut_line_alone() -> None:
    parser = LogParser("sglang")
    events = parser.feed("torch.OutOfMemoryError: CUDA out of memory. " + "y" * HUGE)
    fatal = [event for event in events if isinstance(event, FatalEvent)]
    assert fatal and all(len(event.line.text) <= LOG_LINE_MAX + len(LOG_LINE_CUT) for event in fatal)
    assert fatal[0].line.text.endswith(LOG_LINE_CUT)
    again = LogParser("sglang")
    again.feed(CUT_LINE)
    assert again.lines == 1 and again.skipped == 1
    assert parse_lines([CUT_LINE]).lines == 1


async def test_a_command_printing_a_line_over_64_kib_does_not_hang_the_stream(tmp_path: Path) -> None:
    """LocalHost.stream_lines (the nvidia-smi -lms stream): a line over the reader's limit used to kill the pump
    task silently while the consumer waited for ever; now the line is said to be cut and the stream goes on."""
    script = "import sys; print('a' * 200_000); print('after'); sys.stdout.flush()"
    host = LocalHost("local", state_dir=str(tmp_path))
    lines = [line async for line in host.stream_lines([sys.executable, "-c", script])]
    assert lines[-2:] == ["after", "\x00exit:0"] and "line cut" in lines[0]


@pytest.mark.ssh
async def test_follow_over_ssh_cuts_the_line_as_locally(sshd: Sshd, ssh_tmp: Path) -> None:
    """SshHost.follow (`tail -F` over the channel) handed a long line on in pieces of asyncssh's receive window
    (~2 MiB: 4 "lines" of x for this 6 MiB one); it is cut at 64 KiB like LocalHost.follow's, and the line
    after it comes through whole."""
    from app.core.hosts.ssh import SshHost

    path = ssh_tmp / "server.log"
    path.write_bytes(FIRST.encode() + b"\n" + b"x" * (6 << 20) + b"\r\n" + LAST.encode() + b"\n")
    host = SshHost(sshd.spec, options=sshd.options())
    lines: list[str] = []
    try:
        async with contextlib.aclosing(host.follow(str(path))) as followed:
            async for line in followed:
                lines.append(line)
                if len(lines) == 3 or line == LAST:
                    break
    finally:
        await host.close()
    assert lines == [FIRST, CUT_LINE, LAST]


@pytest.mark.ssh
async def test_a_stream_over_ssh_cuts_a_long_line_in_stdout_and_stderr(sshd: Sshd) -> None:
    from app.core.hosts.ssh import SshHost

    script = "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo after; head -c 100000 /dev/zero | tr '\\0' b >&2"
    host = SshHost(sshd.spec, options=sshd.options())
    try:
        lines = [line async for line in host.stream_lines(["sh", "-c", script])]
    finally:
        await host.close()
    out = [line for line in lines if not line.startswith("\x00")]
    assert out == ["a" * LOG_LINE_MAX + LOG_LINE_CUT, "after"]
    assert "\x00stderr:" + "b" * LOG_LINE_MAX + LOG_LINE_CUT in lines and lines[-1] == "\x00exit:0"
