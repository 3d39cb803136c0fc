"""Parsers for /proc text (process stat lines, listening TCP sockets), shared by local and SSH hosts."""

from __future__ import annotations

from dataclasses import dataclass

LISTEN_STATE = "0A"


@dataclass(frozen=True)
class ProcessInfo:
    """One live process on the host."""

    pid: int
    ppid: int
    pgid: int
    state: str  # one letter from /proc/PID/stat: R, S, D, Z, ...
    name: str  # comm / process title
    start_time: str


def parse_stat_line(line: str) -> ProcessInfo | None:
    """One /proc/PID/stat line -> ProcessInfo, or None when it cannot be read.

    The command name sits in parentheses and may itself contain spaces or parentheses, so the fields
    after it are found from the last ')'.
    """
    open_at = line.find("(")
    close_at = line.rfind(")")
    if open_at < 0 or close_at < open_at:
        return None
    try:
        pid = int(line[:open_at].strip())
    except ValueError:
        return None
    rest = line[close_at + 1 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3]
    if len(rest) < 20:
        return None
    try:
        return ProcessInfo(
            pid=pid,
            ppid=int(rest[1]),
            pgid=int(rest[2]),
            state=rest[0],
            name=line[open_at + 1 : close_at],
            start_time=rest[19],
        )
    except ValueError:
        return None


def start_ticks(value: str) -> int:
    """A stat start time as a number (-1 when unreadable, so it never counts as "after" anything)."""
    try:
        return int(value)
    except ValueError:
        return -1


def is_group_member(proc: ProcessInfo, pgid: int, start_time: str) -> bool:
    """A live (non-zombie) member of process group `pgid` that started no earlier than `start_time` (the
    recorded leader's start; an older process in a reused group id is not ours). An unreadable or empty
    `start_time` matches nothing."""
    recorded = start_ticks(start_time)
    return recorded >= 0 and proc.pgid == pgid and proc.state != "Z" and start_ticks(proc.start_time) >= recorded


def is_recorded_leader(proc: ProcessInfo, pid: int, pgid: int, start_time: str) -> bool:
    """`proc` is exactly the recorded group leader: the same pid, leading the same group, started at the very
    same tick (a live pid with another start time is a reused pid: not ours)."""
    return proc.pid == pid and proc.pgid == pgid and bool(start_time) and proc.start_time == start_time


def leader_says_alive(leader: ProcessInfo | None, pgid: int, start_time: str) -> bool | None:
    """What the group leader's own stat line says of a job's group `pgid` (the leader's pid is the pgid):
    True when it is the recorded leader and alive, False when that pid is now another process (the pid was
    reused, so the group we launched is gone: a pid is not reused while its group lives), None when the
    leader is gone or a zombie and only the group's other members can tell."""
    if leader is None or leader.state == "Z":
        return None
    return is_recorded_leader(leader, pgid, pgid, start_time)


def group_alive_in(processes: list[ProcessInfo], pgid: int, start_time: str) -> bool:
    """Whether the job's group `pgid` (its leader recorded as started at `start_time`) lives in `processes`:
    the leader's word first (leader_says_alive), else any live member no older than the recorded leader."""
    leader = next((proc for proc in processes if proc.pid == pgid), None)
    verdict = leader_says_alive(leader, pgid, start_time)
    if verdict is not None:
        return verdict
    return any(is_group_member(proc, pgid, start_time) for proc in processes)


def parse_stat_text(text: str) -> list[ProcessInfo]:
    """Many concatenated stat lines (as `cat /proc/[0-9]*/stat` prints them)."""
    found = []
    for line in text.splitlines():
        info = parse_stat_line(line)
        if info is not None:
            found.append(info)
    return found


def listening_ports(tcp_text: str) -> set[int]:
    """Ports in LISTEN state from the text of /proc/net/tcp and /proc/net/tcp6."""
    ports: set[int] = set()
    for line in tcp_text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[0] == "sl":
            continue
        local, state = parts[1], parts[3]
        if state != LISTEN_STATE or ":" not in local:
            continue
        try:
            ports.add(int(local.rsplit(":", 1)[1], 16))
        except ValueError:
            continue
    return ports
