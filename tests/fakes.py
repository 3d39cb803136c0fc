"""Test doubles shared by the unit tests: a host that only answers commands, and a /proc group scan."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path

from app.core.hosts.base import CommandResult, Host, ProcessInfo, SpawnedProcess
from app.core.hosts.procfs import parse_stat_line


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

    def follow(self, path: str, *, from_start: bool = True) -> AsyncGenerator[str, None]:
        raise NotImplementedError

    @property
    def state_dir(self) -> str:
        return "/tmp"


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
