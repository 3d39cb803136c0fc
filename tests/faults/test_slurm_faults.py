"""Faults of a real Slurm (scripts/slurm-local) under a dashboard's Session on the simulated GPU host: the
allocation cancelled by someone else, its time limit reached mid-run, a step id that no longer names our step,
slurmctld stopped and started again. Each becomes states and events (never a traceback), nothing tunedash does
not own is signalled, and the server outlives what only touches the controller."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.connect import host_for
from app.core.data import ServerState
from app.core.hosts.base import ConnectionChanged, LeaderMismatch, LeaderProof
from app.core.hosts.slurm import SlurmHost
from app.core.profiles.loading import resolve_profile
from app.core.server import jobs
from app.core.server.events import LifecycleEvent
from app.core.session import Session
from tests.fakes import live_group_members
from tests.helpers import MakeProfile, until
from tests.slurm_local import SLURM_CONF, SLURM_DIR

pytestmark = pytest.mark.slow


class Running:
    """A READY server of a slurm:local profile under a Session, and every event it emitted."""

    def __init__(self, host: SlurmHost, session: Session) -> None:
        self.host, self.session = host, session
        self.seen: list[LifecycleEvent] = []
        session.subscribe(self.seen.append)

    def texts(self) -> str:
        return "\n".join(event.text for event in self.session.events)

    def changes(self, state: str) -> list[ConnectionChanged]:
        return [e for e in self.seen if isinstance(e, ConnectionChanged) and e.state == state]

    @property
    def record(self) -> jobs.JobRecord:
        assert self.session.lifecycle.record is not None
        return self.session.lifecycle.record


async def _running(profile_path: Path) -> Running:
    profile = resolve_profile(str(profile_path))
    host = host_for(profile)
    assert isinstance(host, SlurmHost)
    host.poll_s = 0.5
    running = Running(host, Session(host, profile, sample_period_ms=300))
    await running.session.start()
    await running.session.launch()
    assert await running.session.lifecycle.wait_ready(60) == ServerState.READY, running.texts()
    return running


@pytest.fixture
async def closing() -> AsyncIterator[list[Running]]:
    """Sessions to stop at the end; stopping never raises, whatever Slurm did to them."""
    made: list[Running] = []
    yield made
    for running in made:
        await running.session.stop()
        await running.host.close()


def _steps(job: int) -> dict[str, str]:
    out = subprocess.run(["squeue", "-h", "-s", "-j", str(job), "-o", "%i|%j"], capture_output=True, text=True)
    return dict(line.split("|", 1) for line in out.stdout.split())


async def test_the_job_cancelled_by_someone_else(slurm_profile: MakeProfile, closing: list[Running]) -> None:
    running = await _running(slurm_profile())
    closing.append(running)
    pgid, job = running.record.pgid, running.host.facts.job
    assert pgid is not None and job is not None
    subprocess.run(["scancel", str(job)], check=True)  # another shell of the user, or an admin  # noqa: ASYNC221 - a quick command of the test
    await until(lambda: running.changes("failed"), 30, "the allocation's end said", running.texts)
    await until(lambda: running.session.lifecycle.state == ServerState.CRASHED, 30, "CRASHED", running.texts)
    assert "ended: it was cancelled (scancel)" in running.texts()
    assert "ended (CANCELLED" in str(running.host.scheduler_line())
    await until(lambda: not live_group_members(pgid), 15, "the step's processes gone")
    # The next command asks for a new allocation instead of failing on the old one.
    again = host_for(running.session.profile)
    assert isinstance(again, SlurmHost)
    closing.append(Running(again, Session(again, running.session.profile)))
    new_job, _ = await again.where()
    assert new_job != job


async def test_the_time_limit_reached_mid_run(slurm_profile: MakeProfile, closing: list[Running]) -> None:
    running = await _running(slurm_profile(slurm='time = "1"'))  # one minute: Slurm's smallest limit
    closing.append(running)
    await until(lambda: "ends in" in running.texts(), 15, "the warning before the end", running.texts)
    await until(lambda: running.changes("failed"), 150, "the allocation's end said", running.texts)
    await until(lambda: running.session.lifecycle.state == ServerState.CRASHED, 30, "CRASHED", running.texts)
    assert "its time limit was reached" in running.texts()
    log = Path(running.record.log_path).read_text()  # noqa: ASYNC240
    assert "DUE TO TIME LIMIT" in log  # slurmstepd's own line, in the server's log where the person looks


async def test_a_step_id_that_no_longer_names_our_step(slurm_profile: MakeProfile, closing: list[Running]) -> None:
    running = await _running(slurm_profile())
    closing.append(running)
    record, job = running.record, running.host.facts.job
    assert record.pid is not None and record.pgid is not None
    other = subprocess.Popen(["srun", "--jobid", str(job), "--overlap", "-Q", "-J", "someone-else", "sleep", "300"])  # noqa: ASYNC220
    try:
        await until(lambda: "someone-else" in _steps(job or 0).values(), 15, "the other step")
        theirs = next(step for step, name in _steps(job or 0).items() if name == "someone-else")
        step_file = Path(running.host.state_dir) / "slurm" / "steps" / str(record.pid)
        ours = json.loads(step_file.read_text())
        step_file.write_text(json.dumps({**ours, "step": theirs}))  # the record now names their step
        proof = LeaderProof(record.pid, record.pgid, record.start_time, f"{jobs.TAG_ENV}={record.tag}")
        with pytest.raises(LeaderMismatch, match="not tunedash's"):
            await running.host.signal_proven_group(proof, signal.SIGKILL)
        assert not await running.host.signal_group(record.pgid, signal.SIGKILL)
        assert await jobs.signal_job(running.host, record, signal.SIGKILL) == []
        await asyncio.sleep(1.0)
        assert _steps(job or 0).get(theirs) == "someone-else" and other.poll() is None  # theirs untouched
        assert live_group_members(record.pgid)  # and ours too: nothing was signalled
        step_file.write_text(json.dumps(ours))
    finally:
        other.terminate()
        other.wait(10)


async def test_slurmctld_stopped_and_started_again(slurm_profile: MakeProfile, closing: list[Running]) -> None:
    running = await _running(slurm_profile())
    closing.append(running)
    pgid = running.record.pgid
    assert pgid is not None
    pid_file = SLURM_DIR / "run" / "slurmctld.pid"
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    try:
        await until(lambda: running.changes("lost"), 40, "slurmctld's loss said", running.texts)
        assert "slurmctld unreachable" in str(running.host.scheduler_line())
        await asyncio.sleep(3)
        assert running.session.lifecycle.state == ServerState.READY  # the server never depended on the controller
        assert live_group_members(pgid)
    finally:
        env = {**os.environ, "SLURM_CONF": str(SLURM_CONF)}
        for _ in range(50):  # the old one may still be saving its state
            if subprocess.run(["slurmctld", "-f", str(SLURM_CONF)], env=env, check=False).returncode == 0:  # noqa: ASYNC221
                break
            await asyncio.sleep(0.2)
    await until(lambda: [e for e in running.changes("connected") if e.since], 60, "slurmctld back",
                lambda: f"{running.texts()} {running.host.facts} {running.host._tasks.tasks}")
    assert "slurmctld answers again" in running.texts()
    assert running.session.lifecycle.state == ServerState.READY
    await running.session.kill()
    await until(lambda: running.session.lifecycle.state in (ServerState.FREE, ServerState.STOPPED), 60, "FREE",
                running.texts)
    await until(lambda: not live_group_members(pgid), 15, "the step's processes gone")
