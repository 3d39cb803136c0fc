"""Test doubles shared by the tests: hosts that answer commands or keep everything in memory, a scripted GPU
telemetry, and a /proc group scan."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.core.data import GpuProcess, GpuSample, GpuSnapshot
from app.core.hosts.argv_limits import ARG_MAX_FALLBACK, argv_size_problem
from app.core.hosts.base import (
    CommandResult,
    Host,
    HostIdentity,
    LeaderMismatch,
    LeaderProof,
    PathAge,
    SpawnedProcess,
)
from app.core.hosts.procfs import ProcessInfo, parse_stat_line
from app.core.hosts.window import HEAD_BYTES, TAIL_BYTES, LogWindow, window_from


class CommandOnlyHost(Host):
    """A Host whose subclasses script `run` and `stream_lines`; everything else is out of scope."""

    name = "gpu-box"

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        raise NotImplementedError

    def stream_lines(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> AsyncGenerator[str, None]:
        raise NotImplementedError

    async def spawn_detached(
        self, argv: Sequence[str], *, log_path: str, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> SpawnedProcess:
        raise NotImplementedError

    async def signal_group(self, pgid: int, signal_number: int) -> bool:
        raise NotImplementedError

    async def processes(self) -> list[ProcessInfo]:
        raise NotImplementedError

    async def port_in_use(self, port: int) -> bool:
        raise NotImplementedError

    async def read_text(self, path: str) -> str | None:
        raise NotImplementedError

    async def write_text(self, path: str, text: str) -> None:
        raise NotImplementedError

    async def remove(self, path: str) -> None:
        raise NotImplementedError

    def follow(
        self, path: str, *, from_start: bool = True, offset: int | None = None
    ) -> AsyncGenerator[str, None]:
        raise NotImplementedError

    @property
    def state_dir(self) -> str:
        return "/tmp"


@dataclass
class FakeGroup:
    """A process group an InMemoryHost started: its leader's pid is the pgid, and it runs until it is ended."""

    pgid: int
    argv: tuple[str, ...]
    log_path: str
    env: dict[str, str]
    start_time: str
    alive: bool = True


@dataclass(eq=False)
class InMemoryHost(CommandOnlyHost):
    """A Host whose files, process groups and listening ports live in memory; nothing runs.

    A launch (spawn_detached) adds a live group with an empty log; the test appends the server's log lines
    (append_log), ends the group on its own (exit_group: a crash) and says which ports are taken. A signal
    is recorded in `signals`; it ends the group unless the group ignores it (`ignored_signals`, SIGTERM for
    a server that hangs on shutdown). `follow` yields a log's lines as they are appended. A group's environment
    is what its launch passed (its TUNEDASH_JOB tag included); `environs` gives other pids one (GPU holders).
    """

    taken_ports: set[int] = field(default_factory=set)
    ignored_signals: set[int] = field(default_factory=set)
    files: dict[str, str] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)
    groups: dict[int, FakeGroup] = field(default_factory=dict)
    signals: list[tuple[int, int]] = field(default_factory=list)
    next_pid: int = 48921
    identity: HostIdentity = field(default_factory=lambda: HostIdentity("0d5e5c1e-fake-boot", "gpu-box"))
    environs: dict[int, dict[str, str]] = field(default_factory=dict)
    written: dict[str, float] = field(default_factory=dict)  # path -> when it was last written (monotonic)

    async def spawn_detached(
        self, argv: Sequence[str], *, log_path: str, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> SpawnedProcess:
        pid = self.next_pid
        self.next_pid += 100
        start_time = str(1_000_000 + pid)
        self.groups[pid] = FakeGroup(pid, tuple(argv), log_path, dict(env or {}), start_time)
        self.logs.setdefault(log_path, [])
        return SpawnedProcess(pid, pid, start_time)

    def append_log(self, path: str, *lines: str) -> None:
        """The server writes `lines` to its log."""
        self.logs.setdefault(path, []).extend(lines)

    def exit_group(self, pgid: int) -> None:
        """Every process of the group exits on its own (a crash, or a server that stops)."""
        self.groups[pgid].alive = False

    async def signal_group(self, pgid: int, signal_number: int) -> bool:
        self.signals.append((pgid, signal_number))
        group = self.groups.get(pgid)
        if group is None or not group.alive:
            return False
        if signal_number not in self.ignored_signals:
            group.alive = False
        return True

    async def signal_proven_group(self, proof: LeaderProof, signal_number: int) -> bool:
        group = self.groups.get(proof.pgid)
        if group is None or not group.alive:
            return False
        name, _, value = proof.env_line.partition("=")
        if group.start_time != proof.start_time or group.env.get(name) != value:
            raise LeaderMismatch(f"{self.name}: pid {proof.pid} is not the job's leader")
        return await self.signal_group(proof.pgid, signal_number)

    async def processes(self) -> list[ProcessInfo]:
        return [
            ProcessInfo(group.pgid, 1, group.pgid, "S", Path(group.argv[0]).name, group.start_time)
            for group in self.groups.values()
            if group.alive
        ]

    async def boot_identity(self) -> HostIdentity:
        return self.identity

    async def environ_value(self, pid: int, name: str) -> str | None:
        group = self.groups.get(pid)
        if group is not None and group.alive:
            return group.env.get(name, "")
        environ = self.environs.get(pid)
        return None if environ is None else environ.get(name, "")

    async def find_env(self, line: str) -> list[int]:
        name, _, value = line.partition("=")
        return sorted(g.pgid for g in self.groups.values() if g.alive and g.env.get(name) == value)

    async def port_in_use(self, port: int) -> bool:
        return port in self.taken_ports

    async def read_text(self, path: str) -> str | None:
        if path in self.logs:
            return "".join(f"{line}\n" for line in self.logs[path])
        return self.files.get(path)

    async def write_text(self, path: str, text: str) -> None:
        self.files[path] = text
        self.written[path] = time.monotonic()

    async def remove(self, path: str) -> None:
        self.files.pop(path, None)

    async def create_exclusive(self, path: str, text: str) -> bool:
        if path in self.files:
            return False
        await self.write_text(path, text)
        return True

    async def path_age(self, path: str) -> PathAge | None:
        if path not in self.files:
            return None
        return PathAge(time.monotonic() - self.written.get(path, 0.0), True)

    async def spawn_problem(self, argv: Sequence[str], *, log_path: str, env: Mapping[str, str] | None = None) -> str:
        return argv_size_problem(argv, log_path, env or {}, arg_max=ARG_MAX_FALLBACK, where=self.name)

    async def read_window(
        self, path: str, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES
    ) -> LogWindow | None:
        text = await self.read_text(path)
        if text is None:
            return None
        data = text.encode()
        if len(data) <= head_bytes + tail_bytes:
            return window_from(data, None, len(data))
        return window_from(data[:head_bytes], data[len(data) - tail_bytes - 1:], len(data))

    async def follow(
        self, path: str, *, from_start: bool = True, offset: int | None = None
    ) -> AsyncGenerator[str, None]:
        sent = 0 if from_start else len(self.logs.get(path, []))
        if offset is not None:  # the lines that end at or before byte `offset` were read already
            ends = 0
            for sent, line in enumerate(self.logs.get(path, [])):  # noqa: B007 - sent is used after the loop
                if ends >= offset:
                    break
                ends += len(line.encode()) + 1
            else:
                sent = len(self.logs.get(path, []))
        while True:
            lines = self.logs.get(path, [])
            for line in lines[sent:]:
                sent += 1
                yield line
            await asyncio.sleep(0.005)

    @property
    def state_dir(self) -> str:
        return "/state"


TOTAL_MIB = 143771  # an H200


def gpu_reading(
    used_mib: Mapping[int, int], processes: Mapping[int, Sequence[GpuProcess]] | None = None
) -> GpuSnapshot:
    """What nvidia-smi would say of GPUs `used_mib` (index -> MiB used) with `processes` on them, read now."""
    now = time.monotonic()
    held = processes or {}
    return GpuSnapshot(
        gpus=tuple(
            GpuSample(index, f"GPU-{index:08d}", "NVIDIA H200", mib, TOTAL_MIB, processes=tuple(held.get(index, ())),
                      taken_at=now, source="smi", processes_taken_at=now)
            for index, mib in sorted(used_mib.items())
        ),
        taken_at=now,
    )


class ScriptedTelemetry:
    """A Telemetry whose readings the test writes: `sample()` returns `idle`; `stream()` yields `stream_readings`
    one per period, then the last one for ever. Each reading is stamped with the time it is handed out."""

    def __init__(self, idle: GpuSnapshot, stream_readings: Sequence[GpuSnapshot] = ()) -> None:
        self.idle = idle
        self.stream_readings = list(stream_readings) or [idle]
        self.closed = False

    @staticmethod
    def _now(snapshot: GpuSnapshot) -> GpuSnapshot:
        now = time.monotonic()
        gpus = tuple(dataclasses.replace(g, taken_at=now, processes_taken_at=now) for g in snapshot.gpus)
        return dataclasses.replace(snapshot, gpus=gpus, taken_at=now)

    async def sample(self) -> GpuSnapshot:
        return self._now(self.idle)

    async def stream(self, period_ms: int = 1000) -> AsyncGenerator[GpuSnapshot, None]:
        index = 0
        while True:
            yield self._now(self.stream_readings[min(index, len(self.stream_readings) - 1)])
            index += 1
            await asyncio.sleep(period_ms / 1000)

    async def close(self) -> None:
        self.closed = True


def live_group_members(pgid: int) -> list[ProcessInfo]:
    """Processes of a group on this machine that are not zombies (read straight from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            info = parse_stat_line(Path(f"/proc/{entry}/stat").read_text())
        except OSError:
            continue
        if info is not None and info.pgid == pgid and info.state != "Z":
            members.append(info)
    return members
