"""`tunedash advise` end to end on the simulated host, in both SGLang releases it speaks: bench at 3 steps (the
history), relaunch at 1 step, and the advice names the best run's 3 steps with its tok/s, the server's 1, and
the prefill graph SGLang switched off, with its evidence and the release's own flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.measure.store import DATA_DIR_ENV
from tests.helpers import REPO, MakeProfile

pytestmark = pytest.mark.slow

BENCH = "[bench]\nconcurrency = 2\nrequests = 6\ninput_len = 32\noutput_len = 48\nwarmup = 1\n"


def _run(data: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, DATA_DIR_ENV: str(data)}
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


@pytest.mark.parametrize(("version", "graph_fix", "evidence"), [
    ("0.5.10", {"enforce-piecewise-cuda-graph": True},
     "/model_info architectures=['Qwen3_5ForConditionalGeneration'], has_image_understanding=True"),
    ("0.5.23", {"cuda-graph-backend-prefill": "breakable"},
     "Breakable CUDA graph is incompatible with multimodal model; disabling prefill CUDA graph."),
])
def test_advise_after_a_slower_relaunch(make_profile: MakeProfile, tmp_path: Path, version: str,
                                        graph_fix: dict[str, object], evidence: str) -> None:
    profile = str(make_profile(steps=3, startup_s=0.4, extra=f'sim_version = "{version}"\n{BENCH}'))
    data = tmp_path / "data"
    launched = _run(data, "launch", profile, "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    bench = _run(data, "bench", profile, "--json")
    assert bench.returncode == 0, bench.stderr
    bench_tps = json.loads(bench.stdout)["output_tok_s"]
    relaunched = _run(data, "relaunch", profile, "--set", "speculative-num-steps=1")
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr

    done = _run(data, "advise", profile, "--json")
    assert done.returncode == 0, done.stderr
    advice = json.loads(done.stdout)
    assert advice["version"] == version
    assert advice["running_flags"]["speculative-num-steps"] == 1
    reference = advice["reference"]
    assert reference["kind"] == "bench" and reference["flags"]["speculative-num-steps"] == 3
    assert reference["output_tok_s"] == pytest.approx(bench_tps, abs=1e-3)
    steps = advice["slower_than_before"][0]
    assert steps["rule"] == "history:speculative-num-steps" and steps["fix"] == {"speculative-num-steps": 3}
    assert any(f"{bench_tps:.1f} tok/s" in line for line in steps["evidence"])
    assert "the server runs 1" in steps["what"]

    rules = {f["rule"]: f for f in advice["left_on_table"]}
    graph = rules["prefill_graph_auto_disabled"]
    assert graph["status"] == "fix" and graph["fix"] == graph_fix
    assert any(evidence in line for line in graph["evidence"]), graph["evidence"]
    assert "multimodal" in graph["what"], graph["what"]  # 0.5.10: from /model_info; 0.5.23: from its notice
    assert rules["single_batch_overlap_off"]["fix"] == {"enable-single-batch-overlap": True}
    for gpu_rule in ("flashinfer_allreduce_fusion", "nccl_nvls"):
        finding = rules[gpu_rule]
        assert finding["fix"] is None  # the sim's default GPUs: 2 x RTX A6000, SM 8.6, PCIe
        assert finding["status"] == "nothing_to_do" and "SM 8.6" in finding["nothing_to_do"], finding

    text = _run(data, "advise", profile)
    assert text.returncode == 0, text.stderr
    assert "Slower than before?" in text.stdout and "Left on the table" in text.stdout
    assert f"history run #{reference['run_id']} (bench)" in text.stdout


def test_advise_with_nothing_running_exits_2(make_profile: MakeProfile, tmp_path: Path) -> None:
    done = _run(tmp_path / "data", "advise", str(make_profile()), "--json")
    assert done.returncode == 2
    assert "no server of this profile is running" in done.stderr


def test_advise_with_runs_at_other_shapes_lists_them_and_notes_the_nearest(make_profile: MakeProfile,
                                                                          tmp_path: Path) -> None:
    """The recorded runs used another request shape: `advise` said only "no recorded run"; now it lists the shapes
    with their counts and the nearest one's best run, marked as another shape (no fix comes of it)."""
    from app.core.measure.store import HistoryStore

    profile = str(make_profile(steps=1, startup_s=0.3, extra=BENCH))
    data = tmp_path / "data"
    launched = _run(data, "launch", profile, "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    record = json.loads(_run(data, "status", profile, "--json").stdout)
    shape = {"requests": 6, "concurrency": 2, "input_len": 32, "max_tokens": 48, "warmup": 1,
             "endpoint": "completions", "seed": 0, "ignore_eos": True, "prompt_file": None, "timeout_s": 600.0}
    with HistoryStore(data / "history.sqlite3") as store:
        for concurrency, tok_s in ((8, 300.0), (8, 320.0), (64, 900.0)):
            run = store.start_run("bench", profile="t", host="sim", backend="sglang", model=record["model"],
                                  params={"bench": {**shape, "concurrency": concurrency}},
                                  arms=[("running", "", {**record["flags"], "speculative-num-steps": 3})])
            store.finish_run(run, "done", summary={"output_tok_s": tok_s})

    done = _run(data, "advise", profile, "--json")
    assert done.returncode == 0, done.stderr
    advice = json.loads(done.stdout)
    assert advice["reference"] is None and not any(f["rule"].startswith("history:")
                                                   for f in advice["slower_than_before"])
    assert [(s["shape"]["concurrency"], s["runs"]) for s in advice["other_shapes"]] == [(8, 2), (64, 1)]
    nearest = advice["nearest_shape"]
    assert nearest["shape"]["concurrency"] == 8 and nearest["best"]["output_tok_s"] == 320.0
    assert {"flag": "speculative-num-steps", "running": 1, "nearest": 3} in nearest["differs"]

    text = _run(data, "advise", profile)
    assert text.returncode == 0, text.stderr
    assert ("recorded at other shapes: concurrency 8 x 32 in / 48 out tokens: 2 runs; concurrency 64 x 32 in / 48 "
            "out tokens: 1 run") in text.stdout
    assert "note, another shape (not like for like): the nearest, concurrency 8 x 32 in / 48 out tokens" in text.stdout
