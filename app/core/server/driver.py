"""Who drives a shared server: the job record's driver (user@machine, since when), take-over, and a watcher.

Two people can open dashboards on one GPU host. The one named as `driver` in the job record may launch,
kill and relaunch; a second dashboard that finds a live job driven by someone else opens read-only and
says who. `--take-over` rewrites the driver (and its time) in the record; the other dashboard notices on
its next read of the record (every `period_s`) and turns read-only. Both event logs record it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.core.data import EventLevel
from app.core.hosts.base import Host, HostError
from app.core.server import jobs

DRIVER_POLL_S = 2.0


@dataclass(frozen=True)
class DriverVerdict:
    """What a dashboard opening onto `record` should do: stay read-only or drive; a line for its event log."""

    readonly: bool
    message: str
    level: EventLevel = "info"


def _clock(at: float) -> str:
    return time.strftime("%H:%M", time.localtime(at)) if at else "?"


async def settle_driver(host: Host, record: jobs.JobRecord, me: str, *, take_over: bool, profile: str) -> DriverVerdict:
    """Decide (and, when driving, record) who drives `record`'s server."""
    other = record.driver and record.driver != me
    if other and not take_over:
        return DriverVerdict(
            True,
            f"read-only: {record.driver} drives this server since {_clock(record.driver_since)}; "
            f"`tunedash ui {profile} --take-over` to drive it",
            "warning",
        )
    if record.driver == me:
        return DriverVerdict(False, "")
    previous, since = record.driver, record.driver_since
    record.driver, record.driver_since = me, time.time()
    await jobs.save_job(host, record)
    if previous:
        return DriverVerdict(False, f"took over from {previous} (driving since {_clock(since)})", "warning")
    return DriverVerdict(False, f"driving this server as {me}")


async def watch_driver(
    host: Host, profile: str, me: str, on_taken: Callable[[jobs.JobRecord], None], period_s: float = DRIVER_POLL_S
) -> None:
    """Read the record every period_s; call on_taken(record) once when someone else becomes its driver."""
    while True:
        await asyncio.sleep(period_s)
        with contextlib.suppress(HostError):
            record = await jobs.load_job(host, profile)
            if record is not None and record.driver and record.driver != me:
                on_taken(record)
                return


def taken_message(record: jobs.JobRecord) -> str:
    return f"{record.driver} took over at {_clock(record.driver_since)}; this dashboard is now read-only"
