#!/usr/bin/env python3
"""nvml_holders: what the driver says holds a profile's GPUs, without tunedash in between.

    python3 scripts/nvml_holders.py PROFILE.toml

For each GPU of the profile: NVML's v2 memory.used and its compute-process list (pid, MiB), each process with the
role its command line names (scripts/gpu_hog.py's `--role daemon|engine|server`, else its program). Where NVML
cannot be loaded (the simulated host) it asks `nvidia-smi` (there: the simulator's) the same two questions.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.core.profiles.loading import load_profile  # noqa: E402

MIB = 2**20


def role(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    if "--role" in argv[:-1]:
        return argv[argv.index("--role") + 1]
    return Path(argv[0]).name if argv and argv[0] else "?"


def from_nvml(gpus: tuple[int, ...]) -> dict[int, tuple[int, list[tuple[int, int]]]]:
    import pynvml as nv

    nv.nvmlInit()
    out = {}
    for index in gpus:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        used = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2).used // MIB
        procs = [(p.pid, (p.usedGpuMemory or 0) // MIB) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)]
        out[index] = (used, procs)
    return out


def from_smi(gpus: tuple[int, ...]) -> dict[int, tuple[int, list[tuple[int, int]]]]:
    def query(*args: str) -> list[list[str]]:
        text = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=30).stdout
        return [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]

    used = {int(row[0]): (int(row[1]), row[2]) for row in query("--query-gpu=index,memory.used,uuid")}
    apps = query("--query-compute-apps=gpu_uuid,pid,used_memory")
    return {i: (used[i][0], [(int(a[1]), int(a[2])) for a in apps if a[0] == used[i][1]]) for i in gpus if i in used}


def main() -> int:
    profile = load_profile(Path(sys.argv[1]))
    try:
        seen, source = from_nvml(profile.gpus), "NVML"
    except Exception as exc:  # no libnvidia-ml (the simulated host): the same questions to nvidia-smi
        seen, source = from_smi(profile.gpus), f"nvidia-smi (NVML: {type(exc).__name__})"
    stamp = time.strftime("%H:%M:%S")
    for index, (used, procs) in seen.items():
        listed = ", ".join(f"pid {pid} {role(pid)} {mib} MiB" for pid, mib in procs) or "no compute process"
        print(f"  {source} {stamp} GPU{index}: used {used} MiB; {listed}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
