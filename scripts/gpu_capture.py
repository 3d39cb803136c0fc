#!/usr/bin/env python3
"""gpu_capture: save what the driver says about the GPUs right now, as test fixtures.

    python3 scripts/gpu_capture.py OUTDIR LABEL

Writes OUTDIR/LABEL_query_gpu.csv (tunedash's own --query-gpu fields, app.core.telemetry.smi_parse.GPU_FIELDS),
OUTDIR/LABEL_query_gpu_reserved.csv (index, memory.used, memory.reserved, memory.free, memory.total),
OUTDIR/LABEL_compute_apps.csv (tunedash's --query-compute-apps fields) and OUTDIR/LABEL_nvml.json (NVML
v1 and v2 memory in bytes, the compute processes with their bytes, driver and library versions), each
read back to back so they describe the same moment. Needs nvidia-smi and nvidia-ml-py (pynvml).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.core.telemetry.smi_parse import apps_query_argv, gpu_query_argv

RESERVED_FIELDS = ("index", "memory.used", "memory.reserved", "memory.free", "memory.total")


def _smi(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _nvml() -> dict[str, Any]:
    import pynvml as nv

    nv.nvmlInit()
    try:
        def text(value: Any) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)

        devices = []
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            v1 = nv.nvmlDeviceGetMemoryInfo(handle)
            v2 = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
            processes = [
                {"pid": p.pid, "used_bytes": p.usedGpuMemory}
                for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)
            ]
            devices.append({
                "index": index,
                "uuid": text(nv.nvmlDeviceGetUUID(handle)),
                "name": text(nv.nvmlDeviceGetName(handle)),
                "v1": {"total": v1.total, "free": v1.free, "used": v1.used},
                "v2": {"total": v2.total, "free": v2.free, "used": v2.used, "reserved": v2.reserved},
                "compute_processes": processes,
            })
        return {
            "driver_version": text(nv.nvmlSystemGetDriverVersion()),
            "nvml_version": text(nv.nvmlSystemGetNVMLVersion()),
            "taken_at": time.time(),
            "devices": devices,
        }
    finally:
        nv.nvmlShutdown()


def capture(outdir: Path, label: str) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"{label}_query_gpu.csv").write_text(_smi(gpu_query_argv()))
    (outdir / f"{label}_compute_apps.csv").write_text(_smi(apps_query_argv()))
    reserved = ["nvidia-smi", "--query-gpu=" + ",".join(RESERVED_FIELDS), "--format=csv,noheader,nounits"]
    (outdir / f"{label}_query_gpu_reserved.csv").write_text(_smi(reserved))
    (outdir / f"{label}_nvml.json").write_text(json.dumps(_nvml(), indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: gpu_capture.py OUTDIR LABEL")
    capture(Path(sys.argv[1]), sys.argv[2])
