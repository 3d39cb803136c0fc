"""End to end on a simulated 8-GPU host (profiles/demo-8gpu.toml's host, GPUs 6-7 slower): `tunedash tune --slots N`
runs candidates side by side on disjoint GPU sets and ports, never two servers on one GPU or one port at once (the
sim's allocations and the job records, watched while it runs), each candidate with two or more launches on two or
more slots, the other slots' servers killed and their GPUs confirmed free at the end; a tune SIGKILLed with
launches in flight resumes (`--resume ID --slots N`) repeating no complete launch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from tests.helpers import REPO, kill_launched
from tests.slot_helpers import Watch, held_gpus, write_8gpu_profile

pytestmark = pytest.mark.slow

TUNE = """
[bench]
concurrency = 2
requests = 4
input_len = 16
output_len = 16
warmup = 0
[tune]
shapes = [{ concurrency = 1, requests = 1 }, { concurrency = 4, requests = 4 }]
max_launches = 6
[tune.flags]
speculative-num-steps = [1, 3, 4]
"""


@pytest.fixture
def host8(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(profile file, sim state) of an 8-GPU simulated host like demo-8gpu's, with a tiny [tune] table."""
    profile, state = write_8gpu_profile(tmp_path, TUNE)
    yield profile, state
    kill_launched(state)


def _env(data: Path) -> dict[str, str]:
    return {**os.environ, DATA_DIR_ENV: str(data), "PYTHONUNBUFFERED": "1"}


def _stored(data: Path) -> list[tuple[int, int, str, int | None]]:
    with HistoryStore(data / "history.sqlite3") as store:
        run = store.run(store.runs()[0].id)
    assert run is not None
    return [(ln.arm_idx or 0, ln.launch_idx, ln.outcome, None if ln.slot is None else ln.slot["index"])
            for ln in run.launches]


@pytest.mark.parametrize("slots", [4])
def test_slots_run_side_by_side_on_disjoint_gpus_and_ports(host8: tuple[Path, Path], tmp_path: Path,
                                                           slots: int) -> None:
    profile, state = host8
    data = tmp_path / "data"
    with Watch(state) as watch:
        done = subprocess.run([sys.executable, "-m", "app", "tune", str(profile), "--slots", str(slots), "--json"],
                              capture_output=True, text=True, timeout=300, cwd=REPO, env=_env(data))
    assert done.returncode == 0, done.stderr[-3000:]
    assert watch.samples > 20 and not watch.problems, watch.problems[:5]
    assert watch.most_servers >= 2  # they did run side by side
    result = json.loads(done.stdout)
    assert [s["index"] for s in result["slots"]["slots"]] == list(range(slots))
    assert result["slots"]["aa"]  # the A/A across slots is reported
    for i in range(1, slots):
        assert f"slot {i} (GPUs" in done.stderr and "confirmed free" in done.stderr
    launches = _stored(data)
    assert len(launches) == 6 and all(slot is not None for *_, slot in launches)
    per: dict[int, set[int]] = {}
    counts: dict[int, int] = {}
    for arm, _, outcome, slot in launches:
        assert outcome == "ready"
        assert slot is not None
        per.setdefault(arm, set()).add(slot)
        counts[arm] = counts.get(arm, 0) + 1
    for arm, n in counts.items():
        if n >= 2:
            assert len(per[arm]) >= 2, (arm, launches)
    # At the end only slot 0 (the profile's own GPUs 0-1) holds a live server.
    watch.sample()
    held = held_gpus(state)
    assert held <= {0, 1}, held


@pytest.mark.parametrize("again_slots", [2, 1])
def test_a_slotted_tune_killed_mid_run_resumes_without_repeating_a_launch(host8: tuple[Path, Path],
                                                                          tmp_path: Path, again_slots: int) -> None:
    """Resumed on 2 slots as before, or on 1: then the new launches are slot 0's, and the server the killed run left
    on slot 1 is killed and its GPUs confirmed free at the end (only the winner holds GPUs)."""
    profile, state = host8
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "app", "tune", str(profile), "--slots", "2"], cwd=REPO,
                            env=_env(data), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "launch 3/6 on slot" in line and "ready after" in line:  # one or two complete, one maybe in flight
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                break
        else:
            raise AssertionError("launch 3 did not come up:\n" + "".join(seen))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    with HistoryStore(data / "history.sqlite3") as store:
        run = store.runs()[0]
        before = store.run(run.id)
    assert before is not None and run.shown_status == "interrupted"
    shapes = 2
    complete_before = {(t.arm_idx, t.launch_idx) for t in before.trials
                       if sum(1 for u in before.trials if (u.arm_idx, u.launch_idx) == (t.arm_idx, t.launch_idx))
                       == shapes}
    trials_before = sorted((t.arm_idx, t.launch_idx, t.trial_idx, t.value) for t in before.trials)
    assert len(complete_before) >= 1 and all(ln.slot is not None for ln in before.launches)
    # --take-over: the SIGKILLed CLI's driver locks (one per slot) are stale only 5 s after its last heartbeat
    again = subprocess.run([sys.executable, "-m", "app", "tune", str(profile), "--slots", str(again_slots), "--resume",
                            str(run.id), "--take-over"], capture_output=True, text=True, timeout=300, cwd=REPO,
                           env=_env(data))
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"resuming run #{run.id}" in again.stdout
    numbers = [(int(n), int(of)) for n, of in re.findall(r"launch (\d+)/(\d+)", again.stdout)]
    assert numbers and all(n <= of for n, of in numbers), numbers  # a redone partial launch is not over the budget
    with HistoryStore(data / "history.sqlite3") as store:
        after = store.run(run.id)
    assert after is not None and after.status == "done"
    keys = [(ln.arm_idx, ln.launch_idx) for ln in after.launches]
    assert len(keys) == len(set(keys)), keys  # no launch number used twice
    trials_after = sorted((t.arm_idx, t.launch_idx, t.trial_idx, t.value) for t in after.trials)
    assert set(trials_before) <= set(trials_after)  # nothing measured lost
    for key in complete_before:  # no complete launch repeated: its trials are exactly the ones it had
        assert [x for x in trials_after if x[:2] == key] == [x for x in trials_before if x[:2] == key]
    counted = {(ln.arm_idx, ln.launch_idx) for ln in after.launches if ln.outcome == "ready"}
    complete_after = {k for k in counted if sum(1 for t in after.trials if (t.arm_idx, t.launch_idx) == k) == shapes}
    assert complete_before < complete_after  # the resume measured more, the launches kept
    new = [ln for ln in after.launches if (ln.arm_idx, ln.launch_idx) not in {(b.arm_idx, b.launch_idx)
                                                                                 for b in before.launches}]
    assert new and all(ln.slot is not None for ln in new)  # every launch keeps its slot, slot 0's on one slot
    if again_slots == 1:
        assert {ln.slot["index"] for ln in new if ln.slot is not None} == {0}
        assert "slot 1 (GPUs 2,3, port" in again.stdout and "confirmed free" in again.stdout, again.stdout[-2000:]
    assert held_gpus(state) <= {0, 1}  # only the winner, on slot 0, holds GPUs
