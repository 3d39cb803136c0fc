"""The dashboard's Session over SSH against the simulated host behind a real sshd: re-attach after a restart,
recovery after the sshd session is killed mid-stream (stale, then live again, the server untouched, no streams
left behind on the host), and who drives (read-only for a second person, take-over noticed by the first)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from app.core.data import ServerState
from app.core.hosts.base import ConnectionChanged
from app.core.hosts.ssh import SshHost
from app.core.profiles.loading import resolve_profile
from app.core.profiles.types import Profile
from app.core.server.events import LifecycleEvent, StateChanged
from app.core.session import Session
from app.sim.host_env import sim_environment
from tests.helpers import until
from tests.integration.sshd import Sshd

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def make_host(profile: Profile, server: Sshd) -> SshHost:
    state = Path(str(profile.sim_state))
    return SshHost(profile.host, extra_env=sim_environment(state), state_dir=str(state / "host"),
                   options=server.options(), backoff_s=(0.3, 2.0))


def cmdlines_with(text: str, env_text: str = "") -> list[int]:
    """Live programs (not their wrapping shells) whose command line contains text (and environment env_text)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if env_text and env_text.encode() not in (entry / "environ").read_bytes():
                    continue
            except OSError:
                continue
            program = raw.split(b"\0")[0].rsplit(b"/", 1)[-1]
            if text.encode() in raw and state != "Z" and program not in (b"sh", b"bash", b"dash", b"env"):
                found.append(int(entry.name))  # the program itself, not the shells that started it
    return found


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def texts(session: Session) -> str:
    return "\n".join(event.text for event in session.events)


async def test_reattach_recover_and_take_over(sshd: Sshd, ssh_profile) -> None:
    profile = resolve_profile(str(ssh_profile(name="remote-session")))
    first_host = make_host(profile, sshd)
    first = Session(first_host, profile, sample_period_ms=200)
    await first.start()
    await first.launch()
    assert await first.lifecycle.wait_ready(60) == ServerState.READY
    assert first.lifecycle.record is not None
    pid, log_path = first.lifecycle.record.pid, first.lifecycle.record.log_path
    await first.stop()
    await first_host.close()

    # The dashboard restarts: a new connection re-attaches to the recorded job.
    host = make_host(profile, sshd)
    seen: list[LifecycleEvent] = []
    session = Session(host, profile, sample_period_ms=200)
    session.subscribe(seen.append)
    await session.start()
    assert "re-attached to pid" in texts(session)
    assert await session.lifecycle.wait_ready(30) == ServerState.READY
    await until(lambda: session.snapshot is not None and session.snapshot.error is None and bool(session.snapshot.gpus))
    assert session.connection is not None and session.connection.state == "connected"

    # Kill the per-connection sshd mid-stream.
    assert sshd.drop_connections() >= 1
    await until(lambda: any(isinstance(e, ConnectionChanged) and e.state == "lost" for e in seen), 15)
    await until(lambda: session.snapshot is not None and session.snapshot.error is not None, 15)  # stale, not old
    assert alive(pid)  # the server is untouched by the disconnect
    await until(lambda: any(isinstance(e, ConnectionChanged) and e.state == "connected" and e.since for e in seen), 30)
    await until(lambda: session.snapshot is not None and session.snapshot.error is None and bool(session.snapshot.gpus))
    assert session.lifecycle.state == ServerState.READY
    assert not any(isinstance(e, StateChanged) and e.state == ServerState.CRASHED for e in seen)
    assert "lost" in texts(session) and "reconnected" in texts(session)
    await asyncio.sleep(1.0)
    # Streams of the dead connection did not pile up: one follower per reader, one nvidia-smi loop.
    assert len(cmdlines_with(log_path)) <= 2
    assert len(cmdlines_with("-lms", f"TUNEDASH_SIM_STATE={profile.sim_state}")) <= 1

    # A second dashboard of the same account (the shared tmux case) opens read-only and says who drives.
    watcher = Session(host, profile, sample_period_ms=500)
    await watcher.start()
    assert watcher.readonly and f"read-only: {session.driver.who} (dashboard" in texts(watcher), texts(watcher)
    await watcher.stop()
    # --take-over makes another dashboard the driver; the first learns of it within 2 s and turns read-only.
    taker = Session(host, profile, sample_period_ms=500, take_over=True)
    await taker.start()
    assert not taker.readonly and f"took over from {session.driver.who} (dashboard" in texts(taker), texts(taker)
    await until(lambda: session.readonly, 3)
    assert "took over; this dashboard is now read-only" in texts(session)
    await taker.stop()
    await session.stop()
    await host.close()
    # Quitting never touched the server.
    assert alive(pid)


async def test_a_follower_ends_when_its_host_is_closed(sshd: Sshd) -> None:
    """close() with a log follower still running: the follower ends with HostClosed instead of waking at once,
    forever, on a connection that will never come back (before: a busy loop of failed commands)."""
    from app.core.hosts.ssh import HostClosed

    folder = Path(tempfile.mkdtemp(prefix="tunedash-follow-"))  # the SSH test user reads it (pytest's is private)
    folder.chmod(0o777)  # noqa: ASYNC240 - test setup, before any task runs
    path = folder / "log.txt"
    path.write_text("one\n")
    path.chmod(0o666)
    host = SshHost(sshd.spec, state_dir=str(folder / "state"), options=sshd.options())
    seen: list[str] = []
    calls = 0
    real_connection = host._connection

    async def counted():  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return await real_connection()

    host._connection = counted  # type: ignore[method-assign]

    async def follow() -> None:
        async for line in host.follow(str(path)):
            seen.append(line)

    task = asyncio.create_task(follow())
    await until(lambda: seen == ["one"], 10, "the first line")
    await host.close()
    with pytest.raises(HostClosed):
        await asyncio.wait_for(task, 5)
    before = calls
    await asyncio.sleep(0.3)
    assert calls == before  # nothing keeps asking for the connection
    shutil.rmtree(folder, ignore_errors=True)
