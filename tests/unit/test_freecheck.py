"""FreeCheck: free only on consecutive clean samples; holders named; unreadable values never count as free."""

from app.core.data import GpuProcess, GpuSample, GpuSnapshot, TelemetryError
from app.core.telemetry.freecheck import FreeCheck, learn_baseline


def snap(*gpus: GpuSample) -> GpuSnapshot:
    return GpuSnapshot(gpus=gpus, taken_at=0.0)


def gpu(index: int, used: int | None, procs: tuple[GpuProcess, ...] | None = ()) -> GpuSample:
    unavailable = {} if used is not None else {"memory_used_mib": "[GPU is lost]"}
    return GpuSample(index, f"GPU-{index}", "NVIDIA RTX A6000", used, 49140, processes=procs, unavailable=unavailable)


def test_two_consecutive_clean_samples_confirm():
    check = FreeCheck((0, 1))
    first = check.feed(snap(gpu(0, 0), gpu(1, 0)))
    assert first.all_free and not first.confirmed
    assert check.feed(snap(gpu(0, 0), gpu(1, 0))).confirmed


def test_a_busy_sample_resets_the_streak():
    check = FreeCheck((0,))
    check.feed(snap(gpu(0, 0)))
    busy = check.feed(snap(gpu(0, 43000, (GpuProcess(77, "sglang::scheduler_TP0", 43000),))))
    assert not busy.all_free
    assert busy.holders[0].pid == 77 and busy.holders[0].used_mib == 43000
    assert not check.feed(snap(gpu(0, 0))).confirmed
    assert check.feed(snap(gpu(0, 0))).confirmed


def test_memory_without_visible_process_is_a_holder():
    verdict = FreeCheck((0,)).feed(snap(gpu(0, 814)))
    assert not verdict.all_free
    assert verdict.holders[0].pid is None
    assert "no visible process" in verdict.holders[0].describe()


def test_idle_noise_under_baseline_plus_tolerance_is_free():
    check = FreeCheck((0,), baseline_mib={0: 4})
    assert check.feed(snap(gpu(0, 60))).all_free
    assert not check.feed(snap(gpu(0, 69))).all_free


def test_unreadable_memory_is_never_free():
    verdict = FreeCheck((0,)).feed(snap(gpu(0, None)))
    assert not verdict.all_free
    assert "[GPU is lost]" in verdict.unreadable


def test_missing_process_list_is_not_free():
    verdict = FreeCheck((0,)).feed(snap(gpu(0, 0, None)))
    assert not verdict.all_free


def test_error_snapshot_is_not_free():
    error = TelemetryError("driver", "Failed to initialize NVML: Driver/library version mismatch", 18)
    verdict = FreeCheck((0,)).feed(GpuSnapshot((), 0.0, error=error))
    assert not verdict.all_free and "mismatch" in verdict.unreadable


def test_only_the_profiles_gpus_count():
    busy = gpu(1, 30000, (GpuProcess(9, "other", 30000),))
    assert FreeCheck((0,)).feed(snap(gpu(0, 0), busy)).all_free


def test_baseline_is_learned_and_capped():
    assert learn_baseline(snap(gpu(0, 4), gpu(1, 5000)), (0, 1)) == {0: 4, 1: 1024}
