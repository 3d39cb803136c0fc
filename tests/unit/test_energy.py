"""Energy over a window: NVML counter differences (a wrap, a reset, an unsupported GPU), the power.draw integral on
known samples, the summary["energy"] dict, goodput on known request results and the bench's printed lines."""

from __future__ import annotations

import bisect
import random
import statistics
from pathlib import Path
from typing import Any

import pynvml
import pytest

from app.core.measure.bench import NOT_MEASURED, BenchSpec, BenchSummary, meets_slo, summarize, summary_lines
from app.core.measure.client import RequestResult
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import ProfileError
from app.core.telemetry.energy import (
    COUNTER_MODULUS,
    METHOD_NVML,
    METHOD_SMI,
    EnergyReading,
    NoEnergyMeter,
    NvmlEnergyMeter,
    counter_delta_mj,
    energy_meter_for,
    trapezoid_joules,
)
from app.core.telemetry.nvml import NvmlTelemetry
from tests.fakes import CommandOnlyHost
from tests.helpers import DATA

H200 = DATA / "h200"
ENERGY_KEYS = {"method", "joules", "gpus", "mean_w_per_gpu", "output_tokens", "j_per_token", "tokens_per_j"}


# ---- counter differences ------------------------------------------------------------------------------------

def test_counter_difference_plain_and_across_the_wrap() -> None:
    assert counter_delta_mj(1_000_000, 1_456_000, 1.07) == (456_000, "")  # the H200 figure: 456 J in 1.07 s
    # an unsigned 64-bit counter that passes its top comes back small: the difference is taken modulo 2**64
    assert counter_delta_mj(COUNTER_MODULUS - 1500, 500, 1.0) == (2000, "")


def test_counter_that_went_backwards_is_a_reset_never_a_figure() -> None:
    delta, why = counter_delta_mj(9_876_543_210, 12_000, 2.0)  # the driver reloaded: the counter restarted at 0
    assert delta is None
    assert "went backwards" in why and "driver" in why


def test_counter_jump_beyond_any_gpu_is_refused() -> None:
    delta, why = counter_delta_mj(0, 50_000_000, 1.0)  # 50 kJ in a second: 50 kW on one GPU
    assert delta is None and "jumped" in why


# ---- the trapezoid integral ----------------------------------------------------------------------------------

def test_trapezoid_on_a_constant_and_a_ramp() -> None:
    constant = [(i / 10, 100.0) for i in range(0, 12)]
    joules, why = trapezoid_joules(constant, 0.05, 1.05, max_gap_s=1.0)
    assert why == "" and joules == pytest.approx(100.0)
    ramp = [(0.0, 0.0), (1.0, 100.0)]  # 100 W/s: the integral over [0.25, 0.75] is 50 * (0.75^2 - 0.25^2) = 25
    assert trapezoid_joules(ramp, 0.25, 0.75, max_gap_s=2.0)[0] == pytest.approx(25.0)
    steps = [(0.0, 200.0), (0.5, 200.0), (0.5, 400.0), (1.0, 400.0)]  # 0.5 s at 200 W, 0.5 s at 400 W
    assert trapezoid_joules(steps, 0.0, 1.0, max_gap_s=1.0)[0] == pytest.approx(300.0)


def test_trapezoid_bridges_a_missing_sample_but_not_a_long_gap() -> None:
    assert trapezoid_joules([(0.0, 100.0), (0.5, None), (1.0, 100.0)], 0.0, 1.0, max_gap_s=1.5)[0] == \
        pytest.approx(100.0)
    joules, why = trapezoid_joules([(0.0, 100.0), (3.0, 100.0)], 0.0, 3.0, max_gap_s=1.0)
    assert joules is None and "3.0 s" in why
    joules, why = trapezoid_joules([(0.0, None), (0.5, None)], 0.0, 0.5, max_gap_s=1.0)
    assert joules is None and why == "no readable power sample"
    # the window runs on past the last sample: held for at most max_gap_s, else unavailable
    assert trapezoid_joules([(0.0, 50.0), (0.4, 50.0)], 0.0, 1.0, max_gap_s=1.0)[0] == pytest.approx(50.0)
    assert trapezoid_joules([(0.0, 50.0), (0.4, 50.0)], 0.0, 2.0, max_gap_s=1.0)[0] is None


# ---- NVML's counter through a fake pynvml (the real package's exception classes) ----------------------------

class EnergyNvml:
    """The pynvml functions the energy meter uses; each GPU's counter is a list of values read in turn."""

    NVMLError = pynvml.NVMLError
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound

    def __init__(self, counters: dict[int, list[int] | BaseException]) -> None:
        self.counters = counters
        self.reads = 0

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return len(self.counters)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-0000000{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self.reads += 1
        values = self.counters[handle]
        if isinstance(values, BaseException):
            raise values
        return values.pop(0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _nvml_window(counters: dict[int, list[int] | BaseException], seconds: float) -> EnergyReading:
    clock = Clock()
    fake = EnergyNvml(counters)
    meter = NvmlEnergyMeter(sorted(counters), telemetry=NvmlTelemetry(sorted(counters), nvml=fake, clock=clock),
                            clock=clock, sync_edges=False)
    await meter.start()
    clock.now += seconds
    reading = await meter.stop()
    assert fake.reads == 2 * len(counters)  # each counter read at the two edges only
    return reading


async def test_nvml_meter_two_gpus() -> None:
    reading = await _nvml_window({0: [10_000_000, 10_428_000], 1: [20_000_000, 20_400_000]}, 1.0)
    assert reading.method == METHOD_NVML and reading.joules_per_gpu == (428.0, 400.0)
    assert reading.mean_w_per_gpu == pytest.approx([428.0, 400.0])
    energy = reading.to_json(1000)
    assert energy is not None and set(energy) == ENERGY_KEYS
    assert energy == {"method": METHOD_NVML, "joules": 828.0, "gpus": 2, "mean_w_per_gpu": [428.0, 400.0],
                      "output_tokens": 1000, "j_per_token": pytest.approx(0.828),
                      "tokens_per_j": pytest.approx(1000 / 828)}


async def test_nvml_meter_across_a_wrap() -> None:
    reading = await _nvml_window({0: [COUNTER_MODULUS - 100_000, 328_000]}, 1.0)
    assert reading.joules_per_gpu == (428.0,)


async def test_nvml_meter_across_a_relaunch_of_the_driver_says_so() -> None:
    reading = await _nvml_window({0: [10_000_000, 10_400_000], 1: [7_000_000_000, 3_000]}, 1.0)
    assert reading.joules is None and reading.to_json(1000) is None  # unavailable, never 0
    assert "GPU 1" in reading.note and "went backwards" in reading.note and "NVML" in reading.note


async def test_nvml_gpu_without_the_counter_is_unavailable() -> None:
    reading = await _nvml_window({0: [1_000, 2_000], 1: pynvml.NVMLError_NotSupported()}, 1.0)
    assert reading.joules is None and reading.mean_w_per_gpu is None and reading.to_json(500) is None
    assert "GPU 1" in reading.note and "NotSupported" in reading.note


class ReplayNvml(EnergyNvml):
    """GPU 0's counter as the H200 recording read it: the value of the latest recorded read at the clock's time
    (the real counter's ~100 ms steps); each read costs 3 ms of the clock, as on the H200."""

    def __init__(self, clock: Clock) -> None:
        super().__init__({0: []})
        rows = [line.split() for line in (H200 / "energy_counter_reads.txt").read_text().splitlines()]
        self.times = [float(t) for t, _ in rows]
        self.values = [int(mj) for _, mj in rows]
        self.clock = clock

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self.reads += 1
        self.clock.now += 0.003
        return self.values[bisect.bisect_right(self.times, self.clock.now) - 1]

    def truth_j(self, start: float, end: float) -> float:
        """The energy between two moments on the line through the counter's steps (each step's moment: halfway
        between the reads around it, 20 ms apart)."""
        steps = [(self.times[0], self.values[0])] + [
            ((self.times[i - 1] + self.times[i]) / 2, self.values[i])
            for i in range(1, len(self.values)) if self.values[i] != self.values[i - 1]]
        moments = [t for t, _ in steps]

        def at(t: float) -> float:
            i = bisect.bisect_right(moments, t)
            (t0, e0), (t1, e1) = steps[i - 1], steps[i]
            return e0 + (e1 - e0) * (t - t0) / (t1 - t0)

        return (at(end) - at(start)) / 1000


async def test_synced_edges_on_the_h200_recording() -> None:
    """Windows of 4 s at random moments of a real recording: the edges placed on the counter's steps are within
    0.5 % of the energy on the line through the steps; two plain reads are off by up to a step per edge."""
    clock = Clock()
    fake = ReplayNvml(clock)
    rng = random.Random(15)
    errors: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(40):
        begin = rng.uniform(fake.times[0] + 6, fake.times[-1] - 6)
        for sync in (True, False):
            clock.now = begin
            meter = NvmlEnergyMeter([0], telemetry=NvmlTelemetry([0], nvml=fake, clock=clock), clock=clock,
                                    sync_edges=sync)
            await meter.start()
            clock.now += 4.0
            reading = await meter.stop()
            assert reading.joules is not None
            errors[sync].append(abs(reading.joules / fake.truth_j(reading.started_at, reading.ended_at) - 1))
    synced, plain = sorted(errors[True]), sorted(errors[False])
    assert synced[int(0.95 * len(synced))] < 0.005
    assert statistics.fmean(synced) < statistics.fmean(plain)


def test_meter_choice_by_profile_host() -> None:
    class Profile:
        def __init__(self, host: str, gpus: tuple[int, ...]) -> None:
            self.host, self.gpus = host, gpus

    class Local(CommandOnlyHost):
        is_local = True

    assert energy_meter_for(Local(), Profile("sim", (0, 1))).method == METHOD_SMI  # the sim's power model
    assert energy_meter_for(CommandOnlyHost(), Profile("ssh://gpu-box", (0,))).method == METHOD_SMI
    assert energy_meter_for(Local(), Profile("local", (0,))).method == METHOD_NVML
    assert isinstance(energy_meter_for(Local(), Profile("local", ())), NoEnergyMeter)


# ---- the bench summary: energy, goodput, printed lines --------------------------------------------------------

def _result(ttft_ms: float, tpot_ms: float, tokens: int = 11, ok: bool = True) -> RequestResult:
    ttft = ttft_ms / 1000
    return RequestResult(ok=ok, output_tokens=tokens, ttft_s=ttft, latency_s=ttft + tpot_ms / 1000 * (tokens - 1),
                         error="" if ok else "HTTP 500")


def test_goodput_on_known_requests() -> None:
    results = [_result(100, 20), _result(300, 20), _result(100, 60), _result(100, 20, ok=False), _result(50, 0, 1)]
    assert [meets_slo(r, 200, 50) for r in results] == [True, False, False, False, True]  # one token: no TPOT
    summary = summarize(results, 2.0, slo_ttft_ms=200, slo_tpot_ms=50)
    assert summary.slo == {"ttft_ms": 200, "tpot_ms": 50} and summary.slo_met == 2
    assert summary.goodput_rps == pytest.approx(1.0) and summary.request_rate == pytest.approx(2.0)
    only_ttft = summarize(results, 2.0, slo_ttft_ms=200)
    assert only_ttft.slo_met == 3  # 100, 100 (TPOT not judged) and 50 ms; the failed one never counts
    none = summarize(results, 2.0)
    assert (none.slo, none.slo_met, none.goodput_rps) == (None, None, None)


def test_summary_energy_fields_and_lines() -> None:
    results = [_result(100, 20, tokens=100) for _ in range(4)]
    reading = EnergyReading(METHOD_SMI, (0, 1), 2.0, (500.0, 300.0), samples=40)
    typed = summarize(results, 2.0, slo_ttft_ms=150, energy=reading)
    summary = typed.to_json()
    assert set(summary["energy"]) == ENERGY_KEYS and summary["energy_note"] == ""
    assert summary["energy"]["j_per_token"] == pytest.approx(2.0) and summary["energy"]["mean_w_per_gpu"] == \
        [250.0, 150.0]
    assert BenchSummary.from_json(summary) == typed  # the store's JSON reads back as the same summary
    energy_line, goodput_line = summary_lines(typed)
    assert energy_line == ("energy (nvidia-smi power.draw integral): 800.0 J on 2 GPUs, mean 250.0, 150.0 W per GPU; "
                           "2 J/token, 0.5 tokens/J")
    assert goodput_line == "goodput: 2 req/s within TTFT <= 150 ms (4 of 4 requests); throughput 2 req/s"


def test_unavailable_energy_prints_why_never_zero() -> None:
    results = [_result(100, 20, tokens=100)]
    missing = EnergyReading(METHOD_SMI, (0, 1), 2.0, None, "GPU 1: power.draw [N/A]")
    typed = summarize(results, 1.0, energy=missing)
    summary: dict[str, Any] = typed.to_json()
    assert summary["energy"] is None
    assert summary_lines(typed) == ["energy: unavailable (nvidia-smi power.draw integral: GPU 1: power.draw [N/A])"]
    unmetered = summarize(results, 1.0)
    assert unmetered.energy is None and unmetered.energy_note == NOT_MEASURED
    assert summary_lines(unmetered) == [f"energy: unavailable ({NOT_MEASURED})"]


def test_slos_from_the_bench_table(tmp_path: Path) -> None:
    base = 'backend="sglang"\nmodel="m"\n[bench]\n'
    profile = parse_profile(base + "slo_ttft_ms = 500\nslo_tpot_ms = 22.5\n", tmp_path / "p.toml")
    spec = BenchSpec.from_settings(profile.bench)
    assert (spec.slo_ttft_ms, spec.slo_tpot_ms) == (500.0, 22.5) and spec.to_json()["slo_tpot_ms"] == 22.5
    assert BenchSpec.from_settings(parse_profile(base, tmp_path / "q.toml").bench).slo_ttft_ms is None
    for bad in ("0", "-3", '"fast"', "true"):
        with pytest.raises(ProfileError, match=r"p\.toml: bench\.slo_ttft_ms: expected a number of milliseconds"):
            parse_profile(base + f"slo_ttft_ms = {bad}\n", tmp_path / "p.toml")
