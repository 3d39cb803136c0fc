"""Energy over a measured window, per GPU of a profile, with the method named: NVML's counter or power.draw's integral.

Public API:

- ``energy_meter_for(host, profile) -> EnergyMeter``: the meter a profile's GPUs get. A profile whose host is
  ``"local"`` reads NVML's total energy counter (``NvmlEnergyMeter``; where NVML cannot be loaded or started it
  integrates nvidia-smi's power.draw instead); an SSH host and the simulated host integrate streamed
  ``nvidia-smi --query-gpu=power.draw`` (``SmiEnergyMeter``); a profile with no GPUs gets ``NoEnergyMeter``.
- ``EnergyMeter``: ``await start()`` at the window's first edge, ``await stop() -> EnergyReading`` at its last;
  neither raises: whatever fails becomes a reading whose ``reason`` says why the energy is unavailable.
- ``EnergyReading``: per GPU joules (or None with the reason), the window, the method; ``to_json(tokens)`` is
  the ``summary["energy"]`` dict of a bench: exactly ``method, joules, gpus, mean_w_per_gpu, output_tokens,
  j_per_token, tokens_per_j``, or None when unavailable.
- Pure pieces, tested on known inputs: ``counter_delta_mj`` (a counter difference across a wrap; a counter
  that went backwards is a reset, never a figure) and ``trapezoid_joules`` (power samples -> joules over a
  window, gaps too long to bridge -> unavailable).

Rules (the figures behind them: docs/decisions.md#energy-per-token): an unreadable value is never 0; one GPU of
the profile without energy makes the whole window's energy unavailable (a J/token over some of the GPUs would
look better than it is); the window is the bench's measured requests, warm-up excluded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.hosts.base import Host
from app.core.tasks import TaskOwner
from app.core.telemetry.nvml import EnergyCounters, NvmlTelemetry
from app.core.telemetry.smi import SmiTelemetry

METHOD_NVML = "nvml_energy_counter"
"""NVML's nvmlDeviceGetTotalEnergyConsumption, read at the window's two edges."""
METHOD_SMI = "smi_power_integral"
"""The trapezoid integral of streamed nvidia-smi power.draw samples over the window."""
METHOD_NONE = "none"
METHOD_TEXT = {
    METHOD_NVML: "NVML total energy counter",
    METHOD_SMI: "nvidia-smi power.draw integral",
    METHOD_NONE: "no meter",
}

COUNTER_MODULUS = 2**64  # nvmlDeviceGetTotalEnergyConsumption is an unsigned long long of mJ
MAX_PLAUSIBLE_W = 5000.0  # above any one GPU's board power (H200 700 W, B200 1000 W): a jump beyond is a reset
SMI_PERIOD_MS = 100
FIRST_SAMPLE_TIMEOUT_S = 10.0
SYNC_TIMEOUT_S = 0.35  # an H200's counter steps every ~100 ms: two steps at a start edge, one at a stop edge
SYNC_MAX_READS = 400  # nvidia-smi over SSH, or a slow host, can take seconds to print its first line


def counter_delta_mj(start_mj: int, end_mj: int, window_s: float, *, modulus: int = COUNTER_MODULUS,
                     max_w: float = MAX_PLAUSIBLE_W) -> tuple[int | None, str]:
    """The energy a counter counted between two reads, or (None, why).

    A counter below its start either wrapped (the difference modulo `modulus` is then small enough for the
    window) or was reset (a driver reload, a GPU reset: the counter restarts from 0). A difference that would
    mean more than `max_w` watts over the window is a reset too, and no figure is given for it.
    """
    if start_mj < 0 or end_mj < 0 or window_s < 0:
        return None, f"counter read as a negative value ({start_mj} -> {end_mj} mJ)"
    ceiling = max_w * max(window_s, 1e-3) * 1000  # mJ
    if end_mj >= start_mj:
        delta = end_mj - start_mj
        if delta > ceiling:
            return None, (f"energy counter jumped by {delta / 1000:.0f} J in {window_s:.2f} s (over {max_w:.0f} W): "
                          "the counter was reset or replaced during the window")
        return delta, ""
    wrapped = end_mj + modulus - start_mj
    if 0 <= wrapped <= ceiling:
        return wrapped, ""
    return None, (f"energy counter went backwards ({start_mj} -> {end_mj} mJ): the driver was reloaded or the GPU "
                  "reset during the window; run the measurement again")


def trapezoid_joules(samples: Sequence[tuple[float, float | None]], start: float, end: float, *,
                     max_gap_s: float) -> tuple[float | None, str]:
    """Joules over [start, end] from (time, watts or None) samples, or (None, why).

    Linear between samples (the trapezoid rule) and at the edges (between the last sample before an edge and
    the first after it); held flat from the nearest sample where the window runs past the samples. A None
    sample (power.draw "[N/A]") is no value: the line bridges it, but when two readable samples around the
    window lie more than `max_gap_s` apart (an edge counts as a sample where none lies beyond it), the whole
    figure is unavailable, never 0.
    """
    if end < start:
        return None, "the window ends before it starts"
    valid = sorted((t, w) for t, w in samples if w is not None and math.isfinite(w) and w >= 0)
    if not valid:
        return None, "no readable power sample" if samples else "no power sample arrived"
    times = [t for t, _ in valid]
    before = [t for t in times if t <= start]
    after = [t for t in times if t >= end]
    anchors = [before[-1] if before else start, *(t for t in times if start < t < end), after[0] if after else end]
    worst = max(b - a for a, b in itertools.pairwise(anchors))
    if worst > max_gap_s:
        return None, f"power.draw unreadable for {worst:.1f} s around the window (more than {max_gap_s:.1f} s)"

    def at(t: float) -> float:
        if t <= times[0]:
            return valid[0][1]
        if t >= times[-1]:
            return valid[-1][1]
        i = next(k for k in range(1, len(times)) if times[k] >= t)
        (t0, w0), (t1, w1) = valid[i - 1], valid[i]
        return w0 if t1 == t0 else w0 + (w1 - w0) * (t - t0) / (t1 - t0)

    points = [(start, at(start)), *((t, w) for t, w in valid if start < t < end), (end, at(end))]
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in itertools.pairwise(points)), ""


@dataclass(frozen=True)
class EnergyReading:
    """The energy of the profile's GPUs over one window, or why it is unavailable (`joules_per_gpu` None)."""

    method: str
    gpus: tuple[int, ...]
    window_s: float
    joules_per_gpu: tuple[float, ...] | None
    reason: str = ""  # why unavailable, naming the GPU; "" when measured
    samples: int = 0  # power samples integrated (smi method)
    started_at: float = 0.0  # the window's edges, time.monotonic() of this process (0.0: not known)
    ended_at: float = 0.0

    @property
    def joules(self) -> float | None:
        return None if self.joules_per_gpu is None else sum(self.joules_per_gpu)

    @property
    def mean_w_per_gpu(self) -> list[float] | None:
        if self.joules_per_gpu is None or self.window_s <= 0:
            return None
        return [j / self.window_s for j in self.joules_per_gpu]

    @property
    def note(self) -> str:
        """Why there is no figure, with the method: "" when measured."""
        if self.joules_per_gpu is not None and self.window_s > 0:
            return ""
        return f"{METHOD_TEXT.get(self.method, self.method)}: {self.reason or 'empty window'}"

    def to_json(self, output_tokens: int) -> dict[str, Any] | None:
        """`summary["energy"]`: None when unavailable, else exactly the seven keys of the module docstring."""
        joules, watts = self.joules, self.mean_w_per_gpu
        if joules is None or watts is None:
            return None
        return {
            "method": self.method,
            "joules": round(joules, 3),
            "gpus": len(self.gpus),
            "mean_w_per_gpu": [round(w, 2) for w in watts],
            "output_tokens": output_tokens,
            "j_per_token": joules / output_tokens if output_tokens > 0 else None,
            "tokens_per_j": output_tokens / joules if joules > 0 else None,
        }


def unavailable(method: str, gpus: Sequence[int], reason: str, window_s: float = 0.0) -> EnergyReading:
    return EnergyReading(method, tuple(gpus), window_s, None, reason)


class EnergyMeter(Protocol):
    """Measures one window: start() at its first edge, stop() at its last. Neither raises."""

    @property
    def method(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> EnergyReading: ...


class NoEnergyMeter:
    """A profile with nothing to measure: every window is unavailable, with the reason given."""

    method = METHOD_NONE

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def start(self) -> None:
        return None

    async def stop(self) -> EnergyReading:
        return unavailable(self.method, (), self.reason)


class NvmlEnergyMeter:
    """NVML's total energy counter of each GPU, read at the window's two edges only (a read costs ~3 ms).

    The counter does not advance at every read: on an H200 it steps every ~100 ms (69 J at 690 W), so two plain
    reads are off by up to a step per edge (p95 2.2 % over 4 s windows). With `sync_edges` (the default) each
    edge is placed on a step: start() reads until the counter has stepped twice (the window starts at the
    second step; the two give the step period), stop() reads once, then until the next step, and takes the
    value at the stop time on the line between the step before it (next step - period) and the next one. That
    costs at most SYNC_TIMEOUT_S per edge, before and after the window, never inside it
    (docs/decisions.md#energy-per-token has the figures). A counter that does not step in that time is read
    plainly."""

    method = METHOD_NVML

    def __init__(self, gpus: Sequence[int], *, telemetry: NvmlTelemetry | None = None,
                 clock: Callable[[], float] = time.monotonic, sync_edges: bool = True) -> None:
        self.gpus = tuple(gpus)
        self._telemetry = telemetry or NvmlTelemetry(self.gpus, clock=clock)
        self._clock = clock
        self._sync = sync_edges
        self._start: EnergyCounters | None = None
        self._started_at = 0.0
        self._period: dict[int, float] = {}

    async def usable(self) -> str:
        """"" when NVML can be started here, else why (the library is missing, the driver is not loaded)."""
        counters = await self._telemetry.read_energy()
        return counters.error or ""

    async def start(self) -> None:
        first = await self._telemetry.read_energy()
        if self._sync and not first.error:
            steps = await self._steps(first, want=2)
            values = dict(first.values)
            for gpu, seen in steps.items():
                if seen:
                    values[gpu] = (seen[-1][1], seen[-1][0])
                if len(seen) == 2:
                    self._period[gpu] = seen[1][0] - seen[0][0]
            first = EnergyCounters(values, first.unavailable, first.error)
        self._start = first
        self._started_at = self._clock()

    async def stop(self) -> EnergyReading:
        end = await self._telemetry.read_energy()
        window = self._clock() - self._started_at
        if self._sync and not end.error and self._period:
            steps = await self._steps(end, want=1)
            values = dict(end.values)
            for gpu, seen in steps.items():
                period = self._period.get(gpu)
                if seen and period and gpu in end.values:
                    (mj, at), (next_at, next_mj) = end.values[gpu], seen[0]
                    share = min(1.0, max(0.0, (at - (next_at - period)) / period))
                    values[gpu] = (round(mj + (next_mj - mj) * share), at)
            end = EnergyCounters(values, end.unavailable, end.error)
        await self.close()
        return self.reading(self._start, end, window)

    async def _steps(self, first: EnergyCounters, want: int) -> dict[int, list[tuple[float, int]]]:
        """Read until every GPU's counter stepped `want` times (at most SYNC_TIMEOUT_S): per GPU each step's
        moment (halfway between the reads around it) and value."""
        last = dict(first.values)
        steps: dict[int, list[tuple[float, int]]] = {gpu: [] for gpu in last}
        deadline = self._clock() + SYNC_TIMEOUT_S
        for _ in range(SYNC_MAX_READS):
            if all(len(seen) >= want for seen in steps.values()) or self._clock() >= deadline:
                break
            now = await self._telemetry.read_energy()
            if now.error:
                break
            for gpu, (mj, at) in now.values.items():
                if gpu in last:
                    before_mj, before_at = last[gpu]
                    if mj != before_mj and len(steps[gpu]) < want:
                        steps[gpu].append(((before_at + at) / 2, mj))
                    last[gpu] = (mj, at)
        return steps

    async def close(self) -> None:
        """nvmlShutdown (NVML counts init/shutdown pairs: other NVML users keep working)."""
        await self._telemetry.close()  # NvmlTelemetry.close never raises: a failed nvmlShutdown is logged there

    def reading(self, start: EnergyCounters | None, end: EnergyCounters, window_s: float) -> EnergyReading:
        """The window's energy from the counters read at its two edges."""
        if start is None:
            return unavailable(self.method, self.gpus, "the meter was not started", window_s)
        if not self.gpus:
            return unavailable(self.method, self.gpus, "no GPU to measure", window_s)
        if start.error or end.error:
            return unavailable(self.method, self.gpus, start.error or end.error or "", window_s)
        per_gpu: list[float] = []
        edges: list[tuple[float, float]] = []
        for gpu in self.gpus:
            why = start.unavailable.get(gpu) or end.unavailable.get(gpu)
            if why or gpu not in start.values or gpu not in end.values:
                return unavailable(self.method, self.gpus,
                                   f"GPU {gpu}: energy counter unreadable ({why or 'no value'})", window_s)
            (mj0, t0), (mj1, t1) = start.values[gpu], end.values[gpu]
            delta, reason = counter_delta_mj(mj0, mj1, t1 - t0)
            if delta is None:
                return unavailable(self.method, self.gpus, f"GPU {gpu}: {reason}", window_s)
            per_gpu.append(delta / 1000)
            edges.append((t0, t1))
        # the window is the time between each GPU's two reads (the first read also starts NVML: not counted)
        first = sum(t0 for t0, _ in edges) / len(edges)
        last = sum(t1 for _, t1 in edges) / len(edges)
        return EnergyReading(self.method, self.gpus, last - first, tuple(per_gpu), started_at=first, ended_at=last)


class SmiEnergyMeter:
    """The integral of nvidia-smi's power.draw, streamed every `period_ms` on any host, over the window."""

    method = METHOD_SMI

    def __init__(self, host: Host, gpus: Sequence[int], *, period_ms: int = SMI_PERIOD_MS,
                 telemetry: Any = None, clock: Callable[[], float] = time.monotonic,
                 first_sample_timeout_s: float = FIRST_SAMPLE_TIMEOUT_S) -> None:
        self.gpus = tuple(gpus)
        self.period_ms = period_ms
        # the process list is not needed here: read it once an hour, not every second
        self._telemetry = telemetry or SmiTelemetry(host, self.gpus, apps_interval_s=3600.0, clock=clock)
        self._clock = clock
        self._timeout_s = first_sample_timeout_s
        self._samples: dict[int, list[tuple[float, float | None]]] = {g: [] for g in self.gpus}
        self._reasons: dict[int, str] = {}
        self._errors: list[str] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tasks = TaskOwner("power.draw meter")
        self._started_at: float | None = None

    @property
    def max_gap_s(self) -> float:
        return max(1.0, 5 * self.period_ms / 1000)

    async def _collect(self) -> None:
        async with contextlib.aclosing(self._telemetry.stream(self.period_ms)) as snapshots:
            async for snapshot in snapshots:
                if snapshot.error is not None:
                    self._errors.append(snapshot.error.message)
                for gpu in snapshot.gpus:
                    if gpu.index in self._samples:
                        self._samples[gpu.index].append((gpu.taken_at, gpu.power_w))
                        if gpu.power_w is None:
                            self._reasons[gpu.index] = gpu.unavailable.get("power_w", "unreadable")
                self._arrived.set()

    async def start(self) -> None:
        """Start the stream and wait for its first sample, so the window's first edge lies between samples."""
        self._task = self._tasks.spawn(self._collect(), "samples")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), self._timeout_s)
        self._started_at = self._clock()

    async def stop(self) -> EnergyReading:
        """Wait for a sample past the window's last edge (at most a few periods), then integrate."""
        end = self._clock()
        if self._task is None or self._started_at is None:
            return unavailable(self.method, self.gpus, "the meter was not started")
        deadline = end + max(3 * self.period_ms / 1000, 1.0)
        while self._clock() < deadline and not self._task.done():
            if all(s and s[-1][0] >= end for s in self._samples.values()):
                break
            await asyncio.sleep(self.period_ms / 4000)
        await self._tasks.close()  # a sampler that failed was logged as it ended; the samples so far still count
        await self._telemetry.close()
        return self.reading(self._started_at, end)

    def reading(self, start: float, end: float) -> EnergyReading:
        """The window's energy from the samples collected so far."""
        window = end - start
        per_gpu: list[float] = []
        count = 0
        for gpu in self.gpus:
            samples = self._samples[gpu]
            if not any(w is not None for _, w in samples):
                if samples:
                    why = f"power.draw {self._reasons.get(gpu, 'unreadable')}"
                elif self._errors:
                    why = self._errors[-1]
                else:
                    why = "no power sample arrived"
                return unavailable(self.method, self.gpus, f"GPU {gpu}: {why}", window)
            joules, reason = trapezoid_joules(samples, start, end, max_gap_s=self.max_gap_s)
            if joules is None:
                return unavailable(self.method, self.gpus, f"GPU {gpu}: {reason}", window)
            per_gpu.append(joules)
            count += sum(1 for t, w in samples if w is not None and start <= t <= end)
        return EnergyReading(self.method, self.gpus, window, tuple(per_gpu), samples=count, started_at=start,
                             ended_at=end)


class LocalEnergyMeter:
    """This machine's GPUs: NVML's counter where NVML starts, else the power.draw integral of nvidia-smi."""

    def __init__(self, host: Host, gpus: Sequence[int]) -> None:
        self.host = host
        self.gpus = tuple(gpus)
        self._inner: NvmlEnergyMeter | SmiEnergyMeter | None = None

    @property
    def method(self) -> str:
        return self._inner.method if self._inner is not None else METHOD_NVML

    async def start(self) -> None:
        nvml = NvmlEnergyMeter(self.gpus)
        why = await nvml.usable()
        if why:  # the reading names the method used: the power.draw integral
            await nvml.close()
            self._inner = SmiEnergyMeter(self.host, self.gpus)
        else:
            self._inner = nvml
        await self._inner.start()

    async def stop(self) -> EnergyReading:
        if self._inner is None:
            return unavailable(self.method, self.gpus, "the meter was not started")
        return await self._inner.stop()


class _ProfileLike(Protocol):
    """What a meter needs of a Profile (app.core.profiles.types), without importing it here."""

    @property
    def host(self) -> str: ...

    @property
    def gpus(self) -> tuple[int, ...]: ...


def energy_meter_for(host: Host, profile: _ProfileLike) -> EnergyMeter:
    """The meter for a profile's GPUs on its host (see the module docstring); no I/O until start()."""
    gpus = tuple(profile.gpus)
    if not gpus:
        return NoEnergyMeter("the profile names no GPUs (gpus = [])")
    if profile.host == "local" and getattr(host, "is_local", False):
        return LocalEnergyMeter(host, gpus)
    return SmiEnergyMeter(host, gpus)
