"""A one-shot look at a profile's server: job record + live processes + a replay of its log."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from app.core.data import FatalEvent, Notice, ServerState
from app.core.hosts.base import Host
from app.core.hosts.procfs import ProcessInfo
from app.core.logs.parser import LogParser
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.states import gone_state, state_from_log, telling_fatal


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


async def inspect_job(host: Host, profile: Profile) -> StatusReport:
    record = await jobs.load_job(host, profile)
    if record is None:
        return StatusReport(profile, host.name, ServerState.STOPPED, None)
    members = await jobs.job_members(host, record)
    text = await host.read_text(record.log_path) or ""
    parser = LogParser(record.backend, ready_regex=profile.ready_regex or None)
    events: list[Any] = []
    for line in text.splitlines():
        events.extend(parser.feed(line))
    events.extend(parser.flush())
    notices = [e.text for e in events if isinstance(e, Notice)]
    telling: FatalEvent | None = None
    for event in events:
        if isinstance(event, FatalEvent):
            telling = telling_fatal(telling, event)
    state = state_from_log(events) if members else gone_state(record.outcome)
    return StatusReport(profile, host.name, state, record, members, notices, telling.text if telling else None)


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
    }
    return data
