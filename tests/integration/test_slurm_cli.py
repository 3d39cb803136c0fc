"""The headless CLI through a real Slurm (scripts/slurm-local) on the simulated GPU host: a `slurm:local` profile
asks for an allocation once (salloc --no-shell), every command after it reuses it; launch is a job step and
READY comes from its log, the GPUs are read by an `srun --overlap nvidia-smi` step, relaunch and kill go through
`scancel J.STEP` of the recorded step, FREE is proven on the node; bench and A/B run unchanged through it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from app.core.measure.store import HistoryStore
from tests.fakes import live_group_members
from tests.helpers import MakeProfile, tunedash

pytestmark = pytest.mark.slow
SMALL = ["--requests", "4", "--concurrency", "2", "--max-tokens", "32", "--input-len", "16", "--warmup", "1"]


def _record(sim_state: Path, name: str = "t") -> dict:
    return json.loads(next((sim_state / "host" / "jobs").glob(f"{name}-*.json")).read_text())


def _steps(job: str) -> dict[str, str]:
    """squeue's steps of the job: id -> name."""
    out = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i|%j"], capture_output=True, text=True).stdout
    return dict(line.split("|", 1) for line in out.split())


def test_the_loop_through_slurm(slurm_profile: MakeProfile, sim_state: Path, tmp_path: Path) -> None:
    profile = slurm_profile()
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "ready" in launched.stdout
    job = (sim_state / "host" / "slurm" / "allocation").read_text().split()[0]
    record = _record(sim_state)
    step = json.loads((sim_state / "host" / "slurm" / "steps" / str(record["pid"])).read_text())
    assert step["step"].startswith(job + ".") and _steps(job).get(step["step"]) == f"tunedash-{record['tag']}"

    gpus = json.loads(tunedash("gpus", str(profile), "--json").stdout)
    assert all(gpu["memory_used_mib"] > 40000 for gpu in gpus["gpus"])
    assert json.loads(tunedash("status", str(profile), "--json").stdout)["state"] == "READY"

    relaunched = tunedash("relaunch", str(profile), "--set", "speculative-num-steps=3")
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    assert step["step"] not in _steps(job)  # the old step was scancel'ed, the allocation kept
    new = _record(sim_state)
    assert new["flags"]["speculative-num-steps"] == 3 and new["pid"] != record["pid"]

    bench = tunedash("bench", str(profile), *SMALL, "--json", timeout=120)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert json.loads(bench.stdout)["output_tokens"] == 4 * 32

    ab = tunedash("ab", str(profile), "--a", "speculative-num-steps=1", "--b", "speculative-num-steps=3",
                  "--launches", "1", "--trials", "1", *SMALL, "--json", timeout=240)
    assert ab.returncode == 0, ab.stdout + ab.stderr
    arms = json.loads(ab.stdout)["arms"]
    assert [arm["errors"] for arm in arms] == [0, 0] and all(arm["n"] == 1 for arm in arms)

    last = _record(sim_state)
    killed = tunedash("kill", str(profile), "--confirm-free")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "GPU0 0 MiB, GPU1 0 MiB" in killed.stdout
    last_step = json.loads((sim_state / "host" / "slurm" / "steps" / str(last["pid"])).read_text())["step"]
    assert f"scancel --signal=TERM {last_step} (the server's step on" in killed.stdout  # what really happened
    assert live_group_members(last["pgid"]) == []
    assert not [name for name in _steps(job).values() if name.startswith("tunedash-")]  # no step left behind
    assert subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip() \
        == "RUNNING"  # kill ends the server's step, never the allocation


def test_ab_refuses_a_launch_the_allocation_cannot_hold(slurm_profile: MakeProfile) -> None:
    """A one-minute allocation has under FIRST_LAUNCH_MIN_S left: the A/B stops before its first launch and says
    why, instead of starting a launch the time limit would cut short."""
    profile = slurm_profile(slurm='time = "1"')
    ab = tunedash("ab", str(profile), "--a", "speculative-num-steps=1", "--b", "speculative-num-steps=3",
                  "--launches", "1", "--trials", "1", *SMALL, timeout=120)
    assert ab.returncode != 0
    assert "the allocation on slurm:local ends in" in ab.stdout + ab.stderr and "[slurm] time" in ab.stdout + ab.stderr


TUNE = """
[bench]
concurrency = 2
requests = 4
input_len = 16
output_len = 16
warmup = 1
[tune]
shapes = [{ concurrency = 1, requests = 2 }, { concurrency = 2, requests = 2 }]
max_launches = 2
[tune.flags]
speculative-num-steps = [1, 3]
"""


def test_tune_stops_before_a_launch_the_allocation_cannot_hold_and_resumes_on_a_new_one(
        slurm_profile: MakeProfile, sim_state: Path, own_history: Path) -> None:
    """A one-minute allocation cannot hold a launch: tune stops before it, "stopped: allocation ending", the run
    kept; `--resume ID` with a longer allocation (a new job) goes on and finishes it."""
    profile = slurm_profile(slurm='time = "1"', extra=TUNE)
    stopped = tunedash("tune", str(profile), timeout=120)
    out = stopped.stdout + stopped.stderr
    assert stopped.returncode != 0, out
    assert "stopped: allocation ending. candidate " in out and "the allocation on slurm:local ends in" in out
    assert "ready after" not in out  # no launch was started
    run_id = int(out.split("--resume ")[1].split("`")[0])
    with HistoryStore(own_history / "history.sqlite3") as store:
        row = store.run(run_id)
    assert row is not None and row.status == "stopped" and row.summary["resumable"] is True

    first = (sim_state / "host" / "slurm" / "allocation").read_text().split()[0]
    subprocess.run(["scancel", first], check=True)
    profile.write_text(profile.read_text().replace('time = "1"', 'time = "30"'))
    resumed = tunedash("tune", str(profile), "--resume", str(run_id), "--launches", "1", timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming run #{run_id}" in resumed.stdout
    assert (sim_state / "host" / "slurm" / "allocation").read_text().split()[0] != first  # a new job
    with HistoryStore(own_history / "history.sqlite3") as store:
        row = store.run(run_id)
    assert row is not None and row.status == "done"
    assert [ln.outcome for ln in row.launches] == ["ready"] and len(row.trials) == 2  # one launch, both shapes
