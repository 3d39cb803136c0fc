"""The detached launch both hosts share: the `sh -c` that starts a job in its own session, the pid it prints,
and the short wait until that pid leads its own process group."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from app.core.hosts.base import CommandResult, HostError, SpawnedProcess
from app.core.hosts.procfs import ProcessInfo

# Opens the log for appending (created 0600 under umask 077, the job's own umask left as it was; a symbolic link
# there is refused, never followed: 96), before any `cd`, so a relative log path is the login folder's.
OPEN_LOG = ('log=$1; shift; if [ -L "$log" ]; then echo "$log is a symbolic link; tunedash follows no link in its '
            'state folder: remove it" >&2; exit 96; fi; m=$(umask); umask 077; exec 3>>"$log"; umask "$m"; ')
# Starts argv in a new session, detached from us, with stdin from /dev/null and output appended to
# the log. argv travels as positional parameters, so no value is ever interpreted by the shell.
# The backgrounded `setsid` is not a group leader, so it does not fork: `$!` is the job's pid,
# process group id and session id at once.
START = 'setsid nohup "$@" >&3 2>&3 3>&- </dev/null & echo $!'
DETACH_SCRIPT = OPEN_LOG + START


def detached_argv(argv: Sequence[str], log_path: str, env: Mapping[str, str] | None, cwd: str | None) -> list[str]:
    """The argv of a `sh -c` that launches argv detached (shared by local and SSH hosts)."""
    inner: list[str] = []
    if env:
        inner += ["env", *(f"{key}={value}" for key, value in env.items())]
    inner += list(argv)
    script = DETACH_SCRIPT if cwd is None else OPEN_LOG + 'cd "$0" || exit 97; ' + START
    head = ["sh", "-c", script] + ([cwd] if cwd is not None else ["sh"])
    # With cwd, $0 is the folder and $1 the log; without, $0 is a placeholder.
    return [*head, log_path, *inner]


def detached_pid(host_name: str, argv: Sequence[str], result: CommandResult) -> int:
    """The job's pid, as the detach script printed it; HostError naming the host when the launch failed."""
    if result.returncode != 0 or not result.stdout.strip().isdigit():
        raise HostError(
            f"{host_name}: could not start `{argv[0]}` detached: {result.stderr.strip() or result.stdout}"
        )
    return int(result.stdout.strip())


async def as_group_leader(
    pid: int, read_stat: Callable[[int], Awaitable[ProcessInfo | None]], *, reads: int, pause_s: float
) -> SpawnedProcess:
    """The spawned job, once it leads its own group: `$!` can be printed before the child's setsid() ran.

    Reads the pid's stat up to `reads` times, `pause_s` apart, until the process is gone or its group is its
    own, so that what is returned is true at once (group_alive, signal_group on the pgid).
    """
    info = await read_stat(pid)
    for _ in range(reads - 1):
        if info is None or info.pgid == pid:
            break
        await asyncio.sleep(pause_s)
        info = await read_stat(pid)
    return SpawnedProcess(pid=pid, pgid=pid, start_time=info.start_time if info else "")
