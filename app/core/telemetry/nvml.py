"""NvmlTelemetry: this machine's GPUs through NVML (nvidia-ml-py), every failing call a None plus a reason.

Public API: ``NvmlTelemetry(indices=None, *, nvml=None, proc_root="/proc", process_interval_s=1.0,
min_period_ms=100, slow_interval_s=0.0)`` with ``await sample() -> GpuSnapshot``,
``stream(period_ms=1000) -> AsyncIterator[GpuSnapshot]``, ``await read_energy() -> EnergyCounters`` (the total
energy counters, for app.core.telemetry.energy) and ``await close()`` (nvmlShutdown); ``release_sampler(indices,
nvml)`` and ``for_release()``: the release watch's sampler (memory and processes every 5 ms). ``nvml`` is the
pynvml module (imported lazily when None); tests inject a fake with the same functions, return shapes and
exception classes.

Rules (the NVML facts behind them: docs/gpus.md#nvml-nvidia-ml-py):

- nvmlInit once; device handles, uuid and name once per device (a failed one is retried next sample).
  Init failures (library not found, driver not loaded, no permission, version mismatch, ...) give a
  GpuSnapshot whose ``error`` says what happened and what to do; the next sample tries again.
- All NVML calls of one sample run in one ``asyncio.to_thread`` call, serialised by a lock (NVML calls
  contend for the driver's global lock; one thread at a time).
- Memory: ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`` (``used`` excludes driver-reserved memory,
  same as nvidia-smi: 0 MiB on an idle H200); on ``NVMLError_FunctionNotFound`` (drivers before ~R510)
  fall back to v1, whose ``used`` includes the reserved memory (615 MiB on an idle H200). The choice is
  per device, kept in ``memory_api`` and in ``GpuSample.memory_api`` ("nvml_v2" / "nvml_v1").
- Compute processes: ``_v3`` -> ``_v2`` -> unversioned, stepping down on FunctionNotFound (and on the
  binding's NVMLLibraryMismatchError or a missing function); the working one is kept in ``process_api``.
  ``usedGpuMemory is None`` (NVML_VALUE_NOT_AVAILABLE, WDDM) -> ``used_mib=None``. Process lists are read
  at most every ``process_interval_s``; in between, the previous list is reused and
  ``GpuSample.processes_taken_at`` says when it was read.
- Process names come from /proc/PID/cmdline (arguments joined by spaces), else /proc/PID/comm, else
  "[unknown]" (a process of another PID namespace or one that already exited).
- Utilization (%), temperature (C), power (mW -> W). Any failing call -> None and
  ``unavailable[field] = "NVMLError_NotSupported: Not Supported"`` (class name and NVML's text).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.data import GpuProcess, GpuSample, GpuSnapshot, TelemetryError
from app.core.telemetry.smi_parse import FAILURE_HINTS

log = logging.getLogger("tunedash")

_MIB = 1024 * 1024
RELEASE_PERIOD_MS = 5  # the release watch's pace on NVML (docs/decisions.md#release-watch-at-the-sources-pace)
RELEASE_SLOW_S = 0.25  # ... and how often it re-reads utilization, temperature and power
_PROCESS_FUNCTIONS = (
    ("v3", "nvmlDeviceGetComputeRunningProcesses_v3"),
    ("v2", "nvmlDeviceGetComputeRunningProcesses_v2"),
    ("v1", "nvmlDeviceGetComputeRunningProcesses"),
)
# NVMLError subclass name -> (TelemetryError kind, hint key in FAILURE_HINTS)
_INIT_ERRORS = {
    "NVMLError_LibraryNotFound": ("not_found", "library"),
    "NVMLError_DriverNotLoaded": ("driver", "driver"),
    "NVMLError_LibRmVersionMismatch": ("driver", "mismatch"),
    "NVMLError_FunctionNotFound": ("driver", "driver"),
    "NVMLError_Unknown": ("driver", "cgroup"),
    "NVMLError_NoPermission": ("permission", "permission"),
    "NVMLError_OperatingSystem": ("permission", "os_blocked"),
    "NVMLError_GpuIsLost": ("lost", "lost"),
    "NVMLError_ResetRequired": ("lost", "lost"),
}


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class _Device:
    """What is kept per GPU between samples."""

    index: int
    handle: Any = None
    uuid: str = ""
    name: str | None = None
    memory_api: str = ""  # "" until the first successful read
    static_unavailable: dict[str, str] = field(default_factory=dict)
    processes: tuple[GpuProcess, ...] | None = None
    processes_reason: str = "process list not read yet"
    processes_taken_at: float | None = None
    slow: tuple[int | None, int | None, int | None, dict[str, str]] = (None, None, None, {})
    slow_at: float | None = None  # when utilization, temperature and power were last read


@dataclass(frozen=True)
class EnergyCounters:
    """One read of the total energy counters: per GPU index (mJ, monotonic time of the read), per GPU the
    reason its counter could not be read, and `error` when NVML itself could not be used."""

    values: dict[int, tuple[int, float]]
    unavailable: dict[int, str]
    error: str | None = None


class NvmlTelemetry:
    """GPU readings from NVML on the local machine (see the module docstring for the rules)."""

    source = "nvml"

    def __init__(
        self,
        indices: Sequence[int] | None = None,
        *,
        nvml: Any = None,
        proc_root: str = "/proc",
        process_interval_s: float = 1.0,
        backoff_s: tuple[float, float] = (0.5, 8.0),
        clock: Callable[[], float] = time.monotonic,
        min_period_ms: int = 100,
        slow_interval_s: float = 0.0,
    ) -> None:
        self.indices = sorted(set(indices)) if indices else None
        self._nvml = nvml
        self._proc_root = Path(proc_root)
        self._process_interval_s = process_interval_s
        self._min_period_ms = min_period_ms
        self._slow_interval_s = slow_interval_s  # utilization, temperature, power: re-read at most this often
        self._backoff_s = backoff_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._initialised = False
        self._devices: list[_Device] | None = None
        self._missing_indices: list[int] = []
        self._count = 0
        self._processes_read_at: float | None = None
        self.process_api: str | None = None  # "v3" | "v2" | "v1" once a process call worked
        self._names: dict[int, str] = {}  # pid -> name, for pids of the last process lists (read /proc once)

    @property
    def memory_api(self) -> dict[int, str]:
        """Per GPU index, the memory call in use: "nvml_v2" or "nvml_v1" (after the first sample)."""
        return {d.index: d.memory_api for d in self._devices or () if d.memory_api}

    async def sample(self) -> GpuSnapshot:
        """One reading of every selected GPU."""
        async with self._lock:
            return await asyncio.to_thread(self._read)

    async def stream(self, period_ms: int = 1000) -> AsyncGenerator[GpuSnapshot, None]:
        """A snapshot every `period_ms` (at least `min_period_ms`: 100 ms, 5 ms for the release watch's sibling);
        errors arrive as snapshots and are retried."""
        period_s = max(int(period_ms), self._min_period_ms) / 1000
        backoff = self._backoff_s[0]
        while True:
            started = self._clock()
            snapshot = await self.sample()
            yield snapshot
            if snapshot.error is not None and not snapshot.gpus:
                delay = backoff
                backoff = min(backoff * 2, self._backoff_s[1])
            else:
                delay = max(0.0, period_s - (self._clock() - started))
                backoff = self._backoff_s[0]
            await asyncio.sleep(delay)

    def for_release(self, period_ms: int = RELEASE_PERIOD_MS) -> NvmlTelemetry:
        """A sibling for the release watch: memory and the process list every `period_ms` (5 ms: a read costs
        ~10 us a GPU), utilization, temperature and power at most every RELEASE_SLOW_S (the GPU panel shows the
        watch's last sample). NVML counts nvmlInit/nvmlShutdown pairs, so the sibling's own init and close leave
        this one working (why the pace: docs/decisions.md#release-watch-at-the-sources-pace)."""
        return release_sampler(self.indices, self._nvml, period_ms, proc_root=str(self._proc_root),
                               clock=self._clock)

    async def read_energy(self) -> EnergyCounters:
        """Every selected GPU's total energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the driver
        loaded), each with the monotonic time right after its read; a GPU whose counter cannot be read has the
        reason instead (NVMLError_NotSupported before Volta). A read costs ~4 ms on an H200: read a window's edges,
        not every sample (docs/decisions.md#energy-per-token)."""
        async with self._lock:
            return await asyncio.to_thread(self._read_energy)

    def _read_energy(self) -> EnergyCounters:
        try:
            nvml = self._module()
        except ImportError as exc:
            return EnergyCounters({}, {}, f"NVML: {_reason(exc)} (install nvidia-ml-py)")
        if not self._initialised:
            try:
                nvml.nvmlInit()
            except Exception as exc:
                return EnergyCounters({}, {}, _init_error(exc).message)
            self._initialised = True
        if self._devices is None:
            error = self._open_devices(nvml)
            if error is not None:
                return EnergyCounters({}, {}, error.message)
        values: dict[int, tuple[int, float]] = {}
        unavailable = {i: f"GPU {i} not found ({self._count} GPUs visible)" for i in self._missing_indices}
        for device in self._devices or []:
            handle_error = self._open_handle(nvml, device)
            if handle_error is not None:
                unavailable[device.index] = handle_error
                continue
            try:
                millijoules = int(nvml.nvmlDeviceGetTotalEnergyConsumption(device.handle))
            except Exception as exc:
                unavailable[device.index] = _reason(exc)
                continue
            values[device.index] = (millijoules, self._clock())
        return EnergyCounters(values, unavailable)

    async def close(self) -> None:
        """nvmlShutdown, once, if nvmlInit succeeded."""
        async with self._lock:
            if self._initialised:
                self._initialised = False
                self._devices = None
                try:
                    await asyncio.to_thread(self._module().nvmlShutdown)
                except Exception as exc:
                    log.warning("nvmlShutdown failed: %s", exc)  # either way, nothing else is lost

    # ---- everything below runs in the worker thread -------------------------------------------------

    def _module(self) -> Any:
        if self._nvml is None:
            self._nvml = importlib.import_module("pynvml")
        return self._nvml

    def _read(self) -> GpuSnapshot:
        now = self._clock()
        try:
            nvml = self._module()
        except ImportError as exc:
            return GpuSnapshot((), now, error=TelemetryError("not_found", _reason(exc), None,
                                                            "Install nvidia-ml-py, or use --source smi."))
        if not self._initialised:
            try:
                nvml.nvmlInit()
            except Exception as exc:
                return GpuSnapshot((), now, error=_init_error(exc))
            self._initialised = True
        if self._devices is None:
            error = self._open_devices(nvml)
            if error is not None:
                return GpuSnapshot((), now, error=error)
        devices = self._devices or []
        read_processes = (
            self._processes_read_at is None or now - self._processes_read_at >= self._process_interval_s
        )
        if read_processes:
            self._processes_read_at = now
        gpus = tuple(self._read_device(nvml, device, now, read_processes) for device in devices)
        if read_processes:
            listed = {p.pid for gpu in gpus for p in gpu.processes or ()}
            self._names = {pid: name for pid, name in self._names.items() if pid in listed}
        error = None
        if self._missing_indices:
            error = TelemetryError(
                kind="no_devices",
                message=f"GPU index {', '.join(map(str, self._missing_indices))} not found "
                f"({self._count} GPUs visible)",
                hint=FAILURE_HINTS["no_devices"],
            )
        return GpuSnapshot(gpus=gpus, taken_at=self._clock(), error=error)

    def _open_devices(self, nvml: Any) -> TelemetryError | None:
        try:
            self._count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            return _init_error(exc)
        wanted = self.indices if self.indices is not None else list(range(self._count))
        self._missing_indices = [i for i in wanted if i >= self._count]
        if not self._count or len(self._missing_indices) == len(wanted):
            return TelemetryError(
                kind="no_devices",
                message=f"NVML sees {self._count} GPUs" + (f"; asked for {wanted}" if self.indices else ""),
                hint=FAILURE_HINTS["no_devices"],
            )
        self._devices = [_Device(index=i) for i in wanted if i < self._count]
        return None

    def _open_handle(self, nvml: Any, device: _Device) -> str | None:
        """Create the handle and read uuid/name once; the reason when the handle cannot be had."""
        if device.handle is None:
            try:
                device.handle = nvml.nvmlDeviceGetHandleByIndex(device.index)
            except Exception as exc:
                return _reason(exc)
        for attr, function in (("uuid", "nvmlDeviceGetUUID"), ("name", "nvmlDeviceGetName")):
            if getattr(device, attr) in ("", None):
                try:
                    value = getattr(nvml, function)(device.handle)
                    setattr(device, attr, value.decode() if isinstance(value, bytes) else str(value))
                    device.static_unavailable.pop(attr, None)
                except Exception as exc:
                    device.static_unavailable[attr] = _reason(exc)
        return None

    def _read_device(self, nvml: Any, device: _Device, now: float, read_processes: bool) -> GpuSample:
        handle_error = self._open_handle(nvml, device)
        if handle_error is not None:
            fields = ("uuid", "name", "memory_used_mib", "memory_total_mib", "utilization_pct",
                      "temperature_c", "power_w", "processes")
            return GpuSample(index=device.index, uuid="", name=None, memory_used_mib=None,
                             memory_total_mib=None, unavailable=dict.fromkeys(fields, handle_error),
                             taken_at=now, source="nvml")
        unavailable = dict(device.static_unavailable)
        used, total = self._memory(nvml, device, unavailable)
        if device.slow_at is None or now - device.slow_at >= self._slow_interval_s:
            slow_unavailable: dict[str, str] = {}
            utilization = self._call(
                "utilization_pct",
                slow_unavailable,
                lambda: int(nvml.nvmlDeviceGetUtilizationRates(device.handle).gpu),
            )
            temperature = self._call(
                "temperature_c",
                slow_unavailable,
                lambda: int(nvml.nvmlDeviceGetTemperature(device.handle, nvml.NVML_TEMPERATURE_GPU)),
            )
            power_mw = self._call(
                "power_w", slow_unavailable, lambda: int(nvml.nvmlDeviceGetPowerUsage(device.handle))
            )
            device.slow = (utilization, temperature, power_mw, slow_unavailable)
            device.slow_at = now
        utilization, temperature, power_mw, slow_unavailable = device.slow
        unavailable.update(slow_unavailable)
        if read_processes:
            self._read_processes(nvml, device, now)
        if device.processes is None:
            unavailable["processes"] = device.processes_reason
        return GpuSample(
            index=device.index,
            uuid=device.uuid,
            name=device.name,
            memory_used_mib=used,
            memory_total_mib=total,
            utilization_pct=utilization,
            temperature_c=temperature,
            power_w=None if power_mw is None else round(power_mw / 1000, 3),
            processes=device.processes,
            unavailable=unavailable,
            taken_at=now,
            source="nvml",
            processes_taken_at=device.processes_taken_at if device.processes is not None else None,
            memory_api=device.memory_api,
        )

    @staticmethod
    def _call(name: str, unavailable: dict[str, str], read: Callable[[], int]) -> int | None:
        try:
            return read()
        except Exception as exc:
            unavailable[name] = _reason(exc)
            return None

    def _memory(self, nvml: Any, device: _Device, unavailable: dict[str, str]) -> tuple[int | None, int | None]:
        function_not_found = getattr(nvml, "NVMLError_FunctionNotFound", ())
        info = None
        version = getattr(nvml, "nvmlMemory_v2", None)
        try:
            if device.memory_api != "nvml_v1" and version is not None:
                try:
                    info = nvml.nvmlDeviceGetMemoryInfo(device.handle, version=version)
                    device.memory_api = "nvml_v2"
                except function_not_found:
                    device.memory_api = "nvml_v1"
                except TypeError:  # a binding older than the version parameter
                    device.memory_api = "nvml_v1"
            if info is None:
                info = nvml.nvmlDeviceGetMemoryInfo(device.handle)
                device.memory_api = "nvml_v1"
        except Exception as exc:
            unavailable["memory_used_mib"] = unavailable["memory_total_mib"] = _reason(exc)
            return None, None
        return round(int(info.used) / _MIB), round(int(info.total) / _MIB)

    def _read_processes(self, nvml: Any, device: _Device, now: float) -> None:
        step_down: tuple[type[BaseException], ...] = tuple(
            cls
            for cls in (getattr(nvml, "NVMLError_FunctionNotFound", None),
                        getattr(nvml, "NVMLLibraryMismatchError", None))
            if isinstance(cls, type)
        )
        start = [api for api, _ in _PROCESS_FUNCTIONS].index(self.process_api) if self.process_api else 0
        last_reason = "no compute-process function in this NVML binding"
        for api, function_name in _PROCESS_FUNCTIONS[start:]:
            function = getattr(nvml, function_name, None)
            if function is None:
                continue
            try:
                infos = function(device.handle)
            except step_down as exc:
                last_reason = _reason(exc)
                continue
            except Exception as exc:
                device.processes, device.processes_reason = None, _reason(exc)
                device.processes_taken_at = None
                return
            self.process_api = api
            device.processes = tuple(self._process(info, device.uuid) for info in infos)
            device.processes_taken_at = now
            return
        device.processes, device.processes_reason, device.processes_taken_at = None, last_reason, None

    def _process(self, info: Any, gpu_uuid: str) -> GpuProcess:
        pid = int(info.pid)
        used = getattr(info, "usedGpuMemory", None)
        return GpuProcess(
            pid=pid,
            name=self._names.get(pid) or self._names.setdefault(pid, self._process_name(pid)),
            used_mib=None if used is None else round(int(used) / _MIB),
            gpu_uuid=gpu_uuid,
        )

    def _process_name(self, pid: int) -> str:
        folder = self._proc_root / str(pid)
        with contextlib.suppress(OSError):
            parts = [p for p in (folder / "cmdline").read_bytes().split(b"\0") if p]
            if parts:
                return " ".join(p.decode(errors="replace") for p in parts)
        with contextlib.suppress(OSError):
            comm = (folder / "comm").read_text(errors="replace").strip()
            if comm:
                return comm
        return "[unknown]"


def release_sampler(
    indices: Sequence[int] | None,
    nvml: Any,
    period_ms: int = RELEASE_PERIOD_MS,
    *,
    proc_root: str = "/proc",
    clock: Callable[[], float] = time.monotonic,
) -> NvmlTelemetry:
    """An NvmlTelemetry for a pending release (see NvmlTelemetry.for_release); `nvml` None is pynvml itself."""
    return NvmlTelemetry(
        indices,
        nvml=nvml,
        proc_root=proc_root,
        process_interval_s=0.0,  # a fresh process list with every memory reading
        clock=clock,
        min_period_ms=1,
        slow_interval_s=RELEASE_SLOW_S,
    )


def _init_error(exc: BaseException) -> TelemetryError:
    kind, hint = _INIT_ERRORS.get(type(exc).__name__, ("other", "other"))
    return TelemetryError(
        kind=kind,
        message=f"NVML: {_reason(exc)}",
        hint=FAILURE_HINTS[hint] if hint != "other" else "NVML failed to start: try --source smi.",
    )
