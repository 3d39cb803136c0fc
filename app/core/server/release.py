"""Kill -> confirm free: stop a job's process group (SIGTERM, grace, SIGKILL) and watch its GPUs come free.

The GPUs are sampled from the signal on (start_free_watch before terminate_group): the driver frees memory
as the ranks exit, often before the whole group is gone, so FREE can follow the group's exit at once
instead of starting to look then. The sampler is a tight one (release_telemetry): memory every
RELEASE_POLL_MS and a fresh process list as often. A FreeCheck decides FREE: free on two consecutive
samples. ServerLifecycle owns the states (KILLING, RELEASING, FREE, STUCK) and the event log; these
functions only act and report through the callbacks they are given.
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
from app.core.telemetry.nvml import NvmlTelemetry
from app.core.telemetry.smi import SmiTelemetry, Telemetry

RELEASE_POLL_MS = 50  # SmiTelemetry.stream samples no faster than every 50 ms
SIGKILL_WAIT_S = 10.0  # how long a group may take to go after SIGKILL before the survivors are named


@dataclass(frozen=True)
class FreeProgress:
    """One confirm-free sample's verdict, `elapsed_s` after the watch began."""

    verdict: FreeVerdict
    elapsed_s: float
    snapshot: GpuSnapshot | None = None  # the sample behind the verdict: a screen shows it with the verdict


class FreeWatch:
    """Samples the GPUs in the background and feeds a FreeCheck; `confirmed` is set once they are free."""

    def __init__(
        self,
        sampler: Telemetry,
        check: FreeCheck,
        progress: Callable[[FreeVerdict, GpuSnapshot], None],
        *,
        close_sampler: bool,
    ) -> None:
        self.started = time.monotonic()
        self.verdict = FreeVerdict(False, False, {}, (), unreadable="no reading yet")
        self.confirmed = asyncio.Event()
        self._sampler = sampler
        self._check = check
        self._progress = progress
        self._close_sampler = close_sampler
        self._tasks = TaskOwner("free watch")
        self._task = self._tasks.spawn(self._run(), "samples")

    async def _run(self) -> None:
        async with contextlib.aclosing(self._sampler.stream(RELEASE_POLL_MS)) as snapshots:
            async for snapshot in snapshots:
                self.verdict = self._check.feed(snapshot)
                self._progress(self.verdict, snapshot)
                if self.verdict.confirmed:
                    self.confirmed.set()
                    return

    async def stop(self) -> None:
        await self._tasks.close()  # a sampler that failed was logged as it ended
        if self._close_sampler:
            await self._sampler.close()


def release_telemetry(host: Host, gpus: Sequence[int], telemetry: Telemetry) -> Telemetry:
    """A tight sampler for confirm-free: memory every 50 ms and a fresh process list as often.

    The dashboard's sampler reads process lists once a second; after a kill that would hold FREE back
    by up to a second (why and the H200 figures: docs/decisions.md#release-sampler).
    """
    if isinstance(telemetry, SmiTelemetry):
        return SmiTelemetry(host, gpus, apps_interval_s=RELEASE_POLL_MS / 1000)
    if isinstance(telemetry, NvmlTelemetry):
        return telemetry.for_release(RELEASE_POLL_MS / 1000)
    return telemetry


def start_free_watch(
    host: Host,
    gpus: Sequence[int],
    telemetry: Telemetry,
    baseline_mib: Mapping[str, int],
    on_progress: Callable[[FreeProgress], None],
) -> FreeWatch:
    """Start sampling `gpus` for FREE (memory back at the job's recorded baseline, no process of ours left)."""
    baseline = {int(k): v for k, v in baseline_mib.items()}
    started = time.monotonic()
    check = FreeCheck(tuple(gpus), baseline, not_before=started)

    def progress(verdict: FreeVerdict, snapshot: GpuSnapshot) -> None:
        on_progress(FreeProgress(verdict, time.monotonic() - started, snapshot))

    sampler = release_telemetry(host, gpus, telemetry)
    return FreeWatch(sampler, check, progress, close_sampler=sampler is not telemetry)


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


async def terminate_group(
    host: Host, record: jobs.JobRecord, grace_s: float, say: Callable[[str, EventLevel], None]
) -> None:
    """SIGTERM the job's group, wait `grace_s`, SIGKILL what is left; `say` logs each step and any survivor."""
    signalled = await jobs.signal_job(host, record, signal.SIGTERM)
    say(f"SIGTERM to group {record.pgid} ({len(signalled)} processes)", "info")
    if await wait_group_gone(host, record, grace_s):
        return
    left = await jobs.signal_job(host, record, signal.SIGKILL)
    say(f"SIGKILL to group {record.pgid} after {grace_s:.0f} s grace ({len(left)} left)", "warning")
    if not await wait_group_gone(host, record, SIGKILL_WAIT_S):
        remaining = await jobs.job_members(host, record)
        names = ", ".join(f"{p.pid} {p.name} ({p.state})" for p in remaining)
        say(f"processes survive SIGKILL: {names}", "error")
