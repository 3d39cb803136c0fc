"""The simulated host's NVML reader says what its fake nvidia-smi prints, and fails the way NVML fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.core.telemetry.nvml import NvmlTelemetry
from app.core.telemetry.smi_parse import parse_compute_apps_csv
from app.sim import gpu_state
from app.sim.host_env import set_faults
from app.sim.sim_nvml import SimNvml
from tests.helpers import smi


async def test_memory_and_processes_match_the_fake_nvidia_smi(sim_state: Path, sim_env: dict[str, str]) -> None:
    gpu_state.allocate(sim_state, 1, 4096, "sglang::scheduler_TP1", "weights", pid=os.getpid())
    gpu_state.allocate(sim_state, 1, 512, "sglang::scheduler_TP1", "kv_cache", pid=os.getpid())
    nvml = NvmlTelemetry(nvml=SimNvml(str(sim_state)))
    snapshot = await nvml.sample()
    assert snapshot.error is None
    printed = smi(sim_env, "--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits")
    rows = [line.split(", ") for line in printed.stdout.splitlines()]
    assert [(g.index, g.uuid, g.memory_used_mib, g.memory_total_mib) for g in snapshot.gpus] == [
        (int(i), uuid, int(used), int(total)) for i, uuid, used, total in rows
    ]
    assert all(g.memory_api == "nvml_v2" for g in snapshot.gpus)
    apps = smi(sim_env, "--query-compute-apps=gpu_uuid,pid,used_memory,process_name", "--format=csv,noheader,nounits")
    listed, _ = parse_compute_apps_csv(apps.stdout)
    gpu1 = snapshot.gpus[1]
    assert [(p.pid, p.used_mib, p.gpu_uuid) for p in gpu1.processes or ()] == [
        (p.pid, p.used_mib, p.gpu_uuid) for p in listed
    ] == [(os.getpid(), 4608, gpu1.uuid)]
    assert snapshot.gpus[0].processes == ()
    await nvml.close()


def test_v1_memory_counts_the_reserve_as_the_real_library_does(sim_state: Path) -> None:
    nvml = SimNvml(str(sim_state))
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    v1, v2 = nvml.nvmlDeviceGetMemoryInfo(handle), nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    assert v2.used == 0
    assert v1.used == v2.reserved > 0


@pytest.mark.parametrize(
    ("knob", "kind", "text"),
    [
        ("driver_not_loaded", "driver", "Driver Not Loaded"),
        ("driver_mismatch", "driver", "Driver/library version mismatch"),
        ("nvml_unknown_error", "driver", "Unknown Error"),
        ("no_devices", "no_devices", "NVML sees 0 GPUs"),
    ],
)
async def test_fault_knobs_fail_as_nvml_fails(sim_state: Path, knob: str, kind: str, text: str) -> None:
    set_faults(sim_state, **{knob: True})
    snapshot = await NvmlTelemetry(nvml=SimNvml(str(sim_state))).sample()
    assert snapshot.error is not None
    assert snapshot.error.kind == kind
    assert text in snapshot.error.message


async def test_a_lost_gpu_is_unreadable_not_zero(sim_state: Path) -> None:
    set_faults(sim_state, lost_gpus=[1])
    snapshot = await NvmlTelemetry(nvml=SimNvml(str(sim_state))).sample()
    gpu0, gpu1 = snapshot.gpus
    assert gpu0.memory_used_mib == 0
    assert gpu1.memory_used_mib is None
    assert "GPU is lost" in gpu1.unavailable["memory_used_mib"]
