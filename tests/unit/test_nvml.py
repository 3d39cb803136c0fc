"""NvmlTelemetry against a fake pynvml built from the real package's classes and the H200 facts of docs/gpus.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest

from app.core.telemetry.nvml import NvmlTelemetry

MIB = 1024 * 1024
TOTAL = 143771 * MIB
RESERVED = 644_939_776  # 615 MiB: v1 counts it as used on an idle H200, v2 reports it apart
CONTEXT_DEVICE = 552_402_944  # v2 used with one bare CUDA context: 527 MiB (same as nvidia-smi)
CONTEXT_PROCESS = 543_162_368  # that process's usedGpuMemory: 518 MiB
NO_MIG = 0xFFFFFFFF


class Handle:
    """Stands in for pynvml.c_nvmlDevice_t: an opaque object compared by identity."""

    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """The pynvml functions NvmlTelemetry uses, with the real return types and exception classes."""

    NVMLError = pynvml.NVMLError
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, gpus: int = 1, *, has_v2_memory: bool = True, process_api: str = "v3") -> None:
        self.gpus = gpus
        self.has_v2_memory = has_v2_memory
        self.process_api = process_api  # the newest process symbol the "driver" has
        self.calls: dict[str, int] = {}
        self.fail: dict[str, BaseException] = {}  # function name -> exception to raise
        self.context = False  # one bare CUDA context on GPU 0
        self.process_memory: int | None = CONTEXT_PROCESS
        self.init_error: BaseException | None = None

    def _enter(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.fail:
            raise self.fail[name]

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if index >= self.gpus:
            raise pynvml.NVMLError_InvalidArgument()
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._enter("nvmlDeviceGetUUID")
        return f"GPU-529c853d-7a5b-f0b8-3c1e-2d4b5e6f7a8{handle.index}"

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._enter("nvmlDeviceGetName")
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        used = CONTEXT_DEVICE if self.context and handle.index == 0 else 0
        if version:
            self._enter("nvmlDeviceGetMemoryInfo_v2")
            if not self.has_v2_memory:
                raise pynvml.NVMLError_FunctionNotFound()
            return pynvml.c_nvmlMemory_v2_t(
                version=version, total=TOTAL, reserved=RESERVED, free=TOTAL - RESERVED - used, used=used
            )
        self._enter("nvmlDeviceGetMemoryInfo")
        return pynvml.c_nvmlMemory_t(total=TOTAL, free=TOTAL - RESERVED - used, used=RESERVED + used)

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=0, memory=0)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature")
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 38

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage")
        return 127_830  # milliwatts

    def _processes(self, name: str, api: str, handle: Handle) -> list[Any]:
        self._enter(name)
        order = ["v1", "v2", "v3"]
        if order.index(api) > order.index(self.process_api):
            raise pynvml.NVMLError_FunctionNotFound()
        if not (self.context and handle.index == 0):
            return []
        info = {"pid": 48921, "usedGpuMemory": self.process_memory}
        if api != "v1":
            info |= {"gpuInstanceId": NO_MIG, "computeInstanceId": NO_MIG}
        return [pynvml.nvmlFriendlyObject(info)]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", "v3", handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", "v2", handle)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses", "v1", handle)


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "48921").mkdir()
    (tmp_path / "48921" / "cmdline").write_bytes(b"python3\0-m\0sglang.launch_server\0--tp\0001\0")
    return tmp_path


def telemetry(fake: FakeNvml, proc_root: Path | None = None, **kwargs: Any) -> NvmlTelemetry:
    return NvmlTelemetry(nvml=fake, proc_root=str(proc_root or "/nonexistent"), **kwargs)


async def test_idle_h200_reads_zero_mib_with_v2_semantics() -> None:
    fake = FakeNvml()
    t = telemetry(fake)
    snapshot = await t.sample()
    assert snapshot.error is None
    (gpu,) = snapshot.gpus
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (0, 143771)  # not 615: reserved is not "used"
    assert gpu.memory_api == "nvml_v2"
    assert t.memory_api == {0: "nvml_v2"}
    assert (gpu.utilization_pct, gpu.temperature_c, gpu.power_w) == (0, 38, 127.83)
    assert gpu.processes == ()
    assert (gpu.uuid, gpu.name, gpu.source) == ("GPU-529c853d-7a5b-f0b8-3c1e-2d4b5e6f7a80", "NVIDIA H200", "nvml")
    assert gpu.unavailable == {}


async def test_old_driver_falls_back_to_v1_once_and_says_so() -> None:
    fake = FakeNvml(has_v2_memory=False)
    t = telemetry(fake)
    first = await t.sample()
    second = await t.sample()
    assert first.gpus[0].memory_used_mib == 615  # v1 counts driver-reserved memory
    assert first.gpus[0].memory_api == second.gpus[0].memory_api == "nvml_v1"
    assert "memory_used_mib" not in first.gpus[0].unavailable
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1  # not retried every sample


async def test_one_cuda_context_v2_matches_nvidia_smi_and_process_is_named(proc: Path) -> None:
    fake = FakeNvml()
    fake.context = True
    gpu = (await telemetry(fake, proc).sample()).gpus[0]
    assert gpu.memory_used_mib == 527
    (process,) = gpu.processes or ()
    assert (process.pid, process.used_mib, process.gpu_uuid) == (48921, 518, gpu.uuid)
    assert process.name == "python3 -m sglang.launch_server --tp 1"
    assert gpu.processes_taken_at is not None


async def test_v1_with_one_context_counts_reserved_too() -> None:
    fake = FakeNvml(has_v2_memory=False)
    fake.context = True
    gpu = (await telemetry(fake).sample()).gpus[0]
    assert gpu.memory_used_mib == 1142


@pytest.mark.parametrize(("driver_has", "used"), [("v3", "v3"), ("v2", "v2"), ("v1", "v1")])
async def test_process_calls_step_down_on_function_not_found(driver_has: str, used: str) -> None:
    fake = FakeNvml(process_api=driver_has)
    fake.context = True
    t = telemetry(fake, process_interval_s=0.0)
    await t.sample()
    gpu = (await t.sample()).gpus[0]
    assert t.process_api == used
    assert [p.pid for p in gpu.processes or ()] == [48921]
    if driver_has != "v3":  # the failing newer symbols are not tried again on the second sample
        assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1


async def test_binding_version_mismatch_error_also_steps_down() -> None:
    fake = FakeNvml()
    fake.context = True
    fake.fail["nvmlDeviceGetComputeRunningProcesses_v3"] = pynvml.NVMLLibraryMismatchError("unversioned")
    t = telemetry(fake)
    gpu = (await t.sample()).gpus[0]
    assert t.process_api == "v2"
    assert len(gpu.processes or ()) == 1


async def test_wddm_none_process_memory_is_unknown_not_zero() -> None:
    fake = FakeNvml()
    fake.context = True
    fake.process_memory = None
    (process,) = (await telemetry(fake).sample()).gpus[0].processes or ()
    assert process.used_mib is None


@pytest.mark.parametrize(
    ("function", "field", "error"),
    [
        ("nvmlDeviceGetUtilizationRates", "utilization_pct", pynvml.NVMLError_NotSupported()),
        ("nvmlDeviceGetTemperature", "temperature_c", pynvml.NVMLError_Unknown()),
        ("nvmlDeviceGetPowerUsage", "power_w", pynvml.NVMLError_NotSupported()),
        ("nvmlDeviceGetMemoryInfo_v2", "memory_used_mib", pynvml.NVMLError_NoPermission()),
        ("nvmlDeviceGetComputeRunningProcesses_v3", "processes", pynvml.NVMLError_GpuIsLost()),
        ("nvmlDeviceGetName", "name", pynvml.NVMLError_GpuIsLost()),
    ],
)
async def test_each_failing_call_is_none_with_the_nvml_error(function: str, field: str, error: Exception) -> None:
    fake = FakeNvml()
    fake.fail[function] = error
    snapshot = await telemetry(fake).sample()
    assert snapshot.error is None
    gpu = snapshot.gpus[0]
    assert getattr(gpu, field) is None
    assert gpu.unavailable[field] == f"{type(error).__name__}: {error}"
    assert str(error) in gpu.unavailable[field]  # e.g. "NVMLError_NotSupported: Not Supported"
    others = {"utilization_pct", "temperature_c", "power_w", "memory_used_mib"} - {field}
    assert all(getattr(gpu, name) is not None for name in others)


async def test_memory_no_permission_in_a_mig_container_does_not_fall_back_to_v1() -> None:
    fake = FakeNvml()
    fake.fail["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVMLError_NoPermission()
    gpu = (await telemetry(fake).sample()).gpus[0]
    assert gpu.memory_used_mib is None and gpu.memory_total_mib is None
    assert "Insufficient Permissions" in gpu.unavailable["memory_total_mib"]
    assert "nvmlDeviceGetMemoryInfo" not in fake.calls  # v1 would report reserved memory as used


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (pynvml.NVMLError_LibraryNotFound(), "not_found"),
        (pynvml.NVMLError_DriverNotLoaded(), "driver"),
        (pynvml.NVMLError_NoPermission(), "permission"),
        (pynvml.NVMLError_LibRmVersionMismatch(), "driver"),
        (pynvml.NVMLError_Unknown(), "driver"),
        (pynvml.NVMLError_OperatingSystem(), "permission"),
        (pynvml.NVMLError_FunctionNotFound(), "driver"),
        (pynvml.NVMLError_Uninitialized(), "other"),
    ],
)
async def test_init_failures_become_error_snapshots_and_are_retried(error: Exception, kind: str) -> None:
    fake = FakeNvml()
    fake.init_error = error
    t = telemetry(fake)
    snapshot = await t.sample()
    assert snapshot.gpus == ()
    assert snapshot.error is not None
    assert snapshot.error.kind == kind
    assert str(error) in snapshot.error.message
    assert snapshot.error.hint
    fake.init_error = None
    recovered = await t.sample()
    assert recovered.error is None
    assert len(recovered.gpus) == 1


async def test_init_and_handles_happen_once_and_close_shuts_down_once() -> None:
    fake = FakeNvml(gpus=2)
    t = telemetry(fake)
    for _ in range(3):
        snapshot = await t.sample()
    assert [g.index for g in snapshot.gpus] == [0, 1]
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2
    assert fake.calls["nvmlDeviceGetUUID"] == 2
    await t.close()
    await t.close()
    assert fake.calls["nvmlShutdown"] == 1


async def test_lost_handle_is_all_none_and_retried() -> None:
    fake = FakeNvml()
    fake.fail["nvmlDeviceGetHandleByIndex"] = pynvml.NVMLError_GpuIsLost()
    t = telemetry(fake)
    gpu = (await t.sample()).gpus[0]
    assert gpu.memory_used_mib is None and gpu.processes is None
    assert gpu.unavailable["memory_used_mib"] == "NVMLError_GpuIsLost: GPU is lost"
    del fake.fail["nvmlDeviceGetHandleByIndex"]
    assert (await t.sample()).gpus[0].memory_used_mib == 0


async def test_indices_select_gpus_and_unknown_index_is_reported() -> None:
    fake = FakeNvml(gpus=2)
    snapshot = await NvmlTelemetry(indices=[1, 5], nvml=fake).sample()
    assert [g.index for g in snapshot.gpus] == [1]
    assert snapshot.error is not None
    assert snapshot.error.kind == "no_devices"
    assert "5" in snapshot.error.message
    none = await NvmlTelemetry(nvml=FakeNvml(gpus=0)).sample()
    assert none.error is not None
    assert none.error.kind == "no_devices"


async def test_process_list_is_read_at_most_every_interval(proc: Path) -> None:
    clock = Clock()
    fake = FakeNvml()
    fake.context = True
    t = telemetry(fake, proc, clock=clock, process_interval_s=1.0)
    first = (await t.sample()).gpus[0]
    clock.now += 0.3
    fake.context = False  # the process exits, but the list is not due yet
    second = (await t.sample()).gpus[0]
    assert second.processes == first.processes
    assert second.processes_taken_at == first.processes_taken_at == 50.0
    clock.now += 1.0
    third = (await t.sample()).gpus[0]
    assert third.processes == ()
    assert third.processes_taken_at == 51.3
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2


async def test_the_release_sibling_sees_a_process_leave_at_once(proc: Path) -> None:
    clock = Clock()
    fake = FakeNvml()
    fake.context = True
    dashboard = telemetry(fake, proc, clock=clock, process_interval_s=1.0)
    assert (await dashboard.sample()).gpus[0].processes
    release = dashboard.for_release()
    assert (await release.sample()).gpus[0].processes
    clock.now += 0.06
    fake.context = False  # the server was killed: the dashboard's list is not due for a second
    assert (await dashboard.sample()).gpus[0].processes
    assert (await release.sample()).gpus[0].processes == ()
    await release.close()
    assert (await dashboard.sample()).error is None  # the sibling's close leaves the dashboard's NVML open


def test_process_names_from_cmdline_then_comm_then_unknown(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cmdline").write_bytes(b"")  # kernel thread or zombie
    (tmp_path / "7" / "comm").write_text("sglang::schedul\n")
    t = NvmlTelemetry(nvml=FakeNvml(), proc_root=str(tmp_path))
    assert t._process_name(7) == "sglang::schedul"
    assert t._process_name(8) == "[unknown]"  # another PID namespace, or gone


async def test_stream_yields_snapshots() -> None:
    t = telemetry(FakeNvml(), process_interval_s=0.0)
    stream = t.stream(period_ms=100)
    snapshots = [await anext(stream), await anext(stream)]
    await stream.aclose()
    assert all(s.error is None and len(s.gpus) == 1 for s in snapshots)


async def test_stream_keeps_going_after_init_errors() -> None:
    fake = FakeNvml()
    fake.init_error = pynvml.NVMLError_DriverNotLoaded()
    t = NvmlTelemetry(nvml=fake, backoff_s=(0.0, 0.0))
    stream = t.stream(period_ms=100)
    first = await anext(stream)
    fake.init_error = None
    second = await anext(stream)
    await stream.aclose()
    assert first.error is not None
    assert first.error.kind == "driver"
    assert second.error is None


async def test_the_real_pynvml_on_this_machine_never_raises() -> None:
    # No libnvidia-ml here: LibraryNotFound as an error snapshot. On a GPU host: real readings.
    t = NvmlTelemetry()
    snapshot = await t.sample()
    await t.close()
    if snapshot.error is not None:
        assert snapshot.error.kind in {"not_found", "driver", "permission", "no_devices"}
        assert snapshot.error.hint
    else:
        assert snapshot.gpus
        assert all(g.memory_api in {"nvml_v2", "nvml_v1"} for g in snapshot.gpus)
