"""`tune --slots 3` on a slurm: profile through the real one-node Slurm of scripts/slurm-local (GRES gpu:2):
slot 0 is the job the profile attaches to (one GPU), slot 1 asks for its own allocation and gets the node's other
GPU, slot 2 is not granted within its deadline (no GPU left) and is left out with a note while the run goes on.
A candidate runs on each granted slot at once; at the end slot 1's allocation is given back and the attached job
stays (docs/architecture.md#tune---slots-n-over-several-allocations-built)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from app.core.measure.store import HistoryStore
from tests.helpers import MakeProfile, tunedash

pytestmark = pytest.mark.slow

TUNE = """
[tune]
shapes = [{ concurrency = 1, requests = 2 }]
max_launches = 2
[tune.flags]
speculative-num-steps = [1, 3]
"""


def _jobs() -> dict[str, tuple[str, str]]:
    """squeue's jobs: id -> (name, state)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], capture_output=True, text=True, check=True).stdout
    return {job: (name, state) for job, name, state in (line.split("|") for line in out.split())}


def test_tune_slots_over_allocations(slurm_profile: MakeProfile, sim_state: Path, own_history: Path) -> None:
    granted = subprocess.run(["salloc", "--no-shell", "-N1", "-J", "attached", "--gpus=1", "--time=30"],
                             capture_output=True, text=True, check=True)
    attached = granted.stderr.split("Granted job allocation ")[1].split()[0]
    try:
        profile = slurm_profile(slurm=f"job = {attached}", extra=TUNE)
        text = profile.read_text().replace("gpus = [0, 1]", "gpus = [0]").replace("tp-size = 2", "tp-size = 1")
        profile.write_text(text.replace("sim/qwen3.6-27b", "sim/llama-3.1-8b"))  # one slot, one GPU: a model it holds
        run = tunedash("tune", str(profile), "--slots", "3", "--grant-deadline", "5", "--json", timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert re.search(r"slot [12] left out: no allocation granted within 5 s", run.stderr + run.stdout)
        result = json.loads(run.stdout)
        assert [row["index"] for row in result["slots"]["slots"]] == [0, 1]
        assert "given back (scancel" in run.stderr

        with HistoryStore(own_history / "history.sqlite3") as store:
            row = store.run(result["run_id"])
        assert row is not None and row.status == "done"
        assert sorted((ln.slot or {}).get("index") for ln in row.launches) == [0, 1]
        assert [(ln.slot or {}).get("gpus") for ln in sorted(row.launches, key=lambda ln: (ln.slot or {})["index"])] \
            == [[0], [1]]  # each slot on its own allocation's GPU (GRES IDX)
        # a candidate on each at once: each launch started before the other's measurement ended
        measured = {t.arm_idx: t.at for t in row.trials}
        a, b = row.launches
        assert a.at < measured[b.arm_idx] and b.at < measured[a.arm_idx], (a.at, b.at, measured)

        jobs = _jobs()
        assert jobs.get(attached) == ("attached", "RUNNING")  # the attached job stays
        assert not [j for j, (name, _) in jobs.items() if name.startswith("tunedash@slot")]  # ours given back
    finally:
        subprocess.run(["scancel", "-n", "tunedash@slot1,tunedash@slot2"], check=False)
        subprocess.run(["scancel", attached], check=False)
