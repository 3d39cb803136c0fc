"""Job records on the host (what tunedash launched) and the one rule that says whether a group is still ours.

A record lives at `<host state dir>/jobs/<slug>-<hash>.json`: a safe slug of the profile's name plus a short hash
of the profile file's path, so two files both named "demo" never share a record and no name (`../../x`) leaves
the folder. It is validated where it is read (a wrong type or a missing key makes it unreadable, said once).

Writes are a compare-and-swap: each record carries a `generation`; `save_job` writes generation N+1 only while
the file still holds generation N (the one the holder read or wrote last), under the host's lock on the file
(Host.swap_text: a temporary file of its own, fsync, rename). A holder whose record is out of date (a dashboard
watching server X after a CLI relaunch started Y) gets StaleRecord and never overwrites the newer record.

A launch writes its record before the spawn ("launching": a random tag, the host's boot id and hostname, no pid
yet) and starts the server with `TUNEDASH_JOB=<tag>` in its environment, so a launch cut short between the
spawn and the pid still leaves a record whose tag finds the orphan.

Ours (check_job): the record must name a group leader (pid == pgid > 1, not tunedash's own group) with a start
time, a tag, and this host's boot id and hostname (a record from another boot or host is refused and kept for
inspection); the live process at that pid must be exactly the recorded leader (same group, same start tick: a
live pid with another start time is a reused pid, not ours) and carry the tag in its environment. With the
leader gone, a member counts only if it is in the group, no older than the leader, and carries the tag. Signals
go only to a group proven so, the leader through the host's proven signal (a pidfd locally).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import getpass
import hashlib
import json
import math
import posixpath
import re
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from app.core.data import JOB_OUTCOMES, JobOutcome, one_of
from app.core.errors import Reason, TunedashError
from app.core.hosts.base import Host, LeaderMismatch, LeaderProof, SpawnedProcess
from app.core.hosts.procfs import ProcessInfo, is_group_member, is_recorded_leader, start_ticks
from app.core.profiles.types import Profile
from app.core.telemetry.freecheck import FreeVerdict

TAG_ENV = "TUNEDASH_JOB"  # the environment marker every launch carries: TUNEDASH_JOB=<the record's tag>
SAVE_TRIES = 3  # swaps that found the same generation but other bytes (a writer without compare-and-swap)


def who_am_i() -> str:
    """user@machine, as job records name who launched and who drives."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass
class JobRecord:
    """One server launch on one host. `pid`/`pgid` are None while the launch is "launching" (before the spawn)."""

    profile: str
    host: str
    backend: str
    model: str
    port: int
    argv: list[str]
    flags: dict[str, Any]
    pid: int | None
    pgid: int | None
    start_time: str
    log_path: str
    launched_by: str
    launched_at: float
    gpus: list[int]
    baseline_mib: dict[str, int] = field(default_factory=dict)
    phase_times: dict[str, float] = field(default_factory=dict)
    ready_at: float | None = None
    outcome: JobOutcome = "running"
    profile_file: str = ""  # the profile file's resolved path: with `profile`, it names the record's file
    tag: str = ""  # TUNEDASH_JOB's value in the launch's environment
    boot_id: str = ""  # the host's boot id at the launch
    hostname: str = ""  # the host's hostname at the launch
    generation: int = 0  # bumped by every save; a save must hold the current one

    def copy(self) -> JobRecord:
        """A copy that shares nothing mutable with this record (the lists and dicts are new; a flag's list or dict
        value is copied too): what copy.deepcopy gives, at a quarter of its cost (20 against 75 us). LifecycleView
        takes one per dashboard tick."""
        flags = {k: (copy.deepcopy(v) if isinstance(v, (list, dict)) else v) for k, v in self.flags.items()}
        return dataclasses.replace(self, argv=list(self.argv), flags=flags, gpus=list(self.gpus),
                                   baseline_mib=dict(self.baseline_mib), phase_times=dict(self.phase_times))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        """The record in `text`; ValueError or TypeError (with the key) when it is not one (load_job: unreadable).

        Unknown keys are dropped (a newer tunedash may add some). An outcome that is not a JobOutcome reads as
        "running": the record still names the group we launched (so it can be killed and re-attached to),
        and whether it runs is then decided from the process table, as for any running record."""
        try:
            raw = json.loads(text)
        except RecursionError:  # "[" * 100000: nested too deeply for json
            raise ValueError("a job record is a JSON object, not nested arrays") from None
        if not isinstance(raw, dict):
            raise ValueError("a job record is a JSON object")
        values: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name not in raw:
                if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                    raise ValueError(f"{spec.name}: missing")
                continue
            value = raw[spec.name]
            check, kind = _FIELD_CHECKS.get(spec.name, (_is_str, "a string"))
            if not check(value):
                raise ValueError(f"{spec.name}: expected {kind}, got {_short(value)}")
            values[spec.name] = value
        values["outcome"] = one_of(values.get("outcome", "running"), JOB_OUTCOMES) or "running"
        return cls(**values)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: object) -> bool:
    """A finite number a float holds exactly enough (a time, seconds): no NaN, no 400-digit integer."""
    if _is_int(value):
        return abs(value) < 2**53  # type: ignore[arg-type]
    return isinstance(value, float) and math.isfinite(value)


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _flag_value(value: object) -> bool:
    return isinstance(value, bool | int | float | str | dict)  # FlagValue, as the profile gave it


EPOCH_MAX = 4102444800.0  # 2100-01-01: a launch time past it is not a time (1e300 would overflow localtime)
PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no pid or group id is larger
SECONDS_MAX = 1e7  # a phase of 115 days is not a phase
MIB_MAX = 1 << 40


def _is_epoch(value: object) -> bool:
    """Seconds since the epoch that a clock could have said: finite, from 1970 to 2100."""
    return _is_num(value) and 0 <= value <= EPOCH_MAX  # type: ignore[operator]


def _is_pid(value: object) -> bool:
    """null, or a process id the kernel could hand out (0 and 1 pass here: check_job refuses them by name)."""
    return value is None or (_is_int(value) and 0 <= value <= PID_MAX)  # type: ignore[operator]


def _is_seconds(value: object) -> bool:
    return _is_num(value) and 0 <= value <= SECONDS_MAX  # type: ignore[operator]


_FIELD_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "port": (lambda v: _is_int(v) and 0 <= v <= 65535, "a port number 1-65535 (0 when none)"),
    "outcome": (lambda v: True, "anything (an unknown one reads as running)"),
    "argv": (lambda v: isinstance(v, list) and all(map(_is_str, v)), "a list of strings"),
    "flags": (lambda v: isinstance(v, dict) and all(map(_flag_value, v.values())), "an object of flag values"),
    "pid": (_is_pid, f"a process id 0-{PID_MAX} or null"),
    "pgid": (_is_pid, f"a process group id 0-{PID_MAX} or null"),
    "launched_at": (_is_epoch, "seconds since the epoch (1970-2100)"),
    "gpus": (lambda v: isinstance(v, list) and all(_is_int(i) and 0 <= i < 1024 for i in v), "a list of GPU indexes"),
    "baseline_mib": (lambda v: isinstance(v, dict) and all(_is_int(m) and 0 <= m <= MIB_MAX for m in v.values()),
                     "an object of MiB"),
    "phase_times": (lambda v: isinstance(v, dict) and all(map(_is_seconds, v.values())), "an object of seconds"),
    "ready_at": (lambda v: v is None or _is_epoch(v), "seconds since the epoch (1970-2100) or null"),
    "generation": (lambda v: _is_int(v) and 0 <= v < 2**53, "a non-negative integer"),
}


# ---- where records live ----------------------------------------------------------------------------
def profile_file_of(profile: Profile) -> str:
    """The profile file's resolved path, as a record remembers it."""
    return str(Path(profile.source).expanduser().resolve())


def record_name(profile_name: str, profile_file: str) -> str:
    """`<slug>-<hash>`: the profile name reduced to [A-Za-z0-9._-] (never `.`/`..`, never a folder), plus the
    first 10 hex digits of the sha256 of the profile file's path."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", profile_name).strip("._-")[:48] or "profile"
    return f"{slug}-{hashlib.sha256(profile_file.encode()).hexdigest()[:10]}"


def job_path(host: Host, profile: Profile) -> str:
    return f"{host.state_dir}/jobs/{record_name(profile.name, profile_file_of(profile))}.json"


def _record_path(host: Host, record: JobRecord) -> str:
    return f"{host.state_dir}/jobs/{record_name(record.profile, record.profile_file)}.json"


def log_path_for(host: Host, profile: Profile, at: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(at or time.time()))
    return f"{host.state_dir}/logs/{record_name(profile.name, profile_file_of(profile))}-{stamp}.log"


# ---- reading and writing ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordRead:
    """What a record file holds: the record (None when absent or unreadable), its text, why it is unreadable,
    and its generation (0 for no file; an unreadable file's own generation when it has a readable one)."""

    path: str
    record: JobRecord | None
    text: str | None
    problem: str = ""

    @property
    def generation(self) -> int:
        if self.record is not None:
            return self.record.generation
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            value = json.loads(self.text or "").get("generation")
            if _is_int(value) and value >= 0:
                return int(value)
        return 0


def log_path_problem(host: Host, log_path: str) -> str:
    """Why a record's log path is not one tunedash wrote ("" when it is): it must lie in the host's
    `<state dir>/logs/`, with no `..`, so a record can never make a reader open /dev/zero or someone's file."""
    logs = posixpath.normpath(f"{host.state_dir}/logs")
    if ".." in log_path.split("/") or not posixpath.normpath(log_path).startswith(logs + "/"):
        return f"log_path: {_short(log_path)} is outside {logs}/"
    return ""


async def _read(host: Host, path: str) -> RecordRead:
    text = await host.read_text(path)
    if not text:
        return RecordRead(path, None, text)
    try:
        record = JobRecord.from_json(text)
        outside = log_path_problem(host, record.log_path)
        if outside:
            raise ValueError(outside)
        return RecordRead(path, record, text)
    except (ValueError, TypeError) as exc:
        problem = (f"the job record {path} is unreadable ({exc}); tunedash signals nothing it names and reads no "
                   "log it names; remove the file or launch again to replace it")
        return RecordRead(path, None, text, problem)


async def read_job(host: Host, profile: Profile) -> RecordRead:
    """The profile's record file as it is now."""
    return await _read(host, job_path(host, profile))


_SAID: set[tuple[str, str]] = set()  # (host, problem) already reported by load_job in this process


async def load_job(host: Host, profile: Profile, *, report: Callable[[str], None] | None = None) -> JobRecord | None:
    """The profile's record, or None (no file, or an unreadable one: `report` is told why, once per process)."""
    read = await read_job(host, profile)
    if read.problem and report is not None and (host.name, read.problem) not in _SAID:
        _SAID.add((host.name, read.problem))
        report(read.problem)
    return read.record


class BadRecord(TunedashError):
    """A job record that cannot be read: the message (RecordRead.problem) names the file and what to do."""

    title = "Unreadable job record"

    def __init__(self, problem: str) -> None:
        super().__init__(problem, Reason.BAD_INPUT)


class StaleRecord(TunedashError):
    """A save from a holder whose record is out of date: the file holds another generation (someone else saved
    or launched since); it was not overwritten. `current` is what the file holds now."""

    title = "Job record changed"

    def __init__(self, path: str, held: int, current: JobRecord | None) -> None:
        now = (f"it now names pid {current.pid} launched by {current.launched_by}, generation {current.generation}"
               if current is not None else "it is gone or unreadable")
        super().__init__(f"the job record {path} changed since this tunedash read it (generation {held}; {now}); "
                         "not overwritten", Reason.ALREADY_RUNNING)
        self.current = current


async def save_job(host: Host, record: JobRecord, *, expect_generation: int | None = None) -> None:
    """Write `record` as generation N+1 if the file still holds generation N: `expect_generation`, by default
    the record's own (what this holder read or wrote last). StaleRecord otherwise; `record.generation` is N+1
    after a save."""
    path = _record_path(host, record)
    expected = record.generation if expect_generation is None else expect_generation
    for _ in range(SAVE_TRIES):
        current = await _read(host, path)
        if current.generation != expected:
            raise StaleRecord(path, expected, current.record)
        text = dataclasses.replace(record, generation=expected + 1).to_json()
        if await host.swap_text(path, text, expect=current.text):
            record.generation = expected + 1
            return
    raise StaleRecord(path, expected, (await _read(host, path)).record)


# ---- launching -------------------------------------------------------------------------------------
def new_tag() -> str:
    """A fresh launch tag (TUNEDASH_JOB's value)."""
    return secrets.token_hex(8)


def tag_env(record: JobRecord) -> dict[str, str]:
    """The environment marker the launch of `record` carries."""
    return {TAG_ENV: record.tag}


def fill_spawned(record: JobRecord, spawned: SpawnedProcess) -> None:
    """The spawned leader's pid, group and start time into a "launching" record, which now runs."""
    record.pid, record.pgid, record.start_time = spawned.pid, spawned.pgid, spawned.start_time
    record.outcome = "running"


# ---- ours or not -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobCheck:
    """What the process table says of a record: its live members (only ones proven ours), why the record is
    not trusted at all (`refusal`: nothing it names may be signalled), "host"/"boot" when it was written on
    another host or boot, and the proven live leader."""

    members: tuple[ProcessInfo, ...] = ()
    refusal: str = ""
    foreign: str = ""
    leader: ProcessInfo | None = None


def _static_refusal(record: JobRecord, own_pgid: int | None) -> str:
    pid, pgid = record.pid, record.pgid
    where = f"the job record of {record.profile}"
    if not _is_int(pgid) or not _is_int(pid):
        return f"{where} names no process group (pid {pid!r}, group {pgid!r}); nothing was signalled"
    assert pid is not None and pgid is not None
    if pgid <= 1 or pid <= 1:
        return f"{where} names process group {pgid} (pid {pid}): never signalled; nothing was signalled"
    if own_pgid is not None and pgid == own_pgid:
        return f"{where} names tunedash's own process group {pgid}: never signalled; nothing was signalled"
    if pid != pgid:
        return f"{where} names pid {pid} in group {pgid}: a launch leads its own group; nothing was signalled"
    if not record.start_time.isdigit():
        return f"{where} has no start time for pid {pid} ({record.start_time!r}); nothing was signalled"
    if not record.tag:
        return (f"{where} has no {TAG_ENV} tag (launched by an older tunedash?): pid {pid} cannot be proven ours; "
                "nothing was signalled")
    if not record.boot_id or not record.hostname:
        return f"{where} does not say which host and boot launched it; nothing was signalled"
    return ""


async def _adopt_by_tag(host: Host, record: JobRecord, processes: list[ProcessInfo]) -> None:
    """A "launching" record (the launch stopped between the spawn and the pid): the process carrying its tag
    that leads its own group becomes the record's leader."""
    tagged = set(await host.find_env(f"{TAG_ENV}={record.tag}"))
    leaders = [p for p in processes if p.pid in tagged and p.pid == p.pgid and p.state != "Z"]
    if leaders:  # the newest: an SSH session's detaching shell leads its own group too, for a moment
        leader = max(leaders, key=lambda p: (start_ticks(p.start_time), p.pid))
        fill_spawned(record, SpawnedProcess(leader.pid, leader.pgid, leader.start_time))


async def _carries_tag(host: Host, pid: int, tag: str) -> bool:
    return bool(tag) and await host.environ_value(pid, TAG_ENV) == tag


async def check_job(host: Host, record: JobRecord) -> JobCheck:
    """Which live processes of `record` are ours (module docstring). A "launching" record is completed from the
    process that carries its tag, when there is one (its pid, group and start time are filled in)."""
    if record.outcome == "launching" and record.pid is None and not record.tag:
        return JobCheck(refusal=f"the job record of {record.profile} is a launch without a tag; nothing was signalled")
    if record.outcome != "launching" or record.pid is not None:
        refusal = _static_refusal(record, host.own_pgid())
        if refusal:
            return JobCheck(refusal=refusal)
    identity = await host.boot_identity()
    if record.hostname != identity.hostname:
        return JobCheck(refusal=f"the job record of {record.profile} was written on host {record.hostname!r}, this is "
                        f"{identity.hostname!r} (a shared home folder?); nothing was signalled, the record is kept",
                        foreign="host")
    if record.boot_id != identity.boot_id:
        return JobCheck(refusal=f"the job record of {record.profile} is from an earlier boot of {identity.hostname} "
                        f"(boot {record.boot_id[:8]}, now {identity.boot_id[:8]}): its server died with that boot; "
                        "nothing was signalled, the record is kept", foreign="boot")
    processes = await host.processes()
    if record.pid is None:
        await _adopt_by_tag(host, record, processes)
        if record.pid is None:
            return JobCheck()
        refusal = _static_refusal(record, host.own_pgid())
        if refusal:
            return JobCheck(refusal=refusal)
    assert record.pid is not None and record.pgid is not None
    leader = next((p for p in processes if p.pid == record.pid and p.state != "Z"), None)
    if leader is not None:
        if not is_recorded_leader(leader, record.pid, record.pgid, record.start_time):
            return JobCheck(refusal=f"pid {record.pid} of {record.profile} is now another process (group "
                            f"{leader.pgid}, started at tick {leader.start_time}, the record says "
                            f"{record.start_time}): not ours; nothing was signalled")
        if not await _carries_tag(host, leader.pid, record.tag):
            return JobCheck(refusal=f"pid {record.pid} of {record.profile} does not carry {TAG_ENV}={record.tag} "
                            "in its environment: not ours; nothing was signalled")
        return JobCheck(tuple(members_of(record, processes)), leader=leader)
    members = [p for p in members_of(record, processes) if await _carries_tag(host, p.pid, record.tag)]
    return JobCheck(tuple(members))


def members_of(record: JobRecord, processes: list[ProcessInfo]) -> list[ProcessInfo]:
    """Live (non-zombie) processes of the job's group no older than its leader, from the process table alone:
    none when the leader's pid is now another process (PID reuse). check_job adds the tag and the host."""
    if record.pid is None or record.pgid is None:
        return []
    leader = next((p for p in processes if p.pid == record.pid and p.state != "Z"), None)
    if leader is not None and not is_recorded_leader(leader, record.pid, record.pgid, record.start_time):
        return []
    return [proc for proc in processes if is_group_member(proc, record.pgid, record.start_time)]


async def job_members(host: Host, record: JobRecord) -> list[ProcessInfo]:
    """The job's live members proven ours (check_job); none when the record is refused."""
    return list((await check_job(host, record)).members)


async def job_alive(host: Host, record: JobRecord) -> bool:
    """Whether the job's group lives, by its leader's pid and exact start time (Host.group_alive reads the leader
    first), without the tag and host checks of check_job: the lifecycle's liveness poll uses this."""
    if record.pgid is None or not record.start_time:
        return False
    return await host.group_alive(record.pgid, record.start_time)


async def signal_job(host: Host, record: JobRecord, signal_number: int) -> list[ProcessInfo]:
    """Signal the job's group only when check_job proves it ours; returns the members that were signalled.

    A live leader is signalled through Host.signal_proven_group (proven again on the host right before the
    signal); with the leader gone, the group of the tagged members (its id cannot be reused while they live)."""
    check = await check_job(host, record)
    if check.refusal or not check.members:
        return []
    assert record.pid is not None and record.pgid is not None
    if check.leader is not None:
        proof = LeaderProof(record.pid, record.pgid, record.start_time, f"{TAG_ENV}={record.tag}")
        try:
            if await host.signal_proven_group(proof, signal_number):
                return list(check.members)
        except LeaderMismatch:
            return []
        check = await check_job(host, record)  # the leader went meanwhile: its tagged members decide
        if check.refusal or not check.members:
            return []
    with contextlib.suppress(ProcessLookupError):
        await host.signal_group(record.pgid, signal_number)
    return list(check.members)


# ---- whose GPU memory ------------------------------------------------------------------------------
async def with_owners(host: Host, record: JobRecord | None, verdict: FreeVerdict) -> FreeVerdict:
    """`verdict` with each holder's owner said: this job's (it carries the record's tag), another tunedash
    launch's, not tunedash's, or unknown (its environment cannot be read: another user's)."""
    holders = []
    for holder in verdict.holders:
        if holder.pid is None:
            holders.append(holder)
            continue
        value = await host.environ_value(holder.pid, TAG_ENV)
        if value is None:
            owner = "owner unknown: its environment cannot be read"
        elif record is not None and record.tag and value == record.tag:
            owner = "this job's (tagged)"
        elif value:
            owner = f"another tunedash launch's (tag {value[:16]})"
        else:
            owner = "not tunedash's (no tag)"
        holders.append(dataclasses.replace(holder, owner=owner))
    return dataclasses.replace(verdict, holders=tuple(holders))
