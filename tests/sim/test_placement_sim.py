"""Where a simulated server's ranks run (CUDA_VISIBLE_DEVICES, --base-gpu-id) and the GPUs' speed factors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.sim.host_env import sim_environment
from app.sim.placement import (
    GPU_SPEED_ENV,
    InvalidDeviceOrdinal,
    gpu_speed_factors,
    rank_gpus,
    server_speed_factor,
)
from app.sim.speed import SpeedConfig, SpeedModel, load_params
from tests.helpers import GroupReaper, smi

from .test_sglang_server import Server


def test_ranks_follow_cuda_visible_devices_like_a_real_server() -> None:
    assert rank_gpus(2, 0, 8, {}) == [0, 1]
    assert rank_gpus(2, 0, 8, {"CUDA_VISIBLE_DEVICES": "6,7"}) == [6, 7]
    assert rank_gpus(1, 1, 8, {"CUDA_VISIBLE_DEVICES": "4, 5"}) == [5]  # base counts within the visible ones
    assert rank_gpus(2, 2, 8, {}) == [2, 3]
    # GPUs named by UUID: the host's own order (the sim cannot map them)
    assert rank_gpus(2, 0, 2, {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}) == [0, 1]


@pytest.mark.parametrize(("env", "tp", "base"), [({"CUDA_VISIBLE_DEVICES": "6"}, 2, 0), ({}, 2, 7),
                                         ({"CUDA_VISIBLE_DEVICES": "8,9"}, 2, 0), ({}, 1, -1)])
def test_a_rank_outside_the_visible_gpus_is_an_invalid_ordinal(env: dict[str, str], tp: int, base: int) -> None:
    with pytest.raises(InvalidDeviceOrdinal):
        rank_gpus(tp, base, 8, env)


def test_gpu_speed_factors_and_the_slowest_gpu_sets_the_pace() -> None:
    factors = gpu_speed_factors({GPU_SPEED_ENV: "6=0.96, 7=0.96"})
    assert factors == {6: 0.96, 7: 0.96}
    assert server_speed_factor([6, 7], factors) == 0.96
    assert server_speed_factor([5, 6], factors) == 0.96  # a rank on the slow pair holds the whole server back
    assert server_speed_factor([0, 1], factors) == 1.0
    assert gpu_speed_factors({}) == {}


@pytest.mark.parametrize("text", ["6", "x=0.9", "6=fast", "6=0", "-1=0.9", "6=20"])
def test_malformed_gpu_speed_names_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match=rf"\${GPU_SPEED_ENV}: expected GPU=FACTOR"):
        gpu_speed_factors({GPU_SPEED_ENV: text})


def test_the_gpu_factor_divides_every_step_like_the_launch_factor() -> None:
    params = {**load_params(), "launch_sigma": 0.0, "noise_sigma": 0.0}
    cfg = SpeedConfig(weights_gib=50.3, tp_size=2, spec_algorithm="EAGLE", spec_steps=3, spec_draft_tokens=4)
    fast = SpeedModel(cfg, params, seed=1)
    slow = SpeedModel(cfg, params, seed=1, gpu_factor=0.96)
    assert slow.sample_step_ms(4, 500) == pytest.approx(fast.sample_step_ms(4, 500) / 0.96)
    assert slow.mean_step_ms(4, 500) == fast.mean_step_ms(4, 500)  # the nominal figure leaves it out
    with pytest.raises(ValueError, match="gpu_factor"):
        SpeedModel(cfg, params, gpu_factor=0)


def _live_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, **sim_environment(tmp_path / "sim8", gpus="8xH200"), "TUNEDASH_SIM_STARTUP_S": "0.4",
           **extra}
    env.pop("TUNEDASH_SIM_FAULT", None)
    return env


def test_a_server_on_visible_gpus_6_7_holds_memory_there_only(tmp_path: Path, reaper: GroupReaper) -> None:
    env = _live_env(tmp_path, CUDA_VISIBLE_DEVICES="6,7", **{GPU_SPEED_ENV: "6=0.96,7=0.96"})
    server = Server(reaper, env, tmp_path / "server.log")
    server.wait_ready(timeout=30)
    out = smi(env, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert out.returncode == 0, out.stdout
    used = {int(i): int(m) for i, m in (line.split(", ") for line in out.stdout.splitlines())}
    assert len(used) == 8
    assert used[6] > 10_000 and used[7] > 10_000, used
    assert all(used[g] < 1_000 for g in range(6)), used


def test_a_malformed_gpu_speed_stops_the_server_with_the_variable_named(tmp_path: Path,
                                                                         reaper: GroupReaper) -> None:
    env = _live_env(tmp_path, **{GPU_SPEED_ENV: "6:0.96"})
    server = Server(reaper, env, tmp_path / "server.log")
    assert server.proc.wait(timeout=30) == 1
    assert f"${GPU_SPEED_ENV}: expected GPU=FACTOR" in server.text()
