"""LocalHost: the host interface on this machine, through asyncio subprocesses and /proc.

Over 450 lines: one implementation of the whole Host interface (commands, streams, files, signals, follow).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from stat import S_ISREG
from typing import TypeVar

import platformdirs

from app.core.data import LOG_LINE_CUT
from app.core.hosts.base import (
    CommandResult,
    Host,
    HostError,
    HostIdentity,
    LeaderMismatch,
    LeaderProof,
    NotRegularFile,
    PathAge,
    SpawnedProcess,
)
from app.core.hosts.detach import as_group_leader, detached_argv, detached_pid
from app.core.hosts.lines import LineCutter
from app.core.hosts.local_files import NoFollow, create_exclusive, path_age, private_folder, replace_file
from app.core.hosts.procfs import ProcessInfo, is_recorded_leader, leader_says_alive, listening_ports, parse_stat_line
from app.core.hosts.window import HEAD_BYTES, TAIL_BYTES, LogWindow, window_from
from app.core.tasks import TaskOwner

T = TypeVar("T")
FOLLOW_POLL_S = 0.05  # LocalHost.follow: the poll after new lines
FOLLOW_IDLE_MAX_S = 0.2  # ... and the longest while the file is quiet


class LocalHost(Host):
    """This machine. `extra_env` is added to every command (the simulated host adds its PATH here); `nvml` is the
    pynvml-shaped object that reads its GPUs (None: nvidia-ml-py's `pynvml`; the simulated host passes its own)."""

    is_local = True

    def __init__(
        self,
        name: str = "local",
        *,
        extra_env: Mapping[str, str] | None = None,
        state_dir: str | None = None,
        nvml: object | None = None,
    ) -> None:
        self.name = name
        self.nvml = nvml
        self._extra_env = dict(extra_env or {})
        self._state_dir = state_dir or platformdirs.user_state_dir("tunedash")

    @property
    def state_dir(self) -> str:
        return self._state_dir

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = dict(os.environ)
        merged.update(self._extra_env)
        if env:
            merged.update(env)
        return merged

    async def _start(self, argv: Sequence[str], env: Mapping[str, str] | None) -> asyncio.subprocess.Process:
        """argv started with stdin from /dev/null and stdout, stderr piped (run and stream_lines)."""
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env(env),
        )

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        try:
            proc = await self._start(argv, env)
        except FileNotFoundError:
            return CommandResult(tuple(argv), 127, "", f"sh: 1: {argv[0]}: not found\n")
        except PermissionError as exc:
            return CommandResult(tuple(argv), 126, "", f"{argv[0]}: {exc.strerror}\n")
        except OSError as exc:  # E2BIG (the command over ARG_MAX), ENOEXEC, ...: the command did not start
            return CommandResult(tuple(argv), 126, "", f"{argv[0]}: cannot run it: {exc.strerror or exc}\n")
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise HostError(
                f"{self.name}: `{' '.join(argv)}` did not finish within {timeout} s"
            ) from None
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        return CommandResult(
            tuple(argv), proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
        )

    async def stream_lines(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> AsyncGenerator[str, None]:
        try:
            proc = await self._start(argv, env)
        except FileNotFoundError:
            yield f"\x00stderr:sh: 1: {argv[0]}: not found"
            yield "\x00exit:127"
            return
        queue: asyncio.Queue[str | None] = asyncio.Queue()

        async def pump(stream: asyncio.StreamReader | None, prefix: str) -> None:
            assert stream is not None
            try:
                while True:
                    try:
                        raw = await stream.readline()
                    except ValueError:  # a line over the reader's limit (64 KiB): asyncio drops it; say so
                        raw = LOG_LINE_CUT.strip().encode()
                    if not raw:
                        break
                    await queue.put(prefix + raw.decode(errors="replace").rstrip("\r\n"))
            finally:
                await queue.put(None)  # the reader never waits on a pump that is gone

        pumps = TaskOwner(f"{self.name} stream")
        pumps.spawn(pump(proc.stdout, ""), "stdout")
        pumps.spawn(pump(proc.stderr, "\x00stderr:"), "stderr")
        try:
            open_streams = 2
            while open_streams:
                item = await queue.get()
                if item is None:
                    open_streams -= 1
                    continue
                yield item
            code = await proc.wait()
            yield f"\x00exit:{code}"
        finally:
            pumps.cancel()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                with contextlib.suppress(TimeoutError):  # still there after 2 s: SIGKILL below
                    await asyncio.wait_for(proc.wait(), 2.0)
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()

    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> SpawnedProcess:
        await self.make_folder(str(Path(log_path).parent))
        # The detaching shell runs in the launch's environment too, so the job carries it (its TUNEDASH_JOB tag)
        # from its first instant, not only once `env` has exec'd the server.
        launch = {**self._extra_env, **(env or {})}
        result = await self.run(detached_argv(argv, log_path, launch, cwd), timeout=10.0, env=env)
        pid = detached_pid(self.name, argv, result)
        return await as_group_leader(pid, _read_stat_now, reads=201, pause_s=0.005)  # in-line reads of /proc

    async def signal_group(self, pgid: int, signal_number: int) -> bool:
        self._refuse_group(pgid)
        try:
            os.killpg(pgid, signal_number)
        except ProcessLookupError:
            return False
        except PermissionError as exc:
            raise HostError(
                f"{self.name}: not allowed to signal process group {pgid} ({exc.strerror}); "
                "it belongs to another user"
            ) from exc
        return True

    def _refuse_group(self, pgid: int) -> None:
        """Never signal group 0 or 1 (kill(0) is our own group, kill(-1) every process we can reach) nor our own."""
        if pgid <= 1 or pgid == os.getpgrp():
            raise HostError(f"{self.name}: refusing to signal process group {pgid} (tunedash's own or the system's)")

    def own_pgid(self) -> int | None:
        return os.getpgrp()

    async def boot_identity(self) -> HostIdentity:
        try:
            boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()  # noqa: ASYNC240 - a tiny /proc read
        except OSError:
            boot_id = ""
        return HostIdentity(boot_id, os.uname().nodename)

    async def environ_value(self, pid: int, name: str) -> str | None:
        environ = _read_environ(pid)
        return None if environ is None else environ.get(name, "")

    async def find_env(self, line: str) -> list[int]:
        return await asyncio.to_thread(_find_env, line)

    async def signal_proven_group(self, proof: LeaderProof, signal_number: int) -> bool:
        """The leader through a pidfd (os.pidfd_open) where the platform has one: the descriptor is opened first
        and the leader proven after, so the process signalled is the very one that was proven, even if its pid
        were reused in between; the rest of the group by killpg, only after that proof."""
        self._refuse_group(proof.pgid)
        try:
            return _signal_proven(proof, signal_number)
        except LeaderMismatch as exc:
            raise LeaderMismatch(f"{self.name}: {exc}") from None
        except PermissionError as exc:
            raise HostError(
                f"{self.name}: not allowed to signal process group {proof.pgid} ({exc.strerror}); "
                "it belongs to another user"
            ) from exc

    async def processes(self) -> list[ProcessInfo]:
        return await asyncio.to_thread(_scan_proc)

    async def group_alive(self, pgid: int, start_time: str) -> bool:
        """The leader's /proc/PGID/stat first (one small read: the usual answer while a server runs); when
        the leader is gone or a zombie, kill(-pgid, 0) says whether any process is left in the group (no:
        dead); only then, orphaned children or zombies, the full /proc scan decides. Everything in-line:
        the reads take microseconds, far less than a thread hand-off."""
        said = leader_says_alive(_read_stat(pgid), pgid, start_time)
        if said is not None:
            return said
        if pgid <= 1:
            return False
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # someone else's processes hold the group id: the scan below tells whose
        return await super().group_alive(pgid, start_time)  # the full scan

    async def port_in_use(self, port: int) -> bool:
        text = await asyncio.to_thread(_read_net_tcp)
        return port in listening_ports(text)

    async def read_text(self, path: str) -> str | None:
        try:
            return await asyncio.to_thread(Path(path).read_text)
        except FileNotFoundError:
            return None

    async def read_window(
        self, path: str, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES
    ) -> LogWindow | None:
        try:
            return await asyncio.to_thread(_read_window, path, head_bytes, tail_bytes)
        except FileNotFoundError:
            return None
        except NotRegularFile as exc:
            raise NotRegularFile(f"{self.name}: {exc}") from None
        except OSError as exc:
            raise HostError(f"{self.name}: cannot read {path}: {exc.strerror or exc}") from None

    async def write_text(self, path: str, text: str) -> None:
        await self._in_thread(replace_file, Path(path), text, None, False)

    async def swap_text(self, path: str, text: str, *, expect: str | None) -> bool:
        return await self._in_thread(replace_file, Path(path), text, expect, True)

    async def create_exclusive(self, path: str, text: str) -> bool:
        return await self._in_thread(create_exclusive, Path(path), text)

    async def make_folder(self, folder: str) -> None:
        try:
            await asyncio.to_thread(private_folder, self._state_dir, Path(folder))
        except NoFollow as exc:
            raise HostError(f"{self.name}: {exc}") from None

    async def path_age(self, path: str, *, read: int = 0) -> PathAge | None:
        """The mtime against this machine's clock, from lstat, or from fstat of the file opened with O_NOFOLLOW
        when its bytes are read (so the bytes and the age are one file's)."""
        return path_age(path, read)

    async def _in_thread(self, write: Callable[..., T], target: Path, *args: object) -> T:
        """`write(target, *args)` in a thread, once `target`'s folder is made (private_folder); a link or a
        folder where tunedash writes (NoFollow) becomes a HostError naming the path and what to do."""

        def made() -> T:
            private_folder(self._state_dir, target.parent)
            return write(target, *args)

        try:
            return await asyncio.to_thread(made)
        except NoFollow as exc:
            raise HostError(f"{self.name}: {exc}") from None

    async def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(Path(path).unlink)

    async def follow(
        self, path: str, *, from_start: bool = True, offset: int | None = None
    ) -> AsyncGenerator[str, None]:
        """Poll the file; reopen it when it is replaced or truncated (like tail -F).

        The poll is 50 ms after a read that found lines and doubles while the file is quiet, up to
        FOLLOW_IDLE_MAX_S (0.2 s): a busy log is read at once, an idle one costs 5 wake-ups a second. A line longer
        than LOG_LINE_MAX bytes is cut there with LOG_LINE_CUT; the rest of it is read past, never held."""
        handle = None
        delay = FOLLOW_POLL_S
        inode = None
        position = 0
        lines = LineCutter()
        try:
            while True:
                if handle is None:
                    try:
                        handle = open(path, "rb")  # noqa: SIM115, ASYNC230 - kept open while following
                    except FileNotFoundError:
                        await asyncio.sleep(0.05)
                        continue
                    inode = os.fstat(handle.fileno()).st_ino
                    if offset is not None and position == 0:
                        handle.seek(offset)
                        offset = None  # a file replaced later is read from its start
                    elif not from_start and position == 0:
                        handle.seek(0, os.SEEK_END)
                    position = handle.tell()
                chunk = handle.read(65536)
                if chunk:
                    position += len(chunk)
                    for line in lines.feed(chunk):
                        yield line
                    delay = FOLLOW_POLL_S
                    continue
                await asyncio.sleep(delay)
                delay = min(delay * 2, FOLLOW_IDLE_MAX_S)
                try:
                    stat = os.stat(path)
                except FileNotFoundError:
                    continue
                if stat.st_ino != inode or stat.st_size < position:
                    handle.close()
                    handle = None
                    position = 0
                    from_start = True
        finally:
            if handle is not None:
                handle.close()


def _read_window(path: str, head_bytes: int, tail_bytes: int) -> LogWindow:
    """LocalHost.read_window in-line: opened without blocking (a FIFO would wait for a writer), regular files only."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not S_ISREG(info.st_mode):
            raise NotRegularFile(f"{path} is not a regular file; tunedash reads logs only from files")
        size = info.st_size
        if size <= head_bytes + tail_bytes:
            return window_from(os.pread(fd, size, 0), None, size)
        start = size - tail_bytes - 1
        return window_from(os.pread(fd, head_bytes, 0), os.pread(fd, tail_bytes + 1, start), size)
    finally:
        os.close(fd)

def _read_stat(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return parse_stat_line(handle.read())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


async def _read_stat_now(pid: int) -> ProcessInfo | None:
    """_read_stat, awaitable: the file is read in-line (microseconds), not in a thread."""
    return _read_stat(pid)


def _read_environ(pid: int) -> dict[str, str] | None:
    """The environment process `pid` started with; None when it is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    environ: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            environ.setdefault(name, value)
    return environ


def _find_env(line: str) -> list[int]:
    """The pids whose environment holds `line`. A process caught inside an exec() reads as an empty environment
    for a moment (the old image is gone, the new one not yet mapped): every empty read is read again, twice,
    a millisecond apart, so that a job starting up through `sh` and `env` is not missed."""
    wanted = line.encode()
    found: list[int] = []
    empty: list[int] = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            _match_environ(int(entry.name), wanted, found, empty)
    for _ in range(2):
        if not empty:
            break
        time.sleep(0.001)
        again, empty = empty, []
        for pid in again:
            _match_environ(pid, wanted, found, empty)
    return sorted(found)


def _match_environ(pid: int, wanted: bytes, found: list[int], empty: list[int]) -> None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return
    if not raw:
        empty.append(pid)
    elif wanted in raw.split(b"\0"):
        found.append(pid)


def _signal_proven(proof: LeaderProof, signal_number: int) -> bool:
    """LocalHost.signal_proven_group in-line: open the leader's pidfd, prove it, signal it, then its group."""
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(proof.pid)
        except ProcessLookupError:
            return False
        except OSError:  # ENOSYS (an old kernel): fall back to the pid, proven the same way
            pidfd = None
    try:
        leader = _read_stat(proof.pid)
        if leader is None or leader.state == "Z":
            return False
        if not is_recorded_leader(leader, proof.pid, proof.pgid, proof.start_time):
            raise LeaderMismatch(f"pid {proof.pid} is no longer the job's leader (started {leader.start_time}, "
                                 f"group {leader.pgid}); nothing was signalled")
        name, _, value = proof.env_line.partition("=")
        environ = _read_environ(proof.pid)
        if environ is None or environ.get(name) != value:
            raise LeaderMismatch(f"pid {proof.pid} does not carry {name}={value} in its environment; "
                                 "nothing was signalled")
        if pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal_number)
        try:
            os.killpg(proof.pgid, signal_number)
        except ProcessLookupError:
            return pidfd is not None
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _scan_proc() -> list[ProcessInfo]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            info = _read_stat(int(entry.name))
            if info is not None:
                found.append(info)
    return found


def _read_net_tcp() -> str:
    parts = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            parts.append(Path(name).read_text())
    return "\n".join(parts)


SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGKILL: "SIGKILL", signal.SIGINT: "SIGINT"}
