"""The host interface: run, stream, spawn detached, signal groups, inspect processes and ports."""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from app.core.data import ConnectionState
from app.core.hosts.procfs import ProcessInfo, is_group_member


@dataclass(frozen=True)
class CommandResult:
    """What a finished command returned."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class SpawnedProcess:
    """A detached process: its pid is its process group id (it leads its own session)."""

    pid: int
    pgid: int
    start_time: str  # the host's process start time (field 22 of /proc/PID/stat), to detect PID reuse


@dataclass(frozen=True)
class ConnectionChanged:
    """The connection to a remote host changed state: "connected", "lost", "reconnecting" or "failed".

    `detail` says why (the error, the next retry); `since` is when the host was last reachable (time.time()),
    so a UI can show how old its last values are.
    """

    host: str
    state: ConnectionState
    detail: str
    at: float
    since: float | None = None


class HostError(Exception):
    """A host could not do what was asked; the message names the host and says what to do."""


class Host(abc.ABC):
    """A machine where servers run. LocalHost and SshHost implement it; the core sees only this."""

    name: str

    @abc.abstractmethod
    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        """Run a command to completion and capture its output."""

    @abc.abstractmethod
    def stream_lines(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> AsyncGenerator[str, None]:
        """Run a long-lived command and yield its stdout lines (without newline).

        Closing the iterator (aclose, or leaving `async for` early) terminates the command, so streams
        that lose their reader never pile up on the host. stderr lines are yielded too, prefixed
        with "\\x00stderr:" so a parser can tell them apart; when the command exits, a final line
        "\\x00exit:<code>" is yielded.
        """

    @abc.abstractmethod
    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> SpawnedProcess:
        """Start argv in its own session (setsid), stdin from /dev/null, stdout+stderr appended to log_path."""

    @abc.abstractmethod
    async def signal_group(self, pgid: int, signal_number: int) -> bool:
        """Send a signal to a process group. False when the group no longer exists."""

    @abc.abstractmethod
    async def processes(self) -> list[ProcessInfo]:
        """Every live process on the host (zombies included, with state "Z")."""

    async def group_alive(self, pgid: int, start_time: str) -> bool:
        """True while process group `pgid` has a live (non-zombie) member that started no earlier than
        `start_time` (the recorded leader's start time); the same answer as scanning `processes()`, which
        is what this default does. Hosts override it with a cheaper check (the leader's own stat first)."""
        return any(is_group_member(proc, pgid, start_time) for proc in await self.processes())

    @abc.abstractmethod
    async def port_in_use(self, port: int) -> bool:
        """True when something listens on the TCP port (any address)."""

    @abc.abstractmethod
    async def read_text(self, path: str) -> str | None:
        """A file's text, or None when it does not exist."""

    @abc.abstractmethod
    async def write_text(self, path: str, text: str) -> None:
        """Write a file atomically, creating its folder."""

    @abc.abstractmethod
    async def remove(self, path: str) -> None:
        """Remove a file if it exists."""

    @abc.abstractmethod
    def follow(self, path: str, *, from_start: bool = True) -> AsyncGenerator[str, None]:
        """Yield lines appended to a file as they come (like tail -F), until the iterator is closed."""

    @property
    @abc.abstractmethod
    def state_dir(self) -> str:
        """Where tunedash keeps job records and logs on this host."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    async def http_base(self, port: int) -> str:
        """The base URL that reaches a server listening on `port` of this host (an SSH host forwards it)."""
        return f"http://127.0.0.1:{port}"

    def subscribe_connection(self, listener: Callable[[ConnectionChanged], None]) -> None:  # noqa: B027
        """Be told of connection changes (remote hosts only; a local host never calls it)."""

    def set_trust_prompt(self, prompt: Callable[[object], Awaitable[bool]] | None) -> None:  # noqa: B027
        """Let a UI decide on an unknown host key (remote hosts only). `prompt(request)` gets a TrustRequest."""


async def reach_url(host: Host, url: str) -> str:
    """`url` as this machine reaches it: http://127.0.0.1:PORT/... (or localhost) on a remote host goes
    through the host's forward (Host.http_base); any other URL is returned unchanged."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
        return url
    base = await host.http_base(parts.port)
    rest = url[len(f"{parts.scheme}://{parts.netloc}") :]
    return base + rest
