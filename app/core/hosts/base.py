"""The host interface: run, stream, spawn detached, signal groups, inspect processes and ports."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from app.core.data import ConnectionState, EventLevel
from app.core.errors import TunedashError
from app.core.hosts.argv_limits import ARG_MAX_FALLBACK, PROGRAM_SCRIPT, argv_size_problem
from app.core.hosts.procfs import ProcessInfo, group_alive_in
from app.core.hosts.shell_scripts import (
    AGE_SCRIPT,
    CREATE_SCRIPT,
    ENV_VALUE_SCRIPT,
    FIND_ENV_SCRIPT,
    FOLDER_SCRIPT,
    IDENTITY_SCRIPT,
    PROVEN_SIGNAL_SCRIPT,
)
from app.core.hosts.window import HEAD_BYTES, TAIL_BYTES, WINDOW_SCRIPT, LogWindow, WindowError, window_from_script
from app.core.tasks import Unsubscribe


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


@dataclass(frozen=True)
class HostIdentity:
    """Which machine and which boot of it: a job record names both, so a record from another boot (its server
    died with the reboot; its pid may now be anything) or from another host (an NFS home) is never trusted."""

    boot_id: str  # /proc/sys/kernel/random/boot_id ("" when unreadable)
    hostname: str  # uname -n


@dataclass(frozen=True)
class LeaderProof:
    """What must still be true of a job's group leader right before its group is signalled: the same pid,
    leading the same group, started at the same tick, with `env_line` (NAME=value) in its environment."""

    pid: int
    pgid: int
    start_time: str
    env_line: str


@dataclass(frozen=True)
class PathAge:
    """How long ago a path on a host was last modified, by that host's own clock (its mtime against the host's
    time, both read on the host: one clock for every client). Read with lstat: a link is never followed."""

    age_s: float  # negative: modified "in the future" of the host's clock
    plain: bool  # a plain file (not a symbolic link, folder, fifo, ...)
    text: str | None = None  # its first bytes, when asked for (`read`) and it is a plain file
    cut: bool = False  # it holds more than the bytes asked for


def parse_age(text: str) -> PathAge | None:
    """AGE_SCRIPT's line "PLAIN NOW MTIME DATE TIME.FRACTION ZONE" as a PathAge; None when it is not one. NOW
    may lack its fraction (a `date` without %N) and MTIME's fraction comes from stat's %y."""
    parts = text.split()
    if len(parts) < 4 or parts[0] not in ("0", "1"):
        return None
    now_whole, _, now_fraction = parts[1].partition(".")
    _, _, mtime_fraction = parts[4].partition(".") if len(parts) > 4 else ("", "", "")
    if not (now_whole.isdigit() and parts[2].lstrip("-").isdigit()):
        return None
    now = int(now_whole) + (float(f"0.{now_fraction}") if now_fraction.isdigit() else 0.0)
    mtime = int(parts[2]) + (float(f"0.{mtime_fraction}") if mtime_fraction.isdigit() else 0.0)
    return PathAge(now - mtime, parts[0] == "1")


@dataclass(frozen=True)
class SchedulerStep:
    """One of tunedash's steps a cluster scheduler lists (Slurm: squeue's step id, name, node, time running)."""

    step: str
    name: str
    node: str
    elapsed: str


class HostError(TunedashError):
    """A host could not do what was asked; the message names the host and says what to do."""

    title = "Host problem"


class NotRegularFile(HostError):
    """A path that must be a regular file (a log to replay) is something else (a FIFO, a device, a folder)."""

    title = "Not a regular file"


class LeaderMismatch(HostError):
    """The process at a job's leader pid is not the recorded leader (reused pid, no tag): nothing was signalled."""

    title = "Not the recorded server"


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

    async def spawn_problem(self, argv: Sequence[str], *, log_path: str, env: Mapping[str, str] | None = None) -> str:
        """Why spawn_detached(argv, ...) would fail on this host ("" when it would start): the command over the
        host's argument limits (argv_limits.argv_size_problem: ARG_MAX from `getconf`, one argument at most
        MAX_ARG_STRLEN) or its program not found. Checked before a relaunch
        kills anything."""
        script = f"getconf ARG_MAX 2>/dev/null || echo 0; env | wc -c; {PROGRAM_SCRIPT} && echo found || echo missing"
        result = await self.run(["sh", "-c", script, "sh", argv[0] if argv else ""], timeout=30.0, env=env)
        lines = [line.strip() for line in result.stdout.splitlines()]
        if len(lines) < 3:
            return ""  # the host did not answer the check: the spawn itself says what went wrong
        arg_max = int(lines[0]) if lines[0].isdigit() and int(lines[0]) > 0 else ARG_MAX_FALLBACK
        environ = int(lines[1]) if lines[1].isdigit() else 0
        size = argv_size_problem(argv, log_path, env or {}, arg_max=arg_max - environ - 4096, where=self.name)
        if size:
            return size
        if lines[2] == "missing":
            return (f"{self.name}: {argv[0]!r} is not an executable file there nor on its PATH: the launch would "
                    "fail; fix the profile's python (or command); nothing was stopped or started")
        return ""

    @abc.abstractmethod
    async def signal_group(self, pgid: int, signal_number: int) -> bool:
        """Send a signal to a process group. False when the group no longer exists."""

    @abc.abstractmethod
    async def processes(self) -> list[ProcessInfo]:
        """Every live process on the host (zombies included, with state "Z")."""

    async def group_alive(self, pgid: int, start_time: str) -> bool:
        """True while the job's process group `pgid` lives: its leader (pid `pgid`) is the one recorded as
        started at `start_time` (that pid as another process: gone), or, the leader gone, a live (non-zombie)
        member started no earlier than it; the same answer as scanning `processes()` (procfs.group_alive_in),
        which is what this default does. Hosts override it with a cheaper check (the leader's own stat first)."""
        return group_alive_in(await self.processes(), pgid, start_time)

    def own_pgid(self) -> int | None:
        """tunedash's own process group on this host (never signalled); None where tunedash does not run there."""
        return None

    async def boot_identity(self) -> HostIdentity:
        """This host's boot id and hostname."""
        result = await self.run(["sh", "-c", IDENTITY_SCRIPT], timeout=30.0)
        lines = result.stdout.splitlines()
        boot_id = lines[0].strip() if lines else ""
        return HostIdentity(boot_id, lines[1].strip() if len(lines) > 1 else "")

    async def environ_value(self, pid: int, name: str) -> str | None:
        """The value of `name` in the environment process `pid` started with: "" when it has none, None when
        it cannot be read (the process is gone, or belongs to another user)."""
        result = await self.run(["sh", "-c", ENV_VALUE_SCRIPT, "sh", str(int(pid)), name], timeout=30.0)
        if result.returncode == 0:
            return result.stdout.rstrip("\n")
        return "" if result.returncode == 1 else None

    async def find_env(self, line: str) -> list[int]:
        """The pids of processes (readable by us) whose environment holds exactly `line` (NAME=value)."""
        result = await self.run(["sh", "-c", FIND_ENV_SCRIPT, "sh", line], timeout=60.0)
        pids = set()
        for path in result.stdout.splitlines():
            parts = path.split("/")
            if len(parts) == 4 and parts[2].isdigit():
                pids.add(int(parts[2]))
        return sorted(pids)

    async def signal_proven_group(self, proof: LeaderProof, signal_number: int) -> bool:
        """Signal the group `proof.pgid` only if its leader is still exactly `proof` (checked on the host right
        before the signal). False when the leader is gone; LeaderMismatch when the pid is another process."""
        argv = [str(int(signal_number)), str(int(proof.pid)), str(int(proof.pgid)), proof.start_time, proof.env_line]
        result = await self.run(["sh", "-c", PROVEN_SIGNAL_SCRIPT, "sh", *argv], timeout=30.0)
        if result.returncode == 0:
            return True
        if result.returncode == 45:
            return False
        message = (result.stderr or result.stdout).strip()
        if result.returncode == 46:
            raise LeaderMismatch(f"{self.name}: pid {proof.pid} is no longer the job's leader; nothing was signalled")
        if result.returncode == 47:
            raise HostError(
                f"{self.name}: not allowed to signal process group {proof.pgid} ({message}); it belongs to another user"
            )
        raise HostError(f"{self.name}: kill of group {proof.pgid} failed: {message or result.returncode}")

    @abc.abstractmethod
    async def port_in_use(self, port: int) -> bool:
        """True when something listens on the TCP port (any address)."""

    @abc.abstractmethod
    async def read_text(self, path: str) -> str | None:
        """A file's text, or None when it does not exist."""

    async def read_window(
        self, path: str, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES
    ) -> LogWindow | None:
        """The whole lines of the file's first `head_bytes` and last `tail_bytes` (app.core.hosts.window), cut on the
        host; None when it does not exist, NotRegularFile when it is not a regular file."""
        script = ["sh", "-c", WINDOW_SCRIPT, "sh", path, str(int(head_bytes)), str(int(tail_bytes))]
        result = await self.run(script, timeout=60.0)
        if result.returncode == 44:
            return None
        if result.returncode == 45:
            raise NotRegularFile(f"{self.name}: {path} is not a regular file; tunedash reads logs only from files")
        if result.returncode != 0:
            raise HostError(f"{self.name}: cannot read {path}: {result.stderr.strip() or result.returncode}")
        try:
            return window_from_script(result.stdout)
        except WindowError as exc:
            raise HostError(f"{self.name}: cannot read {path} ({exc}); does the host have head, tail and base64?") \
                from None

    @abc.abstractmethod
    async def write_text(self, path: str, text: str) -> None:
        """Write a file atomically (a temporary file of its own, flushed to disk, renamed over the file),
        creating its folder (as `make_folder`); a write cut short leaves the old file as it was. The file is
        0600; a symbolic link at `path` is replaced, never followed."""

    async def swap_text(self, path: str, text: str, *, expect: str | None) -> bool:
        """Replace `path` with `text` only if it still holds `expect` (None: only if it does not exist); False
        when it holds something else. Hosts do the compare and the rename under a lock on the file
        (`<path>.lock`, 0600), so two writers never both win; a symbolic link at `path` or at its lock is
        refused (HostError naming it), never followed. This default (read, compare, write) is for hosts
        with a single writer (tests)."""
        if await self.read_text(path) != expect:
            return False
        await self.write_text(path, text)
        return True

    @abc.abstractmethod
    async def remove(self, path: str) -> None:
        """Remove a file if it exists."""

    async def create_exclusive(self, path: str, text: str) -> bool:
        """Create `path` holding `text` unless it exists (a symbolic link counts as existing): True when this
        call created it. The text goes to a temporary file of its own first, which is then hard-linked to
        `path` (link(2) fails when `path` exists): two callers racing for one path, exactly one gets True, and
        a crash or a full disk never leaves `path` half written. Its folder is created as `make_folder` does;
        the file is 0600. HostError when the host cannot create it at all."""
        result = await self.run(["sh", "-c", CREATE_SCRIPT, "sh", self.state_dir, path, text], timeout=30.0)
        if result.returncode in (0, 53):
            return result.returncode == 0
        raise HostError(f"{self.name}: cannot create {path}: {result.stderr.strip() or result.returncode}")

    async def path_age(self, path: str, *, read: int = 0) -> PathAge | None:
        """How long ago `path` was modified, by this host's clock, and (`read` > 0) its first `read` bytes when
        it is a plain file; None when nothing is there. A link is never followed (nor read)."""
        result = await self.run(["sh", "-c", AGE_SCRIPT, "sh", path, str(read + 1 if read > 0 else 0)], timeout=30.0)
        if result.returncode == 44:
            return None
        stamp, _, rest = result.stdout.partition("\n")
        age = parse_age(stamp) if result.returncode == 0 else None
        if age is None:
            raise HostError(f"{self.name}: cannot read the age of {path}: "
                            f"{(result.stderr or result.stdout).strip() or result.returncode}")
        if read > 0 and age.plain:
            return dataclasses.replace(age, text=rest[:read], cut=len(rest) > read)
        return age

    async def make_folder(self, folder: str) -> None:
        """Create `folder` and its parents as needed. Inside the state folder, each folder created is 0700, the
        folders from `folder` up to the state folder are tightened to 0700 when found wider, and a symbolic
        link among them (below the state folder itself) is refused: HostError naming it."""
        result = await self.run(["sh", "-c", FOLDER_SCRIPT, "sh", self.state_dir, folder], timeout=30.0)
        if result.returncode != 0:
            raise HostError(f"{self.name}: cannot create {folder}: {result.stderr.strip() or result.returncode}")

    @abc.abstractmethod
    def follow(
        self, path: str, *, from_start: bool = True, offset: int | None = None
    ) -> AsyncGenerator[str, None]:
        """Yield lines appended to a file as they come (like tail -F), until the iterator is closed: from its
        start, from its end (`from_start=False`), or from byte `offset` (a LogWindow's end)."""

    @property
    @abc.abstractmethod
    def state_dir(self) -> str:
        """Where tunedash keeps job records and logs on this host."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    async def http_base(self, port: int) -> str:
        """The base URL that reaches a server listening on `port` of this host (an SSH host forwards it)."""
        return f"http://127.0.0.1:{port}"

    def subscribe_connection(self, listener: Callable[[ConnectionChanged], None]) -> Unsubscribe:
        """Be told of connection changes (remote hosts only; a local host never calls it); returns the function
        that unsubscribes, which whoever subscribed calls when it closes."""
        return _nothing_to_undo

    def subscribe_notices(self, listener: Callable[[str, EventLevel], None]) -> Unsubscribe:
        """Be told what the host's scheduler says that a person should hear (a Slurm allocation's time running out)
        as (text, level); returns the unsubscribe. Hosts without a scheduler never call it."""
        return _nothing_to_undo

    def scheduler_line(self) -> str | None:
        """One short line on the allocation this host lives in ("slurm 42 on node1: RUNNING, 12:03 left"), from
        what was last read (no I/O); None on a host without a scheduler."""
        return None

    async def scheduler_steps(self) -> list[SchedulerStep]:
        """tunedash's servers as the scheduler lists them, every allocation of this user (the fleet shows one row
        per step); [] on a host without a scheduler. Never allocates anything."""
        return []

    async def time_left_s(self) -> float | None:
        """Seconds until the host's allocation ends; None when nothing ends it (no scheduler, no time limit)."""
        return None

    async def signal_text(self, pgid: int, signal_name: str) -> str:
        """What sending `signal_name` ("SIGTERM") to the launch whose process group is `pgid` does on this host,
        in a few words for the event log and the kill confirmation (a Slurm host names its scancel)."""
        return f"{signal_name} to group {pgid}"

    def kill_text(self, pgid: int) -> str:
        """The kill confirmation's sentence for the launch whose process group is `pgid`: what the kill sends
        (no I/O: from what the host knows already; the dashboard asks in its key handler)."""
        return f"SIGTERM to process group {pgid}, then SIGKILL after the grace period."

    @property
    def connection_listeners(self) -> int:
        """How many listeners `subscribe_connection` holds now (0 on a host without connection events)."""
        return 0

    def set_trust_prompt(self, prompt: Callable[[object], Awaitable[bool]] | None) -> None:  # noqa: B027
        """Let a UI decide on an unknown host key (remote hosts only). `prompt(request)` gets a TrustRequest."""


def _nothing_to_undo() -> None:
    """The unsubscribe of a host that never calls its connection listeners."""


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
