"""The simulated host's NVML: the subset of nvidia-ml-py's `pynvml` that tunedash calls, read from the GPU state folder.

A real GPU host answers an NVML read in ~5-10 us; the fake `nvidia-smi` costs a process start (~38 ms). The release
watch samples the GPUs every few ms while a kill is pending (docs/decisions.md#release-watch-at-the-sources-pace),
which on the simulated host must not cost a process per sample: `SimNvml(state_dir)` reads the same state the fake
`nvidia-smi` reads (`gpu_state.snapshot`: the owner's liveness, the release delay, the fault knobs) in this process.
It is handed to `NvmlTelemetry(nvml=...)` through the host (`LocalHost(nvml=...)` in app/connect.py), so the core
runs its NVML code on the simulated host as on a real one. Nothing of the fake `nvidia-smi`'s output changes.

What it answers, as pynvml does: nvmlInit / nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, UUID,
name, nvmlDeviceGetMemoryInfo (v1: used includes the reserved memory; `version=nvmlMemory_v2`: used as nvidia-smi
prints it, reserved apart), nvmlDeviceGetComputeRunningProcesses(_v3/_v2) (pid, usedGpuMemory in bytes, one entry
per process and GPU), utilization, temperature and power at the fake nvidia-smi's levels. The fault knobs raise the
NVMLError subclass the real library raises for the same fault (driver_not_loaded -> NVMLError_DriverNotLoaded,
driver_mismatch -> NVMLError_LibRmVersionMismatch, nvml_unknown_error -> NVMLError_Unknown, no_devices -> a count
of 0, lost_gpus -> NVMLError_GpuIsLost on that GPU, power_na -> NVMLError_NotSupported on its power).

One state read serves the calls of one sample: the snapshot is kept for SNAPSHOT_REUSE_S (1 ms), far under the
release watch's 5 ms period, so a sample of two GPUs reads the folder once instead of four times.
"""

from __future__ import annotations

import time
from typing import Any

from app.sim.gpu_state import SimGpu, Snapshot, power_draw_w, read_load, snapshot

_MIB = 1024 * 1024
SNAPSHOT_REUSE_S = 0.001
NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    """Base of the simulated NVML errors; the subclass names are pynvml's, which tunedash maps to hints."""

    text = "Unknown Error"

    def __str__(self) -> str:
        return self.text


def _error(name: str, text: str) -> type[NVMLError]:
    return type(name, (NVMLError,), {"text": text})


NVMLError_Uninitialized = _error("NVMLError_Uninitialized", "Uninitialized")
NVMLError_InvalidArgument = _error("NVMLError_InvalidArgument", "Invalid Argument")
NVMLError_NotSupported = _error("NVMLError_NotSupported", "Not Supported")
NVMLError_DriverNotLoaded = _error("NVMLError_DriverNotLoaded", "Driver Not Loaded")
NVMLError_FunctionNotFound = _error("NVMLError_FunctionNotFound", "Function Not Found")
NVMLError_GpuIsLost = _error("NVMLError_GpuIsLost", "GPU is lost")
NVMLError_LibRmVersionMismatch = _error("NVMLError_LibRmVersionMismatch", "Driver/library version mismatch")
NVMLError_Unknown = _error("NVMLError_Unknown", "Unknown Error")


class _Memory:
    """nvmlMemory_t / nvmlMemory_v2_t: bytes."""

    def __init__(self, total: int, used: int, free: int, reserved: int | None) -> None:
        self.total = total
        self.used = used
        self.free = free
        if reserved is not None:
            self.reserved = reserved


class _Process:
    """nvmlProcessInfo_t: pid and usedGpuMemory in bytes."""

    def __init__(self, pid: int, used: int) -> None:
        self.pid = pid
        self.usedGpuMemory = used


class _Utilization:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu = gpu
        self.memory = memory


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class SimNvml:
    """A pynvml-shaped object over one simulated host's state folder (see the module docstring)."""

    nvmlMemory_v2 = 0x02000028  # pynvml's value: sizeof(nvmlMemory_v2_t) | 2 << 24
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_LibRmVersionMismatch = NVMLError_LibRmVersionMismatch
    NVMLError_Unknown = NVMLError_Unknown

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self._inits = 0
        self._snap: Snapshot | None = None
        self._snap_at = 0.0
        self.reads = 0  # state-folder reads so far (for the bench and tests)

    # ---- the library's life -----------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        faults = self._read(fresh=True).faults
        if faults.get("driver_not_loaded"):
            raise NVMLError_DriverNotLoaded()
        if faults.get("driver_mismatch"):
            raise NVMLError_LibRmVersionMismatch()
        if faults.get("nvml_unknown_error"):
            raise NVMLError_Unknown()
        self._inits += 1

    def nvmlShutdown(self) -> None:
        if self._inits == 0:
            raise NVMLError_Uninitialized()
        self._inits -= 1

    # ---- devices ------------------------------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        snap = self._ready()
        return 0 if snap.faults.get("no_devices") else len(snap.config.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= int(index) < self.nvmlDeviceGetCount():
            raise NVMLError_InvalidArgument()
        return _Handle(int(index))

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._gpu(handle)[1].uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu(handle)[1].name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> _Memory:
        snap, gpu = self._gpu(handle)
        used = snap.used_mib(gpu) * _MIB
        reserved = gpu.reserved_mib * _MIB
        total = gpu.memory_total_mib * _MIB
        free = max(0, total - reserved - used)
        if version == self.nvmlMemory_v2:
            return _Memory(total, used, free, reserved)
        return _Memory(total, used + reserved, free, None)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_Process]:
        snap, gpu = self._gpu(handle)
        held: dict[int, int] = {}
        for record in snap.records:
            if record.gpu == gpu.index:
                held[record.pid] = held.get(record.pid, 0) + record.mib
        return [_Process(pid, mib * _MIB) for pid, mib in held.items()]

    nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:
        snap, gpu = self._gpu(handle)
        busy = self._busy(snap, gpu)
        return _Utilization(96, 71) if busy else _Utilization(0, 0)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        snap, gpu = self._gpu(handle)
        loaded = any(r.gpu == gpu.index for r in snap.records)
        return 71 if self._busy(snap, gpu) else 44 if loaded else 31

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        snap, gpu = self._gpu(handle)
        if gpu.index in (snap.faults.get("power_na") or ()):
            raise NVMLError_NotSupported()
        loaded = any(r.gpu == gpu.index for r in snap.records)
        load = read_load(self.state_dir) if loaded else None
        return round(power_draw_w(gpu, loaded, load) * 1000)

    # ---- the state folder ---------------------------------------------------------------------------------------
    def _read(self, *, fresh: bool = False) -> Snapshot:
        now = time.monotonic()
        if fresh or self._snap is None or now - self._snap_at > SNAPSHOT_REUSE_S:
            self._snap = snapshot(self.state_dir)
            self._snap_at = now
            self.reads += 1
        return self._snap

    def _ready(self) -> Snapshot:
        if self._inits == 0:
            raise NVMLError_Uninitialized()
        return self._read()

    def _gpu(self, handle: Any) -> tuple[Snapshot, SimGpu]:
        snap = self._ready()
        index = getattr(handle, "index", None)
        gpu = next((g for g in snap.config.gpus if g.index == index), None)
        if gpu is None:
            raise NVMLError_InvalidArgument()
        if gpu.index in (snap.faults.get("lost_gpus") or ()):
            raise NVMLError_GpuIsLost()
        return snap, gpu

    def _busy(self, snap: Snapshot, gpu: SimGpu) -> bool:
        loaded = any(r.gpu == gpu.index for r in snap.records)
        return loaded and read_load(self.state_dir) is not None
