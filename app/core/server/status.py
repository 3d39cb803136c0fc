"""A one-shot look at a profile's server: job record + live processes + a replay of its log's window."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from app.core.data import FatalEvent, Notice, ServerState
from app.core.hosts.base import Host, HostError
from app.core.hosts.procfs import ProcessInfo
from app.core.logs.parser import LogParser
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.states import STARTING_STATES, gone_state, state_from_log, telling_fatal


@dataclass
class StatusReport:
    """What `tunedash status` prints."""

    profile: Profile
    host: str
    state: ServerState
    record: jobs.JobRecord | None
    members: list[ProcessInfo] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    fatal: str | None = None
    log_skipped: int = 0  # bytes in the middle of the log that were not read (its window: head and tail)


async def inspect_job(host: Host, profile: Profile) -> StatusReport:
    """The profile's server as it is now; BadRecord when its job record cannot be read (the file is named).

    The log is replayed from its window (app.core.hosts.window: its first and last MiBs, never the whole file); a
    server whose ready line lies in the part not read is READY when its record says it got there."""
    read = await jobs.read_job(host, profile)
    if read.problem:
        raise jobs.BadRecord(read.problem)
    record = read.record
    if record is None:
        return StatusReport(profile, host.name, ServerState.STOPPED, None)
    members = await jobs.job_members(host, record)
    try:
        window = await host.read_window(record.log_path)
    except HostError as exc:
        raise jobs.BadRecord(f"the job record {read.path} names the log {record.log_path}, which cannot be read "
                             f"({exc}); remove the record or launch again to replace it") from None
    parser = LogParser(record.backend, ready_regex=profile.ready_regex or None)
    events: list[Any] = []
    for part in (window.head, window.tail) if window is not None else ():
        for line in part:
            events.extend(parser.feed(line))
        events.extend(parser.flush())  # the head and the tail are not one text: nothing spans the gap
    notices = [e.text for e in events if isinstance(e, Notice)]
    telling: FatalEvent | None = None
    for event in events:
        if isinstance(event, FatalEvent):
            telling = telling_fatal(telling, event)
    state = state_from_log(events) if members else gone_state(record.outcome)
    if members and state in STARTING_STATES and record.outcome == "ready":
        state = ServerState.READY
    return StatusReport(profile, host.name, state, record, members, notices, telling.text if telling else None,
                        window.skipped if window is not None else 0)


def status_to_json(report: StatusReport) -> dict[str, Any]:
    record = report.record
    data: dict[str, Any] = {
        "profile": report.profile.name,
        "host": report.host,
        "state": report.state.value,
        "pid": record.pid if record else None,
        "pgid": record.pgid if record else None,
        "port": record.port if record else report.profile.port,
        "backend": record.backend if record else report.profile.backend,
        "model": record.model if record else report.profile.model,
        "since": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.launched_at)) if record else None,
        "launched_by": record.launched_by if record else None,
        "flags": record.flags if record else dict(report.profile.flags),
        "phase_times": record.phase_times if record else {},
        "argv": record.argv if record else None,
        "log_path": record.log_path if record else None,
        "processes": [{"pid": p.pid, "name": p.name, "state": p.state} for p in report.members],
        "notices": report.notices,
        "fatal": report.fatal,
        "log_skipped_bytes": report.log_skipped,
    }
    return data
