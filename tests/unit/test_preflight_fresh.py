"""A relaunch's launch reads the GPUs from the release watch's last sample when it is fresh (preflight.fresh_sample):
only when every GPU of the profile was read, memory and process list both, within FRESH_SAMPLE_S."""

from __future__ import annotations

from app.core.data import GpuSample, GpuSnapshot, TelemetryError
from app.core.server.preflight import FRESH_SAMPLE_S, fresh_sample


def gpu(index: int, taken: float, procs_taken: float | None = None) -> GpuSample:
    return GpuSample(index, f"GPU-{index}", "H200", 0, 143771, processes=(), taken_at=taken,
                     processes_taken_at=procs_taken, memory_api="nvml_v2")


def test_a_fresh_complete_sample_stands_for_a_new_read() -> None:
    snap = GpuSnapshot((gpu(0, 99.9, 99.95), gpu(1, 99.9)), 99.9)
    assert fresh_sample(snap, [0, 1], now=100.0) is snap


def test_an_old_memory_or_process_list_a_missing_gpu_or_an_error_does_not() -> None:
    old = 100.0 - FRESH_SAMPLE_S - 0.01
    assert fresh_sample(GpuSnapshot((gpu(0, old), gpu(1, 99.9)), 99.9), [0, 1], now=100.0) is None
    assert fresh_sample(GpuSnapshot((gpu(0, 99.9, old), gpu(1, 99.9)), 99.9), [0, 1], now=100.0) is None
    assert fresh_sample(GpuSnapshot((gpu(0, 99.9),), 99.9), [0, 1], now=100.0) is None
    error = TelemetryError("lost", "GPU is lost")
    assert fresh_sample(GpuSnapshot((gpu(0, 99.9), gpu(1, 99.9)), 99.9, error), [0, 1], now=100.0) is None
    assert fresh_sample(None, [0], now=100.0) is None
