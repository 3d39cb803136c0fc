"""The fleet on a cluster: a `slurm:local` profile's server is its row (READY, read through the real Slurm of
scripts/slurm-local), and every other tunedash step the scheduler lists for this user is a row of its own (step
id, node, time running); the fleet never asks for an allocation of its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from app.connect import fleet_hosts
from app.core.data import ServerState
from app.core.fleet import FleetPoller
from app.core.hosts.base import Host
from app.core.profiles.loading import resolve_profile
from tests.helpers import MakeProfile, tunedash, until

pytestmark = pytest.mark.slow


async def test_the_fleet_lists_the_profile_and_every_other_step(slurm_profile: MakeProfile, sim_state: Path) -> None:
    ours = slurm_profile(name="ours")
    launched = tunedash("launch", str(ours), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    job = (sim_state / "host" / "slurm" / "allocation").read_text().split()[0]
    # A server another profile file (or another machine) launched: a step of tunedash's name in the allocation.
    other = _start_step(job, "tunedash-0ther")
    await until(lambda: "tunedash-0ther" in _step_names(job).values(), 15, "the other step",
                lambda: f"{other.poll()} {_step_names(job)} {job}")
    step = next(s for s, name in _step_names(job).items() if name == "tunedash-0ther")
    jobs_before = _job_ids()

    members = fleet_hosts([resolve_profile(str(ours))])
    pairs: list[tuple] = [(profile, host) for profile, host in members if isinstance(host, Host)]
    poller = FleetPoller(pairs, look_period_s=0.5)
    poller.start()
    try:
        await until(lambda: any(r.profile == "ours" and r.state == ServerState.READY for r in poller.rows()), 30,
                    "our row READY", lambda: str(poller.rows()))
        await until(lambda: any(r.profile == f"step {step}" for r in poller.rows()), 30, "the other step's row",
                    lambda: str(poller.rows()))
        row = next(r for r in poller.rows() if r.profile == f"step {step}")
        assert "tunedash-0ther on " in row.error and row.host == "slurm:local"
        assert [r.profile for r in poller.rows()].count("ours") == 1  # our own step is not listed twice
    finally:
        await poller.stop()
        for _, host in pairs:
            await host.close()
        other.terminate()
        other.wait(10)
    assert _job_ids() == jobs_before  # the fleet asked for no allocation
    assert tunedash("kill", str(ours), "--confirm-free").returncode == 0


def _step_names(job: str) -> dict[str, str]:
    out = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i|%j"], capture_output=True, text=True).stdout
    return dict(line.split("|", 1) for line in out.split())


def _job_ids() -> list[str]:
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()


def _start_step(job: str, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["srun", "--jobid", job, "--overlap", "--mem=0", "-Q", "-J", name, "sleep", "120"])
