"""The host side of kill safety and records, on both hosts: LocalHost, and SshHost through the real loopback sshd
(logged in as the non-root test user). The proven signal refuses a leader with another start time or without
the tag and signals only the one proven; the tag is read from the environment and found by a scan; groups 0
and 1 are refused; the compare-and-swap write replaces a file only while it holds what was expected. Every
process signalled is one the test started."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import pytest

from app.core.hosts.base import Host, HostError, LeaderMismatch, LeaderProof
from app.core.hosts.local import LocalHost
from app.core.server import jobs


async def _gone(host: Host, pid: int) -> bool:
    for _ in range(100):
        if not [p for p in await host.processes() if p.pid == pid and p.state != "Z"]:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_the_proven_signal_reaches_only_the_proven_leader(host: Host, tmp_path: Path) -> None:
    tag = jobs.new_tag()
    spawned = await host.spawn_detached(["sleep", "300"], log_path=str(tmp_path / "a.log"), env={jobs.TAG_ENV: tag})
    line = f"{jobs.TAG_ENV}={tag}"
    try:
        assert await host.environ_value(spawned.pid, jobs.TAG_ENV) == tag
        assert await host.environ_value(spawned.pid, "TUNEDASH_NO_SUCH_VARIABLE") == ""
        assert spawned.pid in await host.find_env(line)
        if not isinstance(host, LocalHost):  # the SSH test user is not root: init's environment is not its own
            assert await host.environ_value(1, "PATH") is None
        other_start = str(int(spawned.start_time) + 1)
        for proof in (LeaderProof(spawned.pid, spawned.pgid, other_start, line),
                      LeaderProof(spawned.pid, spawned.pgid, spawned.start_time, f"{jobs.TAG_ENV}=not-{tag}")):
            with pytest.raises(LeaderMismatch):
                await host.signal_proven_group(proof, signal.SIGKILL)
        assert [p for p in await host.processes() if p.pid == spawned.pid and p.state != "Z"]
        proof = LeaderProof(spawned.pid, spawned.pgid, spawned.start_time, line)
        assert await host.signal_proven_group(proof, signal.SIGTERM)
        assert await _gone(host, spawned.pid)
        assert not await host.signal_proven_group(proof, signal.SIGTERM)  # gone: False, never another process
        assert await host.environ_value(spawned.pid, jobs.TAG_ENV) is None
    finally:
        with contextlib.suppress(HostError):
            await host.signal_group(spawned.pgid, signal.SIGKILL)


async def test_the_tag_scan_finds_a_job_caught_starting_up(host: Host, tmp_path: Path) -> None:
    """Asked right after the spawn, while the job is still exec'ing from `sh` through `env` to its program (its
    environment reads empty for a moment then): the scan finds it every time. Without the second read this
    missed about one start in a hundred here, and a "launching" record went unadopted."""
    rounds = 150 if isinstance(host, LocalHost) else 30
    missed = []
    for index in range(rounds):
        tag = jobs.new_tag()
        spawned = await host.spawn_detached(["sleep", "30"], log_path=str(tmp_path / "s.log"), env={jobs.TAG_ENV: tag})
        try:
            if spawned.pid not in await host.find_env(f"{jobs.TAG_ENV}={tag}"):
                missed.append(index)
        finally:
            with contextlib.suppress(HostError):
                await host.signal_group(spawned.pgid, signal.SIGKILL)
    assert missed == []


async def test_groups_0_and_1_are_refused(host: Host) -> None:
    for pgid in (0, 1):
        with pytest.raises(HostError, match="refusing to signal process group"):
            await host.signal_group(pgid, 0)


async def test_the_boot_identity_is_this_machine(host: Host) -> None:
    identity = await host.boot_identity()
    assert identity.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()  # noqa: ASYNC240
    assert identity.hostname


async def test_the_swap_replaces_a_file_only_while_it_holds_what_was_expected(host: Host, tmp_path: Path) -> None:
    path = str(tmp_path / "state" / "jobs" / "s.json")
    assert await host.swap_text(path, "one", expect=None)
    assert not await host.swap_text(path, "two", expect=None)  # it exists now
    assert not await host.swap_text(path, "two", expect="zero")
    assert await host.read_text(path) == "one"
    assert await host.swap_text(path, "two", expect="one")
    assert await host.read_text(path) == "two"
    left = sorted(p.name for p in (tmp_path / "state" / "jobs").iterdir())
    assert left == ["s.json", "s.json.lock"]
