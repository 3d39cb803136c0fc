"""LocalHost: the host interface on this machine, through asyncio subprocesses and /proc."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path

import platformdirs

from app.core.hosts.base import CommandResult, Host, HostError, SpawnedProcess
from app.core.hosts.procfs import ProcessInfo, is_group_member, listening_ports, parse_stat_line

# Starts argv in a new session, detached from us, with stdin from /dev/null and output appended to
# the log. argv travels as positional parameters, so no value is ever interpreted by the shell.
# The backgrounded `setsid` is not a group leader, so it does not fork: `$!` is the job's pid,
# process group id and session id at once.
FOLLOW_POLL_S = 0.05  # LocalHost.follow: the poll after new lines
FOLLOW_IDLE_MAX_S = 0.2  # ... and the longest while the file is quiet
DETACH_SCRIPT = 'log=$1; shift; setsid nohup "$@" >>"$log" 2>&1 </dev/null & echo $!'


def detached_argv(argv: Sequence[str], log_path: str, env: Mapping[str, str] | None, cwd: str | None) -> list[str]:
    """The argv of a `sh -c` that launches argv detached (shared by local and SSH hosts)."""
    inner: list[str] = []
    if env:
        inner += ["env", *(f"{key}={value}" for key, value in env.items())]
    inner += list(argv)
    script = DETACH_SCRIPT if cwd is None else 'cd "$0" || exit 97; ' + DETACH_SCRIPT
    head = ["sh", "-c", script] + ([cwd] if cwd is not None else ["sh"])
    # With cwd, $0 is the folder and $1 the log; without, $0 is a placeholder.
    return [*head, log_path, *inner]


class LocalHost(Host):
    """This machine. `extra_env` is added to every command (the simulated host adds its PATH here)."""

    is_local = True

    def __init__(
        self, name: str = "local", *, extra_env: Mapping[str, str] | None = None, state_dir: str | None = None
    ) -> None:
        self.name = name
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

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env(env),
            )
        except FileNotFoundError:
            return CommandResult(tuple(argv), 127, "", f"sh: 1: {argv[0]}: not found\n")
        except PermissionError as exc:
            return CommandResult(tuple(argv), 126, "", f"{argv[0]}: {exc.strerror}\n")
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
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env(env),
            )
        except FileNotFoundError:
            yield f"\x00stderr:sh: 1: {argv[0]}: not found"
            yield "\x00exit:127"
            return
        queue: asyncio.Queue[str | None] = asyncio.Queue()

        async def pump(stream: asyncio.StreamReader | None, prefix: str) -> None:
            assert stream is not None
            while True:
                raw = await stream.readline()
                if not raw:
                    break
                await queue.put(prefix + raw.decode(errors="replace").rstrip("\r\n"))
            await queue.put(None)

        pumps = [
            asyncio.create_task(pump(proc.stdout, "")),
            asyncio.create_task(pump(proc.stderr, "\x00stderr:")),
        ]
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
            for task in pumps:
                task.cancel()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                with contextlib.suppress(Exception):
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
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        merged = dict(self._extra_env)
        if env:
            merged.update(env)
        result = await self.run(detached_argv(argv, log_path, merged, cwd), timeout=10.0)
        if result.returncode != 0 or not result.stdout.strip().isdigit():
            raise HostError(
                f"{self.name}: could not start `{argv[0]}` detached: {result.stderr.strip() or result.stdout}"
            )
        pid = int(result.stdout.strip())
        # `$!` can be printed before the child's setsid() ran: wait (briefly) until it leads its own group,
        # so that what we return is true at once (group_alive, signal_group on the pgid).
        info = _read_stat(pid)
        for _ in range(200):
            if info is None or info.pgid == pid:
                break
            await asyncio.sleep(0.005)
            info = _read_stat(pid)
        return SpawnedProcess(pid=pid, pgid=pid, start_time=info.start_time if info else "")

    async def signal_group(self, pgid: int, signal_number: int) -> bool:
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

    async def processes(self) -> list[ProcessInfo]:
        return await asyncio.to_thread(_scan_proc)

    async def group_alive(self, pgid: int, start_time: str) -> bool:
        """The leader's /proc/PGID/stat first (one small read: the usual answer while a server runs); when
        the leader is gone or a zombie, kill(-pgid, 0) says whether any process is left in the group (no:
        dead); only then, orphaned children or zombies, the full /proc scan decides. Everything in-line:
        the reads take microseconds, far less than a thread hand-off."""
        leader = _read_stat(pgid)
        if leader is not None and is_group_member(leader, pgid, start_time):
            return True
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # someone else's processes hold the group id: the scan below tells whose
        return any(is_group_member(proc, pgid, start_time) for proc in await self.processes())

    async def port_in_use(self, port: int) -> bool:
        text = await asyncio.to_thread(_read_net_tcp)
        return port in listening_ports(text)

    async def read_text(self, path: str) -> str | None:
        try:
            return await asyncio.to_thread(Path(path).read_text)
        except FileNotFoundError:
            return None

    async def write_text(self, path: str, text: str) -> None:
        def write() -> None:
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(target)

        await asyncio.to_thread(write)

    async def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(Path(path).unlink)

    async def follow(self, path: str, *, from_start: bool = True) -> AsyncGenerator[str, None]:
        """Poll the file; reopen it when it is replaced or truncated (like tail -F).

        The poll is 50 ms after a read that found lines and doubles while the file is quiet, up to
        FOLLOW_IDLE_MAX_S (0.2 s): a busy log is read at once, an idle one costs 5 wake-ups a second."""
        handle = None
        delay = FOLLOW_POLL_S
        inode = None
        position = 0
        pending = ""
        try:
            while True:
                if handle is None:
                    try:
                        handle = open(path, "rb")  # noqa: SIM115, ASYNC230 - kept open while following
                    except FileNotFoundError:
                        await asyncio.sleep(0.05)
                        continue
                    inode = os.fstat(handle.fileno()).st_ino
                    if not from_start and position == 0:
                        handle.seek(0, os.SEEK_END)
                    position = handle.tell()
                chunk = handle.read(65536)
                if chunk:
                    position += len(chunk)
                    pending += chunk.decode(errors="replace")
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        yield line.rstrip("\r")
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


def _read_stat(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return parse_stat_line(handle.read())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


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
