"""snapshot_to_json (the `tunedash gpus --json` shape) and telemetry_for (import hygiene: tests/unit/test_rooms.py)."""

from __future__ import annotations

import json

import pytest

from app.core.data import GpuProcess, GpuSample, GpuSnapshot, TelemetryError
from app.core.hosts.local import LocalHost
from app.core.telemetry.smi import NvmlTelemetry, SmiTelemetry, snapshot_to_json, telemetry_for

GPU_KEYS = {
    "index", "uuid", "name", "memory_used_mib", "memory_total_mib", "utilization_pct", "temperature_c", "power_w",
    "processes", "unavailable",
}


def test_json_shape_with_values_nulls_and_reasons() -> None:
    busy = GpuSample(
        index=0, uuid="GPU-a", name="NVIDIA H200", memory_used_mib=43000, memory_total_mib=143771,
        utilization_pct=97, temperature_c=61, power_w=512.5,
        processes=(GpuProcess(4242, "python -m sglang.launch_server", 42980, "GPU-a"),), taken_at=3.0,
        source="smi",
    )
    unknown = GpuSample(
        index=1, uuid="GPU-b", name="NVIDIA GB10", memory_used_mib=None, memory_total_mib=None,
        power_w=None, processes=None,
        unavailable={"memory_used_mib": "[N/A]", "memory_total_mib": "[N/A]", "power_w": "[N/A]",
                     "processes": "process list not read yet"},
    )
    document = snapshot_to_json(GpuSnapshot(gpus=(busy, unknown), taken_at=3.0, skipped_lines=1))
    json.dumps(document)  # plain JSON types only
    assert document["error"] is None
    first, second = document["gpus"]
    assert set(first) == GPU_KEYS
    assert first == {
        "index": 0, "uuid": "GPU-a", "name": "NVIDIA H200", "memory_used_mib": 43000, "memory_total_mib": 143771,
        "utilization_pct": 97, "temperature_c": 61, "power_w": 512.5,
        "processes": [{"pid": 4242, "name": "python -m sglang.launch_server", "used_mib": 42980}],
        "unavailable": {},
    }
    assert second["memory_used_mib"] is None  # null, never 0
    assert second["processes"] is None
    assert second["unavailable"]["memory_used_mib"] == "[N/A]"


def test_json_error_document() -> None:
    error = TelemetryError("driver", "Failed to initialize NVML: Driver/library version mismatch", 18, "Reboot.")
    document = snapshot_to_json(GpuSnapshot(gpus=(), taken_at=0.0, error=error))
    assert document["gpus"] == []
    assert document["error"] == {
        "kind": "driver", "message": "Failed to initialize NVML: Driver/library version mismatch",
        "exit_code": 18, "hint": "Reboot.",
    }


def test_factory_picks_the_source() -> None:
    local = LocalHost()
    assert isinstance(telemetry_for(local, "smi"), SmiTelemetry)
    nvml = telemetry_for(local, "nvml", [0])
    assert isinstance(nvml, NvmlTelemetry)
    assert nvml.indices == [0]


def test_factory_refuses_nvml_for_a_remote_host() -> None:
    remote = LocalHost(name="h200-box")
    remote.is_local = False  # what SshHost looks like to the factory
    with pytest.raises(ValueError, match="h200-box") as info:
        telemetry_for(remote, "nvml")
    assert "--source smi" in str(info.value)
    with pytest.raises(ValueError, match="unknown telemetry source"):
        telemetry_for(remote, "dcgm")
