"""SmiTelemetry through LocalHost against the simulated host's fake nvidia-smi (real processes, real pipes)."""

from __future__ import annotations

import os
from pathlib import Path

from app.core.hosts.local import LocalHost
from app.core.telemetry.smi import SmiTelemetry
from app.sim import gpu_state
from app.sim.host_env import reset_state, set_faults, sim_environment


def sim_host(tmp_path: Path) -> LocalHost:
    state = tmp_path / "sim"
    reset_state(state)
    return LocalHost(extra_env=sim_environment(state), state_dir=str(tmp_path / "td"))


async def test_idle_sim_gpus_read_zero_with_no_processes(tmp_path: Path) -> None:
    snapshot = await SmiTelemetry(sim_host(tmp_path)).sample()
    assert snapshot.error is None
    assert [g.index for g in snapshot.gpus] == [0, 1]
    for gpu in snapshot.gpus:
        assert gpu.memory_used_mib == 0
        assert gpu.memory_total_mib
        assert gpu.processes == ()
        assert gpu.uuid.startswith("GPU-")


async def test_sim_process_shows_on_its_gpu_by_uuid(tmp_path: Path) -> None:
    host = sim_host(tmp_path)
    gpu_state.allocate(tmp_path / "sim", 1, 4096, "python -m sglang.launch_server", "weights", pid=os.getpid())
    snapshot = await SmiTelemetry(host).sample()
    gpu0, gpu1 = snapshot.gpus
    assert gpu0.processes == ()
    assert [p.pid for p in gpu1.processes or ()] == [os.getpid()]
    assert (gpu1.memory_used_mib or 0) >= 4096


async def test_sim_stream_ticks_and_failures(tmp_path: Path) -> None:
    host = sim_host(tmp_path)
    telemetry = SmiTelemetry(host, backoff_s=(0.05, 0.1))
    stream = telemetry.stream(period_ms=100)
    first, tick = await anext(stream), await anext(stream)
    assert first.error is None
    assert tick.error is None
    assert [g.index for g in tick.gpus] == [0, 1]
    assert all(g.processes == () for g in tick.gpus)
    await stream.aclose()

    set_faults(tmp_path / "sim", driver_mismatch=True)
    snapshot = await telemetry.sample()
    assert snapshot.error is not None
    assert snapshot.error.kind == "driver"
    assert "mismatch" in snapshot.error.message


async def test_sim_missing_devices_and_lost_gpu(tmp_path: Path) -> None:
    host = sim_host(tmp_path)
    set_faults(tmp_path / "sim", no_devices=True)
    snapshot = await SmiTelemetry(host).sample()
    assert snapshot.error is not None
    assert snapshot.error.kind == "no_devices"
    set_faults(tmp_path / "sim", no_devices=False, lost_gpus=[1])
    snapshot = await SmiTelemetry(host).sample()
    # rc 15: the healthy GPU's row is kept next to the error naming the lost one
    assert [g.index for g in snapshot.gpus] == [0]
    assert snapshot.error is not None
    assert snapshot.error.kind == "lost"
    assert snapshot.error.exit_code == 15
