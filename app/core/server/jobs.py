"""Job records on the host: what tunedash launched (pid, pgid, start time, argv, log), liveness, signals.

A record lives at `<host state dir>/jobs/<profile>.json`, so a later tunedash process, or a second
person's, can re-attach to the server. Signals go to the process group only when the group is the one
we launched: the leader's pid and start time must match the record (PIDs get reused), or, when the
leader is gone, members of the group must have started no earlier than the recorded leader.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import socket
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from app.core.data import JOB_OUTCOMES, JobOutcome, one_of
from app.core.hosts.base import Host
from app.core.hosts.procfs import ProcessInfo


def who_am_i() -> str:
    """user@machine, as job records name who launched and who drives."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass
class JobRecord:
    """One server launch on one host."""

    profile: str
    host: str
    backend: str
    model: str
    port: int
    argv: list[str]
    flags: dict[str, Any]
    pid: int
    pgid: int
    start_time: str
    log_path: str
    launched_by: str
    launched_at: float
    gpus: list[int]
    driver: str = ""
    driver_since: float = 0.0
    baseline_mib: dict[str, int] = field(default_factory=dict)
    phase_times: dict[str, float] = field(default_factory=dict)
    ready_at: float | None = None
    outcome: JobOutcome = "running"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        """The record in `text`; ValueError or TypeError when it is not one (load_job: unreadable).

        Unknown keys are dropped (a newer tunedash may add some). An outcome that is not a JobOutcome reads as
        "running": the record still names the group we launched (so it can be killed and re-attached to),
        and whether it runs is then decided from the process table, as for any running record."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("a job record is a JSON object")
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in raw.items() if key in known}
        values["outcome"] = one_of(values.get("outcome", "running"), JOB_OUTCOMES) or "running"
        return cls(**values)


def job_path(host: Host, profile_name: str) -> str:
    return f"{host.state_dir}/jobs/{profile_name}.json"


def log_path_for(host: Host, profile_name: str, at: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(at or time.time()))
    return f"{host.state_dir}/logs/{profile_name}-{stamp}.log"


async def load_job(host: Host, profile_name: str) -> JobRecord | None:
    text = await host.read_text(job_path(host, profile_name))
    if not text:
        return None
    try:
        return JobRecord.from_json(text)
    except (ValueError, TypeError):
        return None


async def save_job(host: Host, record: JobRecord) -> None:
    await host.write_text(job_path(host, record.profile), record.to_json())


def _ticks(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return -1


def members_of(record: JobRecord, processes: list[ProcessInfo]) -> list[ProcessInfo]:
    """Live (non-zombie) processes of the job's group, excluding any that predate the job (PID reuse)."""
    started = _ticks(record.start_time)
    return [
        proc
        for proc in processes
        if proc.pgid == record.pgid and proc.state != "Z" and _ticks(proc.start_time) >= started
    ]


async def job_members(host: Host, record: JobRecord) -> list[ProcessInfo]:
    return members_of(record, await host.processes())


async def job_alive(host: Host, record: JobRecord) -> bool:
    """Whether the job has any live member: `bool(job_members(...))`, without listing every process
    (Host.group_alive reads the leader first). The lifecycle's liveness poll uses this."""
    return await host.group_alive(record.pgid, record.start_time)


async def signal_job(host: Host, record: JobRecord, signal_number: int) -> list[ProcessInfo]:
    """Signal the job's group if it is still ours; returns the members that were signalled."""
    members = await job_members(host, record)
    if not members:
        return []
    with contextlib.suppress(ProcessLookupError):
        await host.signal_group(record.pgid, signal_number)
    return members
