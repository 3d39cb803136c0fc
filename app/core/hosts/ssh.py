"""SshHost: the host interface over one persistent asyncssh connection per host, with reconnects.

Every command is an argv list, quoted with shlex.join here and only here, into a script for a fixed /bin/sh.
The exec request itself is always LOGIN_COMMAND, which the user's login shell (sh, bash, zsh, fish, csh, tcsh:
whatever it is) parses the same way; the script goes to that /bin/sh on the channel's stdin, so no login shell
ever sees a value (docs/decisions.md#ssh-commands-through-a-fixed-binsh). `extra_env` (the simulated host's PATH,
TUNEDASH_SIM_STATE, PYTHONPATH) and per-call env travel as `env K=V ... argv`; a command's own input is a quoted
value in the script too, piped to it by /bin/sh.

Streams: one channel per stream on the same connection. The remote command runs under a small `sh` watchdog
that kills the command's process group (sshd makes each session its own group) when the channel's stdin
reaches EOF, which happens when we close the channel and when the connection dies; so streams that lose
their reader never pile up on the host, even on OpenSSH versions that ignore channel signals for root. Their
lines are cut at LOG_LINE_MAX (64 KiB) as they arrive, as LocalHost.follow cuts them.

Connection loss: a supervisor task waits on the connection; when it closes unexpectedly it emits
ConnectionChanged("lost"), retries with capped exponential backoff (1 s doubling to 30 s), and emits
"connected" when back. While disconnected, every call fails at once with a HostError that says so (callers
retry: telemetry yields error snapshots, the lifecycle keeps watching); `follow` waits and resumes where it
was. A permanent failure (host key unknown or changed, login refused) emits "failed" with the reason and
ends the attempts of this host object. Every connection is opened by `ssh_trust.open_verified` with the
options `ssh_options` reads from ~/.ssh/config, so the host-key check and the login agree.
Detached servers never depend on the connection (setsid nohup), so a disconnect never touches them.

HTTP to the server goes through a local port forward on the same connection, cached per destination and port; the
local port is re-bound to the same number after a reconnect so a probe's base URL stays valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shlex
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import asyncssh

from app.core.data import ConnectionState
from app.core.hosts.base import CommandResult, ConnectionChanged, Host, HostError, SpawnedProcess
from app.core.hosts.detach import as_group_leader, detached_argv, detached_pid
from app.core.hosts.lines import LineCutter
from app.core.hosts.procfs import ProcessInfo, leader_says_alive, listening_ports, parse_stat_line, parse_stat_text
from app.core.hosts.shell_scripts import WRITE_SCRIPT
from app.core.hosts.ssh_options import SshTarget, settings_for
from app.core.hosts.ssh_trust import (
    HostKeyChanged,
    HostKeyUnknown,
    LoginRefused,
    TrustRequest,
    add_known_host,
    open_verified,
)
from app.core.tasks import Listeners, TaskOwner, Unsubscribe

# Run "$@" with stdin from /dev/null; a background `cat` holds the channel's stdin and, at its EOF (channel
# closed or connection gone), signals the whole process group. Its own output goes nowhere, so it never
# keeps the channel open after the command exits.
WATCHDOG = 'exec 3<&0; (cat <&3 >/dev/null 2>&1; kill -TERM 0) >/dev/null 2>&1 </dev/null & exec "$@" </dev/null 3<&-'
# What every exec request asks the login shell to run: three plain words, the same in every shell, no quote,
# backslash, `$`, `!` or glob. /bin/sh then reads the script from stdin; it may read ahead (dash reads blocks),
# so nothing but the script is ever written there: a stream's watchdog sees only the EOF.
LOGIN_COMMAND = "exec /bin/sh -s"
READ_CHUNK = 65536  # stream_lines reads the channel in chunks this size; LineCutter makes the lines
BACKOFF_S = (1.0, 30.0)
class HostClosed(HostError):
    """The SshHost was closed on purpose: no reconnect will come."""


FINAL = (HostKeyChanged, HostKeyUnknown, LoginRefused)  # a retry cannot fix these: "failed", no more attempts


class SshHost(Host):
    """A remote machine reached over SSH. `options`: asyncssh option values over ~/.ssh/config (tests pin
    known_hosts files and client keys there); host-key checking is always on, agent forwarding and PTYs off."""

    is_local = False

    def __init__(
        self,
        spec: str,
        *,
        extra_env: Mapping[str, str] | None = None,
        state_dir: str | None = None,
        options: Mapping[str, Any] | None = None,
        backoff_s: tuple[float, float] = BACKOFF_S,
    ) -> None:
        self.target = SshTarget.parse(spec)
        self.name = spec
        self._extra_env = dict(extra_env or {})
        # Relative paths resolve in the login directory, where every remote command starts.
        self._state_dir = state_dir or ".local/state/tunedash"
        self._options = dict(options or {})
        self._backoff_s = backoff_s
        self._conn: asyncssh.SSHClientConnection | None = None
        self._connect_lock = asyncio.Lock()
        self._connected = asyncio.Event()
        self._ever_connected = False
        self._closing = False
        self._failed: HostError | None = None
        self._last_error: HostError | None = None
        self._last_attempt = 0.0
        self._lost_at: float | None = None
        self._next_try_at: float | None = None
        self._tasks = TaskOwner(f"ssh {spec}")  # the supervisor that reconnects
        self._listeners: Listeners[ConnectionChanged] = Listeners(f"ssh {spec}")
        self._trust_prompt: Callable[[object], Awaitable[bool]] | None = None
        self._forwards: dict[tuple[str, int], int] = {}  # (destination, its port) -> local port
        self._listeners_fw: dict[tuple[str, int], asyncssh.SSHListener] = {}
        self.state = "disconnected"

    # ---- connection ------------------------------------------------------------------------------
    @property
    def state_dir(self) -> str:
        return self._state_dir

    def subscribe_connection(self, listener: Callable[[ConnectionChanged], None]) -> Unsubscribe:
        return self._listeners.subscribe(listener)

    @property
    def connection_listeners(self) -> int:
        return len(self._listeners)

    def set_trust_prompt(self, prompt: Callable[[object], Awaitable[bool]] | None) -> None:
        self._trust_prompt = prompt

    def _emit(self, state: ConnectionState, detail: str, since: float | None = None) -> None:
        self.state = state
        self._listeners.emit(ConnectionChanged(self.name, state, detail, time.time(), since))

    async def _open(self) -> asyncssh.SSHClientConnection:
        """One connection attempt (the config read afresh); an unknown key goes to the trust prompt if any.
        Raises HostKeyChanged, HostKeyUnknown, LoginRefused or HostError."""
        settings = await asyncio.to_thread(settings_for, self.target, self._options)
        try:
            return await open_verified(settings)
        except HostKeyUnknown as exc:
            if self._trust_prompt is None:
                raise
            if await self._trust_prompt(exc.request):
                await asyncio.to_thread(add_known_host, exc.request)  # a file append: off the loop
                return await self._open()  # the next host of a ProxyJump chain may ask in turn
            # The person said no: final for this host object (no retry asks again every second).
            self._failed = exc
            raise

    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self._conn is not None:
            return self._conn
        if self._closing:  # closed on purpose: nothing reconnects, so a caller must not wait for it
            raise HostClosed(f"{self.name}: the connection was closed")
        if self._failed is not None:
            raise self._failed
        if self._ever_connected:
            age = time.time() - (self._lost_at or time.time())
            wait = max(0.0, (self._next_try_at or time.monotonic()) - time.monotonic())
            raise HostError(f"{self.name}: connection lost {age:.0f} s ago; reconnecting (next try in {wait:.0f} s)")
        async with self._connect_lock:
            if self._conn is not None:
                return self._conn
            if self._failed is not None:  # decided while this call waited for the lock (a declined key)
                raise self._failed
            if self._last_error is not None and time.monotonic() - self._last_attempt < 1.0:
                raise self._last_error
            self._last_attempt = time.monotonic()
            try:
                conn = await self._open()
            except FINAL as exc:
                self._last_error = exc
                if isinstance(exc, LoginRefused):  # each try is a failed login on the host's books
                    self._failed = exc
                self._emit("failed", str(exc))
                raise
            except HostError as exc:
                self._last_error = exc
                raise
            self._adopt(conn)
            self._ever_connected = True
            self._emit("connected", f"connected to {self.name}")
            self._tasks.spawn(self._supervise(), "supervisor")
            return conn

    def _adopt(self, conn: asyncssh.SSHClientConnection) -> None:
        self._conn = conn
        self._last_error = None
        self._lost_at = None
        self._connected.set()

    async def _supervise(self) -> None:
        """Wait for the connection to close; unless we closed it, reconnect with capped exponential backoff."""
        while not self._closing:
            conn = self._conn
            if conn is None:
                return
            await conn.wait_closed()
            if self._closing:
                return
            self._conn = None
            self._connected.clear()
            self._listeners_fw.clear()
            self._lost_at = time.time()
            delay = self._backoff_s[0]
            lost_at = self._lost_at
            self._emit("lost", f"connection to {self.name} lost; reconnecting in {delay:.0f} s", lost_at)
            while not self._closing:
                self._next_try_at = time.monotonic() + delay
                await asyncio.sleep(delay)
                try:
                    conn = await self._open()
                except FINAL as exc:
                    self._failed = exc
                    self._emit("failed", str(exc), lost_at)
                    self._connected.set()  # wake waiters so they see the failure
                    return
                except HostError as exc:
                    delay = min(delay * 2, self._backoff_s[1])
                    self._emit("reconnecting", f"{exc}; next try in {delay:.0f} s", lost_at)
                    continue
                self._adopt(conn)
                await self._restore_forwards(conn)
                away = time.time() - (lost_at or time.time())
                self._emit("connected", f"reconnected to {self.name} after {away:.1f} s", lost_at)
                break

    async def wait_connected(self) -> None:
        """Until the connection is back (raises the permanent failure if reconnecting gave up, HostClosed once
        close() was called: a follower would otherwise wake at once forever)."""
        if self._closing:
            raise HostClosed(f"{self.name}: the connection was closed")
        if self._conn is None and not self._ever_connected:
            await self._connection()
            return
        await self._connected.wait()
        if self._failed is not None:
            raise self._failed

    async def close(self) -> None:
        self._closing = True
        await self._tasks.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            # Closing on purpose: only the end is awaited, and a connection that fails on its way out has
            # nothing left to lose (every command on it already returned or raised).
            with contextlib.suppress(Exception):
                await conn.wait_closed()

    # ---- commands --------------------------------------------------------------------------------
    def _command(self, argv: Sequence[str], env: Mapping[str, str] | None) -> str:
        """argv (after `env K=V ...` when there is env) as one POSIX-quoted command line, for /bin/sh alone."""
        merged = dict(self._extra_env)
        if env:
            merged.update(env)
        prefix = ["env", *(f"{key}={value}" for key, value in merged.items())] if merged else []
        return shlex.join([*prefix, *argv])

    @staticmethod
    def _script(command: str, input_text: str | None = None) -> str:
        """The script LOGIN_COMMAND's /bin/sh reads: `command` replaces it (its exit status, its signals), fed
        `input_text` (quoted, exact to the byte) through a pipe when there is one."""
        if input_text is None:
            return f"exec {command}\n"
        return f"printf %s {shlex.quote(input_text)} | exec {command}\n"

    def _lost(self, exc: BaseException) -> HostError:
        return HostError(f"{self.name}: connection problem ({type(exc).__name__}: {exc}); tunedash reconnects")

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = 30.0,
        env: Mapping[str, str] | None = None,
        input_text: str | None = None,
    ) -> CommandResult:
        conn = await self._connection()
        try:
            script = self._script(self._command(argv, env), input_text)
            result = await conn.run(LOGIN_COMMAND, input=script, timeout=timeout, check=False)
        except asyncssh.TimeoutError:
            raise HostError(f"{self.name}: `{' '.join(argv)}` did not finish within {timeout} s") from None
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from None
        code = result.returncode if result.returncode is not None else -1
        return CommandResult(tuple(argv), code, _text(result.stdout), _text(result.stderr))

    async def stream_lines(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> AsyncGenerator[str, None]:
        conn = await self._connection()
        command = shlex.join(["sh", "-c", WATCHDOG, "sh"]) + " " + self._command(argv, env)
        try:
            proc = await conn.create_process(LOGIN_COMMAND, encoding=None)
            proc.stdin.write(self._script(command).encode())  # no EOF: the watchdog waits for it
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from None
        queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue()

        async def pump(stream: asyncssh.SSHReader[bytes], prefix: str) -> None:
            # Chunks, not readline: asyncssh hands back a line over its receive window (~2 MiB) in pieces,
            # and would hold it whole until then.
            lines = LineCutter()
            try:
                while chunk := await stream.read(READ_CHUNK):
                    for line in lines.feed(chunk):
                        await queue.put(prefix + line)
                for line in lines.end():
                    await queue.put(prefix + line)
            except (asyncssh.Error, OSError) as exc:
                await queue.put(exc)
            await queue.put(None)

        pumps = TaskOwner(f"{self.name} stream")
        pumps.spawn(pump(proc.stdout, ""), "stdout")
        pumps.spawn(pump(proc.stderr, "\x00stderr:"), "stderr")
        try:
            open_streams = 2
            while open_streams:
                item = await queue.get()
                if item is None:
                    open_streams -= 1
                elif isinstance(item, BaseException):
                    raise self._lost(item)
                else:
                    yield item
            await proc.wait_closed()
            if proc.exit_status is None and proc.exit_signal is None:
                raise self._lost(ConnectionError("the channel closed without an exit status"))
            yield f"\x00exit:{proc.returncode if proc.returncode is not None else -1}"
        finally:
            pumps.cancel()
            proc.close()  # the remote watchdog sees stdin EOF and ends the command's group

    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> SpawnedProcess:
        await self.make_folder(log_path.rsplit("/", 1)[0] if "/" in log_path else ".")
        launch_env = {**self._extra_env, **(env or {})}
        # env also on the detaching shell: the job carries it (its TUNEDASH_JOB tag) from its first instant
        result = await self.run(detached_argv(argv, log_path, launch_env, cwd), timeout=10.0, env=dict(env or {}))
        pid = detached_pid(self.name, argv, result)
        return await as_group_leader(pid, self._read_stat, reads=20, pause_s=0.01)

    async def _read_stat(self, pid: int) -> ProcessInfo | None:
        """One process's stat line from the host; None when it is gone."""
        stat = await self.run(["cat", f"/proc/{pid}/stat"], timeout=10.0)
        return parse_stat_line(stat.stdout) if stat.returncode == 0 else None

    async def signal_group(self, pgid: int, signal_number: int) -> bool:
        if pgid <= 1:  # kill(-1) is every process we can reach; group 0 the caller's own
            raise HostError(f"{self.name}: refusing to signal process group {pgid}")
        # The shell's own kill (dash and bash both take `kill -N -PGID`; dash rejects `--`).
        result = await self.run(["sh", "-c", 'kill -"$1" "$2"', "sh", str(int(signal_number)), f"-{int(pgid)}"])
        if result.returncode == 0:
            return True
        message = (result.stderr or result.stdout).strip()
        if "No such process" in message:
            return False
        if "not permitted" in message:
            raise HostError(
                f"{self.name}: not allowed to signal process group {pgid} ({message}); it belongs to another user"
            )
        raise HostError(f"{self.name}: kill of group {pgid} failed: {message}")

    async def processes(self) -> list[ProcessInfo]:
        result = await self.run(["sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null; exit 0"])
        return parse_stat_text(result.stdout)

    async def group_alive(self, pgid: int, start_time: str) -> bool:
        """One small exec: the leader's stat line, then "=group" when `kill -0 -PGID` finds any process in the
        group (or is refused: another user's). A live leader answers; no group at all is dead; only a group
        without its leader (orphaned children, zombies) costs the full process scan."""
        script = 'cat "/proc/$1/stat" 2>/dev/null; err=$(kill -0 "-$1" 2>&1) && echo =group || ' \
                 'case "$err" in *ermitted*) echo =group;; esac; exit 0'
        result = await self.run(["sh", "-c", script, "sh", str(int(pgid))])
        lines = result.stdout.splitlines()
        leader = parse_stat_line(lines[0]) if lines and not lines[0].startswith("=") else None
        said = leader_says_alive(leader, pgid, start_time)
        if said is not None:
            return said
        if "=group" not in lines:
            return False
        return await super().group_alive(pgid, start_time)  # the full scan

    async def port_in_use(self, port: int) -> bool:
        result = await self.run(["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; exit 0"])
        return port in listening_ports(result.stdout)

    async def read_text(self, path: str) -> str | None:
        result = await self.run(["sh", "-c", 'test -e "$1" || exit 44; exec cat -- "$1"', "sh", path])
        if result.returncode == 44:
            return None
        if result.returncode != 0:
            raise HostError(f"{self.name}: cannot read {path}: {result.stderr.strip()}")
        return result.stdout

    async def write_text(self, path: str, text: str) -> None:
        await self._write(path, text, "any")

    async def swap_text(self, path: str, text: str, *, expect: str | None) -> bool:
        expected = "absent" if expect is None else hashlib.sha256(expect.encode()).hexdigest()
        return await self._write(path, text, expected)

    async def _write(self, path: str, text: str, expect: str) -> bool:
        """WRITE_SCRIPT on the host; False when a swap found other contents (49)."""
        size = str(len(text.encode()))
        result = await self.run(["sh", "-c", WRITE_SCRIPT, "sh", path, size, expect, self.state_dir],
                                input_text=text)
        if result.returncode == 49:
            return False
        if result.returncode != 0:
            raise HostError(f"{self.name}: cannot write {path}: {result.stderr.strip() or result.returncode}")
        return True

    async def remove(self, path: str) -> None:
        await self.run(["rm", "-f", "--", path])

    async def follow(
        self, path: str, *, from_start: bool = True, offset: int | None = None
    ) -> AsyncGenerator[str, None]:
        """`tail -F` over the connection from byte `offset` (else the start, or the end); after a reconnect it
        resumes at the next unseen line (`seen` lines after byte `start`)."""
        start = max(0, int(offset or 0))
        seen = 0
        if offset is None and not from_start:
            count = await self.run(["sh", "-c", 'wc -l < "$1" 2>/dev/null || echo 0', "sh", path])
            seen = int(count.stdout.strip() or 0) if count.stdout.strip().isdigit() else 0
        while True:
            try:
                if seen:  # where the next unseen line starts: counted on the host, nothing crosses but a number
                    skip = await self.run(["sh", "-c", 'tail -c "+$1" -- "$2" | head -n "$3" | wc -c', "sh",
                                           str(start + 1), path, str(seen)], timeout=120.0)
                    if skip.stdout.strip().isdigit():
                        start += int(skip.stdout.strip())
                    seen = 0
                argv = ["tail", "-F", "-c", f"+{start + 1}", path]
                async with contextlib.aclosing(self.stream_lines(argv)) as lines:
                    async for line in lines:
                        if line.startswith("\x00stderr:"):
                            if "truncated" in line or "replaced" in line or "has appeared" in line:
                                start, seen = 0, 0
                            continue
                        if line.startswith("\x00exit:"):
                            break
                        seen += 1
                        yield line
                await asyncio.sleep(1.0)
            except HostError:
                await self.wait_connected()

    # ---- HTTP ------------------------------------------------------------------------------------
    async def http_base(self, port: int) -> str:
        return await self.forward_to("127.0.0.1", port)

    async def forward_to(self, destination: str, port: int) -> str:
        """The base URL of a local port forwarded over this connection to DESTINATION:PORT as this host reaches it
        (127.0.0.1: this host itself; a node's name: a Slurm node behind this login node)."""
        conn = await self._connection()
        key = (destination, port)
        if key not in self._listeners_fw:
            wanted = self._forwards.get(key, 0)
            try:
                listener = await conn.forward_local_port("127.0.0.1", wanted, destination, port)
            except (asyncssh.Error, OSError) as exc:
                raise HostError(f"{self.name}: cannot forward a local port to {destination}:{port} ({exc})") from None
            self._listeners_fw[key] = listener
            self._forwards[key] = listener.get_port()
        return f"http://127.0.0.1:{self._forwards[key]}"

    async def _restore_forwards(self, conn: asyncssh.SSHClientConnection) -> None:
        for (destination, remote), local in list(self._forwards.items()):
            with contextlib.suppress(asyncssh.Error, OSError):
                self._listeners_fw[(destination, remote)] = await conn.forward_local_port(
                    "127.0.0.1", local, destination, remote)


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


__all__ = ["HostKeyChanged", "HostKeyUnknown", "LoginRefused", "SshHost", "TrustRequest", "add_known_host"]
