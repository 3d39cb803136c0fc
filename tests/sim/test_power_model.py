"""The simulated GPUs' power.draw: idle < memory held < decoding, rising with the batch; 3 speculative steps use less
energy per token than 1; "[N/A]" power; and the power.draw integral through the real fake nvidia-smi."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.core.hosts.local import LocalHost
from app.core.telemetry.energy import METHOD_SMI, SmiEnergyMeter
from app.sim import gpu_state
from app.sim.gpu_models import gpus_for_spec
from app.sim.host_env import sim_environment
from app.sim.server_args import load_models, parse, resolve
from app.sim.sglang import speed_config
from app.sim.speed import SpeedModel, load_params
from tests.helpers import GroupReaper, smi

A6000 = gpu_state.default_gpus(1)[0]
DEMO = load_models()["sim/qwen3.6-27b"]


def demo_speed(steps: int) -> SpeedModel:
    """The demo profile's speed model (NEXTN, topk 1, steps + 1 draft tokens, TP 2)."""
    ns = parse(["--model-path", "sim/qwen3.6-27b", "--tp-size", "2", "--speculative-algorithm", "NEXTN",
                "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(steps + 1)], "0.5.10")
    return SpeedModel(speed_config(resolve(ns, DEMO, 49140, "0.5.10"), DEMO), load_params(), seed=1)


def test_power_levels_and_the_batch() -> None:
    def watts(loaded: bool, load: tuple[int, int] | None) -> float:
        return gpu_state.power_draw_w(A6000, loaded, load, jitter=0)

    idle, held = watts(False, None), watts(True, None)
    assert idle == pytest.approx(0.075 * A6000.power_limit_w) and held == pytest.approx(0.25 * A6000.power_limit_w)
    by_batch = [watts(True, (b, 2)) for b in (1, 2, 4, 8, 16, 32, 64)]
    assert idle < held < by_batch[0]
    assert by_batch == sorted(by_batch) and len(set(by_batch)) == len(by_batch)  # rises with the batch
    assert by_batch[-1] <= A6000.power_limit_w
    h200 = gpus_for_spec("1xH200")[0]
    assert gpu_state.power_draw_w(h200, True, (4, 2), jitter=0) > watts(True, (4, 2))  # a 700 W board draws more


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_three_steps_use_less_energy_per_token_than_one(batch: int) -> None:
    def joules_per_token(steps: int) -> float:
        speed = demo_speed(steps)
        watts = gpu_state.power_draw_w(A6000, True, (batch, 1 + speed.draft_tokens), jitter=0)
        tokens_per_step = batch * speed.mean_accept_len()
        return watts * speed.mean_step_ms(batch) / 1000 / tokens_per_step

    one, three = joules_per_token(1), joules_per_token(3)
    assert three < one
    # about the throughput gain less the extra draw of the longer verify; the gain shrinks as the batch grows
    # (verify compute grows with batch: speed_model.toml, verify_batch_ms_per_draft_token): ~0.72 / 0.77 / 0.87
    assert 0.6 < three / one < {1: 0.8, 4: 0.85, 16: 0.92}[batch]


def _hold_both(reaper: GroupReaper, env: dict[str, str], state: Path) -> None:
    proc = reaper.start(["sleep", "60"], env)
    for gpu in (0, 1):
        gpu_state.allocate(state, gpu, 20000, "sglang::scheduler_TP0", "weights", pid=proc.pid)


def _powers(env: dict[str, str]) -> list[str]:
    out = smi(env, "--query-gpu=index,power.draw", "--format=csv,noheader,nounits")
    assert out.returncode == 0, out.stdout
    return [line.split(", ")[1] for line in out.stdout.splitlines()]


def test_fake_smi_follows_the_load_and_reports_na(sim_env: dict[str, str], sim_state: Path,
                                                  reaper: GroupReaper) -> None:
    idle = [float(w) for w in _powers(sim_env)]
    _hold_both(reaper, sim_env, sim_state)
    held = [float(w) for w in _powers(sim_env)]
    gpu_state.write_load(sim_state / gpu_state.BUSY_FILE, 4, 4)
    busy = [float(w) for w in _powers(sim_env)]
    expected = gpu_state.power_draw_w(A6000, True, (4, 4), jitter=0)
    assert max(idle) < min(held) < min(busy)
    assert busy == pytest.approx([expected, expected], rel=0.05)
    gpu_state.write_faults(sim_state, power_na=[1])
    assert _powers(sim_env)[1] == "[N/A]"


async def test_power_integral_through_the_fake_smi(sim_env: dict[str, str], sim_state: Path,
                                                   reaper: GroupReaper) -> None:
    host = LocalHost("sim", extra_env=sim_environment(sim_state), state_dir=str(sim_state / "host"))
    _hold_both(reaper, sim_env, sim_state)
    busy_file = sim_state / gpu_state.BUSY_FILE

    async def heartbeat() -> None:  # the decoding server rewrites its load every 0.3 s (it does every 0.5 s)
        while True:
            gpu_state.write_load(busy_file, 4, 2)
            await asyncio.sleep(0.3)

    keep_busy = asyncio.create_task(heartbeat())
    try:
        meter = SmiEnergyMeter(host, (0, 1), period_ms=100)
        await meter.start()
        await asyncio.sleep(1.5)
        reading = await meter.stop()
    finally:
        keep_busy.cancel()
    watts = gpu_state.power_draw_w(A6000, True, (4, 2), jitter=0)
    assert reading.method == METHOD_SMI and reading.reason == ""
    assert reading.samples >= 2 * 5  # two GPUs, 100 ms apart over 1.5 s (a loaded machine may be slower)
    assert reading.mean_w_per_gpu == pytest.approx([watts, watts], rel=0.03)
    assert reading.joules == pytest.approx(2 * watts * reading.window_s, rel=0.03)

    gpu_state.write_faults(sim_state, power_na=[1])
    meter = SmiEnergyMeter(host, (0, 1), period_ms=100)
    await meter.start()
    await asyncio.sleep(0.3)
    missing = await meter.stop()
    assert missing.joules is None and missing.to_json(100) is None
    assert "GPU 1" in missing.note and "[N/A]" in missing.note
