"""End to end on the simulated host: `tunedash ab` runs two launches per arm (A B B A) and finds steps 3 faster
than steps 1 from the launches;
`tunedash bench` counts exactly the tokens the server generated; a SIGKILLed or Ctrl-C'd `tunedash ab`
keeps its finished trials intact in the history; `tunedash export` reproduces the table."""

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

SMALL = ["--requests", "6", "--concurrency", "3", "--max-tokens", "48", "--input-len", "32", "--warmup", "1"]


def _run(data: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, DATA_DIR_ENV: str(data)}
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


def _metric(port: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_ab_steps_1_vs_3_then_bench_and_export(make_profile: MakeProfile, tmp_path: Path):
    profile = make_profile(startup_s=0.4, extra="", steps=1)
    text = profile.read_text().replace("decode-log-interval = 40", "decode-log-interval = 10\nenable-metrics = true")
    profile.write_text(text)
    port = int(next(line.split("=")[1] for line in text.splitlines() if line.startswith("port")))
    data = tmp_path / "data"

    # one stream: where speculation pays most (the speed model's ~1.45x); at concurrency 3 on a loaded 2-core
    # machine the simulator's own CPU work per draft token made steps 3 come out as slow as steps 1 in 1 run of 5
    one_stream = [x if i == 0 or SMALL[i - 1] != "--concurrency" else "1" for i, x in enumerate(SMALL)]
    done = _run(data, "ab", str(profile), "--a", "speculative-num-steps=1", "--b", "speculative-num-steps=3",
                "--launches", "2", "--trials", "2", *one_stream, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    a, b = result["arms"]
    assert (a["n"], b["n"]) == (4, 4) and a["errors"] == b["errors"] == 0
    assert a["launches"] == b["launches"] == 2 and len(a["launch_values"]) == len(b["launch_values"]) == 2
    assert a["output_tokens"] == b["output_tokens"] == 2 * 2 * 6 * 48  # usage counts, warm-up excluded
    assert result["ratio"] > 1.15, result  # steps 3 is faster (the speed model: about 1.4x at this shape)
    assert result["comparisons"][0]["df"] == 2.0
    # The launch-level interval says so, unless the launch-to-launch spread is too wide for 2 launches per arm (on
    # a loaded 2-core machine one launch of an arm ran ~25% off its other, about 1 run in 5): then the verdict
    # must say that nothing can be claimed yet, and how many more launches would resolve it.
    if result["ratio_ci"][0] > 1.0:
        assert result["verdict"].startswith("B is") and "faster" in result["verdict"], result["verdict"]
    else:
        assert result["verdict"].startswith("no difference detectable"), result["verdict"]
        assert "launches per arm" in result["verdict"], result["verdict"]
    assert b["accept_len"] > a["accept_len"] > 1.0
    with HistoryStore(data / "history.sqlite3") as store:
        run = store.run(result["run_id"])
        assert run is not None and run.status == "done"
        assert [(ln.arm_idx, ln.launch_idx, ln.outcome) for ln in run.launches] == [
            (0, 0, "ready"), (1, 0, "ready"), (1, 1, "ready"), (0, 1, "ready")]  # a relaunch per launch
        assert run.launches[1].server_flags is not None
        assert run.launches[1].server_flags["speculative_num_steps"] == 3  # the server's own view
        assert [len(v) for v in run.trials_by_launch(1)] == [2, 2]


    # the server keeps running with the last launch's arm (A B B A: A): bench it and compare with the server's
    # own token counter
    before = _metric(port, "sglang:generation_tokens_total")
    bench = _run(data, "bench", str(profile), *SMALL, "--json")
    assert bench.returncode == 0, bench.stderr
    summary = json.loads(bench.stdout)
    after = _metric(port, "sglang:generation_tokens_total")
    assert summary["output_tokens"] == 6 * 48
    assert after - before == summary["output_tokens"] + 1 * 48  # + the warm-up request
    assert summary["usage_missing"] == 0 and summary["accept_len"] is not None

    md = _run(data, "export", str(result["run_id"]), "--format", "md")
    assert md.returncode == 0
    for arm in (a, b):
        assert f"| {arm['label']} | {arm['overrides']} | 2x2 | {arm['mean']:.1f} |" in md.stdout
    assert f"**Verdict:** {result['verdict']}" in md.stdout
    exported = json.loads(_run(data, "export", str(result["run_id"]), "--format", "json").stdout)
    assert exported["ratio_ci"] == result["ratio_ci"] and exported["arms"][1]["trials"] == b["trials"]
    history = json.loads(_run(data, "history", "--json").stdout)
    assert [h["kind"] for h in history] == ["bench", "ab"]


def _start_ab(data: Path, profile: Path) -> subprocess.Popen[str]:
    env = {**os.environ, DATA_DIR_ENV: str(data), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "app", "ab", str(profile), "--a", "speculative-num-steps=1", "--b",
         "speculative-num-steps=2", "--launches", "2", "--trials", "3", *SMALL],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait_for_trials(proc: subprocess.Popen[str], count: int, timeout: float = 120) -> list[str]:
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if f"[{count}/12]" in line and "trial" in line:
            return seen
    raise AssertionError("trials did not finish:\n" + "".join(seen))


@pytest.mark.parametrize("how", ["sigkill", "ctrl-c"])
def test_interrupted_ab_keeps_finished_trials(make_profile: MakeProfile, tmp_path: Path, how: str):
    profile = make_profile(startup_s=0.4)
    data = tmp_path / "data"
    proc = _start_ab(data, profile)
    try:
        _wait_for_trials(proc, 4)  # A's first launch and B's first trial
        if how == "sigkill":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with HistoryStore(data / "history.sqlite3") as store:
        assert store.integrity_ok()
        run = store.runs()[0]
        detail = store.run(run.id)
        assert detail is not None
        assert len(detail.values(0)) == 3 and len(detail.values(1)) >= 1
        assert all(len([r for r in store.request_rows(run.id) if r.arm_idx == t.arm_idx
                        and r.launch_idx == t.launch_idx and r.trial_idx == t.trial_idx]) == 6
                   for t in detail.trials)
        if how == "sigkill":
            assert proc.returncode == -signal.SIGKILL and run.status == "running"
        else:
            assert proc.returncode == 130 and run.status == "cancelled"
            assert "finished trials are kept" in out
    history = _run(data, "history")
    assert ("interrupted" if how == "sigkill" else "cancelled") in history.stdout
    md = _run(data, "export", str(run.id), "--format", "md")
    assert md.returncode == 0 and "| A | speculative-num-steps=1 | 1x3 |" in md.stdout
