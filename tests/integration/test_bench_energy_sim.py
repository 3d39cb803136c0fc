"""`tunedash bench` on the simulated host prints energy (the power.draw integral, J/token, tokens/J, mean W per GPU)
and goodput within the profile's SLOs; a GPU whose power reads "[N/A]" makes the energy unavailable, never 0."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.measure.store import DATA_DIR_ENV
from app.sim import gpu_state
from tests.helpers import REPO, MakeProfile

pytestmark = pytest.mark.slow

SMALL = ["--requests", "6", "--concurrency", "3", "--max-tokens", "48", "--input-len", "32", "--warmup", "1"]
ENERGY_KEYS = {"method", "joules", "gpus", "mean_w_per_gpu", "output_tokens", "j_per_token", "tokens_per_j"}


def _run(data: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, DATA_DIR_ENV: str(data)}
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


def test_bench_prints_energy_and_goodput(make_profile: MakeProfile, sim_state: Path, tmp_path: Path) -> None:
    profile = make_profile(startup_s=0.4, extra="[bench]\nslo_ttft_ms = 60000\nslo_tpot_ms = 10000\n")
    data = tmp_path / "data"
    launched = _run(data, "launch", str(profile), "--wait")
    assert launched.returncode == 0, launched.stderr

    text = _run(data, "bench", str(profile), *SMALL)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    energy = next(line for line in lines if line.startswith("energy"))
    assert re.fullmatch(r"energy \(nvidia-smi power\.draw integral\): [\d.]+ J on 2 GPUs, mean [\d.]+, [\d.]+ W per "
                        r"GPU; [\d.]+ J/token, [\d.]+ tokens/J", energy), energy
    goodput = next(line for line in lines if line.startswith("goodput"))
    assert re.fullmatch(r"goodput: [\d.]+ req/s within TTFT <= 60000 ms and TPOT <= 10000 ms \(6 of 6 requests\); "
                        r"throughput [\d.]+ req/s", goodput), goodput

    summary = json.loads(_run(data, "bench", str(profile), *SMALL, "--json").stdout)
    measured = summary["energy"]
    assert set(measured) == ENERGY_KEYS and measured["method"] == "smi_power_integral" and measured["gpus"] == 2
    assert measured["output_tokens"] == summary["output_tokens"] == 6 * 48
    assert measured["j_per_token"] == pytest.approx(measured["joules"] / measured["output_tokens"])
    held, limit = 0.25 * 300, 300  # the A6000's power model: memory held, and its power limit
    assert all(held < w <= limit for w in measured["mean_w_per_gpu"]), measured  # decoding draws above "held"
    assert summary["slo_met"] == 6 and summary["goodput_rps"] == pytest.approx(summary["request_rate"])

    gpu_state.write_faults(sim_state, power_na=[1])
    missing = _run(data, "bench", str(profile), *SMALL)
    assert missing.returncode == 0, missing.stderr
    assert "energy: unavailable (nvidia-smi power.draw integral: GPU 1: power.draw [N/A])" in missing.stdout
    assert " 0.0 J" not in missing.stdout and "J/token" not in missing.stdout
