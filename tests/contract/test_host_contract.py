"""The host interface contract: every Host implementation must pass these (LocalHost, and SshHost through a
real OpenSSH sshd on loopback, logged in as a non-root test user; skipped without sshd)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from pathlib import Path

from app.core.hosts.base import Host


async def test_run_captures_output_and_code(host: Host) -> None:
    result = await host.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")


async def test_missing_command_reads_like_a_shell(host: Host) -> None:
    result = await host.run(["tunedash-no-such-command"])
    assert result.returncode == 127 and "not found" in result.stderr


async def test_values_are_never_run_by_a_shell(host: Host, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    value = f"; touch {marker} $(touch {marker})"
    result = await host.run(["echo", value])
    assert result.stdout == value + "\n"
    assert not marker.exists()


async def test_no_login_shell_reads_a_value(host: Host, tmp_path: Path) -> None:
    """Under a fish login shell `'x\\' '` was one word and `; touch ... #` then ran (the `#` ate the closing
    quote); tcsh refused a newline inside quotes. Every value must reach the command as it was, in every shell."""
    marker = tmp_path / "pwned"
    injection = ["x\\", f"; touch {marker} #"]
    result = await host.run(["printf", "[%s]\\n", *injection])
    assert not marker.exists(), "a value ran as a command"
    assert result.stdout == "".join(f"[{value}]\n" for value in injection)
    values = [*injection, "a\nb", "!!", "$HOME", "~", "*", "{a,b}", "'\"`", "%self", ""]
    result = await host.run(["printf", "[%s]\\n", *values])
    assert (result.returncode, result.stdout) == (0, "".join(f"[{value}]\n" for value in values))
    assert not marker.exists()
    path = str(tmp_path / "x\\ '; touch pwned #")
    text = f"x\\\n; touch {marker} #\n'\"\n"  # a file's text (a command's input over SSH), to the byte
    await host.write_text(path, text)
    assert await host.read_text(path) == text and not marker.exists()
    lines = [line async for line in host.stream_lines(["printf", "[%s]\\n", *values])]
    assert lines == [*(f"[{value}]" for value in values[:2]), "[a", "b]", *(f"[{v}]" for v in values[3:]), "\x00exit:0"]
    assert not marker.exists()


async def test_an_empty_text_is_written_at_once(host: Host, tmp_path: Path) -> None:
    """Over SSH an empty write sent no EOF (asyncssh skips both for empty input), so it hung until the timeout."""
    path = str(tmp_path / "empty")
    await asyncio.wait_for(host.write_text(path, ""), 10)
    assert await host.read_text(path) == ""


async def test_stream_yields_lines_stderr_and_exit(host: Host) -> None:
    lines = [line async for line in host.stream_lines(["sh", "-c", "echo a; echo b >&2; echo c; exit 5"])]
    assert [x for x in lines if not x.startswith("\x00")] == ["a", "c"]
    assert "\x00stderr:b" in lines
    assert lines[-1] == "\x00exit:5"


async def test_closing_a_stream_stops_the_command(host: Host, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    stream = host.stream_lines(["sh", "-c", f"echo $$ > {pidfile}; while true; do echo tick; sleep 0.05; done"])
    assert await stream.__anext__() == "tick"
    await stream.aclose()
    pid = int(pidfile.read_text())
    await asyncio.sleep(0.2)
    procs = {p.pid: p for p in await host.processes()}
    assert pid not in procs or procs[pid].state == "Z"


async def test_detached_job_leads_its_own_group_and_gets_verbatim_args(host: Host, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "job.log"
    marker = tmp_path / "pwned"
    evil = f"; touch {marker} $(touch {marker})"
    spawned = await host.spawn_detached(
        ["sh", "-c", 'echo "arg=$1 env=$TD_X"; sleep 30 & wait', "sh", evil],
        log_path=str(log), env={"TD_X": "a b"},
    )
    try:
        assert spawned.pid == spawned.pgid
        for _ in range(50):
            if log.exists() and "arg=" in log.read_text():
                break
            await asyncio.sleep(0.05)
        assert log.read_text() == f"arg={evil} env=a b\n"
        assert not marker.exists()
        for _ in range(50):  # the shell forks `sleep` after it printed: wait for it, do not race it
            members = [p for p in await host.processes() if p.pgid == spawned.pgid and p.state != "Z"]
            if {p.name for p in members} >= {"sh", "sleep"}:
                break
            await asyncio.sleep(0.05)
        assert {p.name for p in members} >= {"sh", "sleep"}
        assert await host.signal_group(spawned.pgid, signal.SIGTERM)
        for _ in range(50):
            alive = [p for p in await host.processes() if p.pgid == spawned.pgid and p.state != "Z"]
            if not alive:
                break
            await asyncio.sleep(0.05)
        assert not alive
    finally:
        with contextlib.suppress(Exception):
            await host.signal_group(spawned.pgid, signal.SIGKILL)


async def test_signal_to_a_missing_group_says_so(host: Host) -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())  # noqa: ASYNC240
    assert not await host.signal_group(pid_max + 1, signal.SIGTERM)


async def test_port_in_use(host: Host) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        assert await host.port_in_use(port)
    finally:
        listener.close()
    assert not await host.port_in_use(port)


async def test_files_and_follow(host: Host, tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "f.txt")
    assert await host.read_text(path) is None
    await host.write_text(path, "one\n")
    assert await host.read_text(path) == "one\n"
    seen: list[str] = []

    async def follow() -> None:
        async for line in host.follow(path):
            seen.append(line)
            if len(seen) == 3:
                return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.1)
    with open(path, "a") as handle:  # noqa: ASYNC230
        handle.write("two\nthr")
        handle.flush()
        await asyncio.sleep(0.1)
        handle.write("ee\n")
    await asyncio.wait_for(task, 3)
    assert seen == ["one", "two", "three"]
    await host.remove(path)
    assert await host.read_text(path) is None


async def test_group_alive_follows_the_group_not_just_its_leader(host: Host, tmp_path: Path) -> None:
    """group_alive answers what a scan of processes() would: live members started no earlier than the record."""
    spawned = await host.spawn_detached(["sh", "-c", "sleep 30 & sleep 30 & wait"], log_path=str(tmp_path / "g.log"))
    try:
        for _ in range(50):  # both children forked before the leader is killed (else the group may die with it)
            if len([p for p in await host.processes() if p.pgid == spawned.pgid and p.name == "sleep"]) >= 2:
                break
            await asyncio.sleep(0.05)
        assert await host.group_alive(spawned.pgid, spawned.start_time)
        later = str(int(spawned.start_time) + 10**9)  # a record of a newer job that reused this group id: not ours
        assert not await host.group_alive(spawned.pgid, later)
        await host.run(["kill", "-KILL", str(spawned.pid)])  # the leader only: its children hold the group
        for _ in range(50):
            if not [p for p in await host.processes() if p.pid == spawned.pid and p.state != "Z"]:
                break
            await asyncio.sleep(0.05)
        assert await host.group_alive(spawned.pgid, spawned.start_time)
        assert await host.signal_group(spawned.pgid, signal.SIGKILL)
        for _ in range(50):
            if not await host.group_alive(spawned.pgid, spawned.start_time):
                break
            await asyncio.sleep(0.05)
        assert not await host.group_alive(spawned.pgid, spawned.start_time)
    finally:
        with contextlib.suppress(Exception):
            await host.signal_group(spawned.pgid, signal.SIGKILL)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())  # noqa: ASYNC240
    assert not await host.group_alive(pid_max + 1, "0")
