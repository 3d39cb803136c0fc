"""Kill -> confirm free: stop a job's process group (SIGTERM, grace, SIGKILL) and watch its GPUs come free.

The GPUs are sampled from the signal on (start_free_watch before terminate_group): the driver frees memory
as the ranks exit, often before the whole group is gone, so FREE can follow the group's exit at once
instead of starting to look then. While a release is pending the GPUs are read at their source's own pace
(release_sampler_for; docs/decisions.md#release-watch-at-the-sources-pace): NVML every 5 ms on this machine
(the host's `nvml`: pynvml, or the simulated host's reader), else nvidia-smi's kept-open `-lms` stream every
10 ms with two kept-open loops of process lists (SmiTelemetry(apps_loops=2)); NVML that cannot be read falls
back to nvidia-smi at its first sample. Outside a pending release nothing here runs: the dashboard's own
sampler keeps its pace. A FreeCheck decides FREE: free on two consecutive samples.

The pending-release API: `start_free_watch(host, gpus, telemetry, baseline_mib, on_progress) -> FreeWatch`
starts watching (call it right before the signal); `wait_free(watch, timeout_s)` ends it with the verdict;
`FreeWatch.stop()` abandons it. `FreeWatch.check` is the FreeCheck being fed (what counts as free and whose
processes are expected); `FreeWatch.source` says which sampler reads ("nvml" or "smi"). Progress goes to
`on_progress` when the verdict changes and at most every PROGRESS_EVERY_S otherwise (at 5 ms a sample per
event would flood the dashboard). ServerLifecycle owns the states (KILLING, RELEASING, FREE, STUCK) and the
event log; these functions only act and report through the callbacks they are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from app.core.data import EventLevel, GpuSnapshot
from app.core.hosts.base import Host
from app.core.server import jobs
from app.core.tasks import TaskOwner
from app.core.telemetry.freecheck import FreeCheck, FreeVerdict
from app.core.telemetry.nvml import RELEASE_PERIOD_MS, NvmlTelemetry, release_sampler
from app.core.telemetry.smi import SmiTelemetry, Telemetry
from app.core.telemetry.steady import NvmlFirstTelemetry

RELEASE_POLL_MS = 50  # a telemetry source of another kind (a test's fake) is read this often
SMI_RELEASE_PERIOD_MS = 10  # nvidia-smi's -lms stream while a release is pending
SMI_APPS_LOOPS = 2  # kept-open process-list loops while a release is pending (a list every ~T/2, T one query)
PROGRESS_EVERY_S = 0.1  # progress reaches the listener at least this often while nothing changes
SIGKILL_WAIT_S = 10.0  # how long a group may take to go after SIGKILL before the survivors are named


@dataclass(frozen=True)
class FreeProgress:
    """One confirm-free sample's verdict, `elapsed_s` after the watch began."""

    verdict: FreeVerdict
    elapsed_s: float
    snapshot: GpuSnapshot | None = None  # the sample behind the verdict: a screen shows it with the verdict


@dataclass(frozen=True)
class ReleaseSampler:
    """What reads the GPUs while a release is pending: a telemetry source, its period, whether the watch owns it
    (and closes it), and the sampler to use instead when this one cannot read at its first sample."""

    telemetry: Telemetry
    period_ms: int
    source: str  # "nvml" | "smi" | the source's own name
    owned: bool = True
    fallback: ReleaseSampler | None = None


def release_sampler_for(host: Host, gpus: Sequence[int], telemetry: Telemetry) -> ReleaseSampler:
    """The release watch's sampler for `host` (the module docstring says which and why)."""
    if isinstance(telemetry, NvmlFirstTelemetry):  # the dashboard's sampler on this machine: as its nvidia-smi one
        telemetry = telemetry.smi
    if isinstance(telemetry, NvmlTelemetry):
        return ReleaseSampler(telemetry.for_release(), RELEASE_PERIOD_MS, "nvml")
    if not isinstance(telemetry, SmiTelemetry):
        return ReleaseSampler(telemetry, RELEASE_POLL_MS, getattr(telemetry, "source", "telemetry"), owned=False)
    smi = ReleaseSampler(SmiTelemetry(host, gpus, apps_loops=SMI_APPS_LOOPS), SMI_RELEASE_PERIOD_MS, "smi")
    if getattr(host, "is_local", False):
        nvml = release_sampler(gpus, getattr(host, "nvml", None))
        return ReleaseSampler(nvml, RELEASE_PERIOD_MS, "nvml", fallback=smi)
    return smi


def _readable(snapshot: GpuSnapshot, sampler: ReleaseSampler) -> bool:
    """Whether a sampler with a fallback can decide: it read every GPU, with nvidia-smi's memory semantics
    (NVML v1 counts the driver's reserve, 615 MiB on an idle H200, and would never match the baseline)."""
    if snapshot.error is not None or not snapshot.gpus:
        return False
    return sampler.source != "nvml" or all(gpu.memory_api == "nvml_v2" for gpu in snapshot.gpus)


class FreeWatch:
    """Samples the GPUs in the background and feeds a FreeCheck; `confirmed` is set once they are free."""

    def __init__(
        self,
        sampler: ReleaseSampler,
        check: FreeCheck,
        progress: Callable[[FreeVerdict, GpuSnapshot], None],
        on_sample: Callable[[FreeVerdict, GpuSnapshot], None] | None = None,
    ) -> None:
        self.started = time.monotonic()
        self._on_sample = on_sample  # every sample's verdict, unthrottled (WARM's two-sample rule needs each one)
        self.verdict = FreeVerdict(False, False, {}, (), unreadable="no reading yet")
        self.confirmed = asyncio.Event()
        self.check = check
        self.samples = 0  # snapshots fed to the check so far
        self._sampler = sampler
        self._progress = progress
        self._told: tuple[FreeVerdict, float] | None = None
        self._tasks = TaskOwner("free watch")
        self._task = self._tasks.spawn(self._run(), "samples")

    @property
    def source(self) -> str:
        """Which sampler reads now: "nvml", "smi" (after a fallback too), or a test source's name."""
        return self._sampler.source

    async def _run(self) -> None:
        while True:
            sampler = self._sampler
            first = True
            async with contextlib.aclosing(sampler.telemetry.stream(sampler.period_ms)) as snapshots:
                async for snapshot in snapshots:
                    if first and sampler.fallback is not None and not _readable(snapshot, sampler):
                        break
                    first = False
                    self._feed(snapshot)
                    if self.verdict.confirmed:
                        self.confirmed.set()
                        return
                else:
                    return
            if sampler.owned:
                await sampler.telemetry.close()
            assert sampler.fallback is not None
            self._sampler = sampler.fallback

    def _feed(self, snapshot: GpuSnapshot) -> None:
        self.verdict = self.check.feed(snapshot)
        self.samples += 1
        if self._on_sample is not None:
            self._on_sample(self.verdict, snapshot)
        now = time.monotonic()
        told = self._told
        if told is None or told[0] != self.verdict or now - told[1] >= PROGRESS_EVERY_S:
            self._told = (self.verdict, now)
            self._progress(self.verdict, snapshot)

    async def stop(self) -> None:
        await self._tasks.close()  # a sampler that failed was logged as it ended
        if self._sampler.owned:
            await self._sampler.telemetry.close()


def start_free_watch(
    host: Host,
    gpus: Sequence[int],
    telemetry: Telemetry,
    baseline_mib: Mapping[str, int],
    on_progress: Callable[[FreeProgress], None],
    on_sample: Callable[[FreeVerdict, GpuSnapshot], None] | None = None,
) -> FreeWatch:
    """Start sampling `gpus` for FREE (memory back at the job's recorded baseline, no process of ours left).
    `on_progress` hears the verdict when it changes and at most every PROGRESS_EVERY_S otherwise; `on_sample`
    every sample's verdict (the 5 ms NVML pace: keep it cheap)."""
    baseline = {int(k): v for k, v in baseline_mib.items()}
    started = time.monotonic()
    check = FreeCheck(tuple(gpus), baseline, not_before=started)

    def progress(verdict: FreeVerdict, snapshot: GpuSnapshot) -> None:
        on_progress(FreeProgress(verdict, time.monotonic() - started, snapshot))

    return FreeWatch(release_sampler_for(host, gpus, telemetry), check, progress, on_sample)


async def wait_free(watch: FreeWatch, timeout_s: float) -> tuple[FreeVerdict, float]:
    """Wait until `watch` confirms the GPUs free or `timeout_s` passes, then stop it: (verdict, seconds watched)."""
    try:
        await asyncio.wait_for(watch.confirmed.wait(), timeout_s)
    except TimeoutError:
        pass
    finally:
        await watch.stop()
    return watch.verdict, time.monotonic() - watch.started


def freed_text(verdict: FreeVerdict, elapsed_s: float) -> str:
    """The event-log line of a FREE verdict: "GPU0 3 MiB, GPU1 3 MiB after 2.1 s"."""
    used = ", ".join(f"GPU{gpu} {'?' if mib is None else mib} MiB" for gpu, mib in sorted(verdict.used_mib.items()))
    return f"{used} after {elapsed_s:.1f} s"


def stuck_text(verdict: FreeVerdict, elapsed_s: float) -> str:
    """The event-log line of a verdict that is not FREE: who still holds the GPUs, or why they cannot be read."""
    detail = "; ".join(h.describe() for h in verdict.holders) or verdict.unreadable
    return f"GPUs still held after {elapsed_s:.1f} s: {detail}"


async def wait_group_gone(host: Host, record: jobs.JobRecord, timeout_s: float) -> bool:
    """Whether the job's process group is gone within `timeout_s` (its leader checked every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not await jobs.job_alive(host, record):
            return True
        await asyncio.sleep(0.05)
    return not await jobs.job_alive(host, record)


async def _signal_text(host: Host, record: jobs.JobRecord, signal_name: str) -> str:
    """The event log's words for a signal to the job's group: the host's (a Slurm host names its scancel)."""
    if record.pgid is None:
        return f"{signal_name}: no process group recorded"
    return await host.signal_text(record.pgid, signal_name)


async def terminate_group(
    host: Host, record: jobs.JobRecord, grace_s: float, say: Callable[[str, EventLevel], None]
) -> None:
    """SIGTERM the job's group, wait `grace_s`, SIGKILL what is left; `say` logs each step and any survivor."""
    signalled = await jobs.signal_job(host, record, signal.SIGTERM)
    say(f"{await _signal_text(host, record, 'SIGTERM')} ({len(signalled)} processes)", "info")
    if await wait_group_gone(host, record, grace_s):
        return
    left = await jobs.signal_job(host, record, signal.SIGKILL)
    say(f"{await _signal_text(host, record, 'SIGKILL')} after {grace_s:.0f} s grace ({len(left)} left)", "warning")
    if not await wait_group_gone(host, record, SIGKILL_WAIT_S):
        remaining = await jobs.job_members(host, record)
        names = ", ".join(f"{p.pid} {p.name} ({p.state})" for p in remaining)
        say(f"processes survive SIGKILL: {names}", "error")
