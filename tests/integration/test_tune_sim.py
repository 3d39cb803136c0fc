"""End to end on the simulated host: `tunedash tune` races a [tune] space over request shapes; a tune SIGKILLed
between a launch and its trials resumes (`--resume ID`) re-doing only that launch, every finished launch kept as it
was; `--dry-run` lists the candidates and drops the ones the installed server rejects, with discovery's reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from tests.helpers import REPO, MakeProfile

pytestmark = pytest.mark.slow

TUNE = """
[bench]
concurrency = 2
requests = 4
input_len = 32
output_len = 24
warmup = 1
[tune]
shapes = [{ concurrency = 1, requests = 2 }, { concurrency = 4, requests = 4 }]
max_launches = 4
[tune.flags]
speculative-num-steps = [1, 3]
"""


def _env(data: Path) -> dict[str, str]:
    return {**os.environ, DATA_DIR_ENV: str(data), "PYTHONUNBUFFERED": "1"}


def _run(data: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=_env(data))


def _kill_after_ready(data: Path, profile: Path, launch: int) -> list[str]:
    """Start `tune`, SIGKILL it the moment launch `launch` reports ready (before that launch's trials)."""
    proc = subprocess.Popen([sys.executable, "-m", "app", "tune", str(profile)], cwd=REPO, env=_env(data),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if f"launch {launch}/4:" in line and "ready after" in line:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                return seen
        raise AssertionError("the launch did not come up:\n" + "".join(seen))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_tune_killed_between_a_launch_and_its_trials_resumes_without_repeating(make_profile: MakeProfile,
                                                                                  tmp_path: Path) -> None:
    profile = make_profile(startup_s=0.3, extra=TUNE)
    data = tmp_path / "data"
    _kill_after_ready(data, profile, 2)
    with HistoryStore(data / "history.sqlite3") as store:
        run = store.runs()[0]
        before = store.run(run.id)
    assert before is not None and run.kind == "tune" and run.shown_status == "interrupted"
    assert [(ln.arm_idx, ln.launch_idx, ln.outcome) for ln in before.launches] == [(0, 0, "ready"), (1, 0, "ready")]
    first = [(t.arm_idx, t.launch_idx, t.trial_idx, t.value) for t in before.trials if t.arm_idx == 0]
    assert [t[:3] for t in first] == [(0, 0, 0), (0, 0, 1)]  # launch 1 measured both shapes
    assert len([t for t in before.trials if t.arm_idx == 1]) < 2  # launch 2 came up, its trials did not all land

    resumed = _run(data, "tune", str(profile), "--resume", str(run.id), "--take-over", "--json")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["run_id"] == run.id and result["status"] == "done"
    assert result["launches"]["redone_partial"] == 1
    with HistoryStore(data / "history.sqlite3") as store:
        after = store.run(run.id)
    assert after is not None and after.status == "done"
    # nothing measured lost: launch 1's trials are the same rows; the partial launch 2 stays, under its number
    assert [(t.arm_idx, t.launch_idx, t.trial_idx, t.value) for t in after.trials
            if (t.arm_idx, t.launch_idx) == (0, 0)] == first
    launches = [(ln.arm_idx, ln.launch_idx) for ln in after.launches]
    assert launches[:2] == [(0, 0), (1, 0)] and len(launches) == len(set(launches))  # no launch number twice
    # only launch 2 was re-done (as candidate 1's launch 1), then the race went on from the 1 + 1 kept launches
    assert launches[2] == (1, 1)
    complete = {(t.arm_idx, t.launch_idx) for t in after.trials if t.launch_idx is not None}
    full = [key for key in complete if sum(1 for t in after.trials if (t.arm_idx, t.launch_idx) == key) == 2]
    assert result["launches"]["spent"] == len(full) == len(launches) - 1
    assert sum(c["launches"] for c in result["candidates"]) == result["launches"]["spent"]
    assert result["ended_on"]  # the CLI says what the server runs at the end
    exported = json.loads(_run(data, "export", str(run.id), "--format", "json").stdout)
    assert exported["launches"] == result["launches"] and exported["verdict"] == result["verdict"]


def test_dry_run_lists_candidates_and_drops_what_the_server_rejects(make_profile: MakeProfile,
                                                                   tmp_path: Path) -> None:
    profile = make_profile(extra='sim_version = "0.5.23"\n' + TUNE + "enforce-piecewise-cuda-graph = [false, true]\n")
    done = _run(tmp_path / "data", "tune", str(profile), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [c["label"] for c in listed["candidates"]] == ["steps=1 pcg=off", "steps=3 pcg=off"]
    assert [d["label"] for d in listed["dropped"]] == ["steps=1 pcg=on", "steps=3 pcg=on"]
    assert all("SGLang 0.5.23" in d["why"] and "--enforce-piecewise-cuda-graph" in d["why"]
               and "--cuda-graph-backend-prefill breakable" in d["why"] for d in listed["dropped"])
    assert listed["budget"] == {"max_launches": 4, "time_budget_s": None, "first_round": 2, "grid_one_launch": 2,
                                "grid_two_launch": 4}
    text = _run(tmp_path / "data", "tune", str(profile), "--dry-run")
    assert "nothing was launched (--dry-run)" in text.stdout and "dropped (2):" in text.stdout
    assert not (tmp_path / "data" / "history.sqlite3").exists() or not HistoryStore(
        tmp_path / "data" / "history.sqlite3").runs()  # a dry run stores nothing


def test_a_profile_without_a_tune_table_is_told_what_to_add(make_profile: MakeProfile, tmp_path: Path) -> None:
    done = _run(tmp_path / "data", "tune", str(make_profile()), "--dry-run")
    assert done.returncode == 2 and "has no [tune] table" in done.stderr and "[tune.flags]" in done.stderr


def test_candidates_that_never_come_up_leave_the_race_and_the_exit_says_so(make_profile: MakeProfile,
                                                                           tmp_path: Path) -> None:
    profile = make_profile(startup_s=0.2, fault="crash_loading", extra=TUNE)
    done = _run(tmp_path / "data", "tune", str(profile), "--json")
    assert done.returncode == 4, done.stderr  # the server failed to start, as `launch` says it
    assert "no launch of t came up with a measurement (4 launches)" in done.stderr
    result = json.loads(done.stdout)
    assert result["launches"]["spent"] == result["launches"]["failed"] == 4
    assert result["why_done"] == "no candidate left: every one was eliminated"
    assert all(not c["alive"] and c["why_out"] == "2 launches gave no trial value at any shape"
               for c in result["candidates"])
    assert "no winner" in result["ended_on"]
    with HistoryStore(tmp_path / "data" / "history.sqlite3") as store:
        run = store.run(store.runs()[0].id)
    assert run is not None and [ln.outcome for ln in run.launches] == ["crashed"] * 4 and not run.trials


def test_restore_ends_on_the_starting_config_and_says_so(make_profile: MakeProfile, tmp_path: Path) -> None:
    profile = make_profile(startup_s=0.3, extra=TUNE)
    done = _run(tmp_path / "data", "tune", str(profile), "--restore", "--launches", "2", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    first, second = result["candidates"]
    assert (first["label"], first["source"], first["launches"]) == ("steps=1", "running = space", 1)
    assert (second["label"], second["launches"]) == ("steps=3", 1)  # the last launch ran steps 3
    assert result["ended_on"] == "steps=1 (the starting config (--restore))"
    status = json.loads(_run(tmp_path / "data", "status", str(profile), "--json").stdout)
    assert status["state"] == "READY" and status["flags"]["speculative-num-steps"] == 1
