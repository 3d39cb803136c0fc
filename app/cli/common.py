"""What every command shares: exit codes (the one place errors become codes), profile loading, printing, hosts.

Exit codes, the same condition the same code in every command (README "Exit codes"):
0 done; 1 the GPUs could not be read; 2 bad input (profile, flag, file, arm, run id) or a server state that
forbids the command (already running, nothing running); 3 the GPUs stay held; 4 the server failed to start
(crashed, not ready in time, port taken) or a measurement finished no request; 130 interrupted (Ctrl-C);
141 the reader of stdout went away; 143 stopped by SIGTERM, 129 by SIGHUP (after giving back the driver lock).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

from app.connect import host_for
from app.core.data import ServerState
from app.core.errors import Reason, TunedashError
from app.core.hosts.base import Host, HostError
from app.core.profiles.loading import apply_overrides, resolve_profile
from app.core.profiles.types import Profile, ProfileError
from app.core.server.driver import DrivenElsewhere, DriverLock, keep_alive
from app.core.server.events import ActionLogged, LifecycleEvent, StateChanged
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.smi import telemetry_for

EXIT_OK = 0
EXIT_UNREADABLE = 1
EXIT_BAD_INPUT = 2
EXIT_GPUS_HELD = 3
EXIT_START_FAILED = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

EXIT_FOR_REASON: dict[Reason, int] = {
    Reason.BAD_INPUT: EXIT_BAD_INPUT,
    Reason.ALREADY_RUNNING: EXIT_BAD_INPUT,
    Reason.NOT_RUNNING: EXIT_BAD_INPUT,
    Reason.GPUS_UNREADABLE: EXIT_UNREADABLE,
    Reason.GPUS_HELD: EXIT_GPUS_HELD,
    Reason.PORT_IN_USE: EXIT_START_FAILED,
    Reason.START_FAILED: EXIT_START_FAILED,
    Reason.NO_TOKENS: EXIT_START_FAILED,
    Reason.DRIVEN_ELSEWHERE: EXIT_BAD_INPUT,
}
EXIT_FOR_STATE: dict[ServerState, int] = {ServerState.READY: EXIT_OK, ServerState.FREE: EXIT_OK,
                                          ServerState.STOPPED: EXIT_OK, ServerState.STUCK: EXIT_GPUS_HELD}


class CliError(TunedashError):
    """A user-facing error raised by a command itself (bad option values, unknown run id, ...)."""

    def __init__(self, message: str, reason: Reason = Reason.BAD_INPUT) -> None:
        super().__init__(message, reason)


def exit_code(exc: BaseException) -> int:
    """The exit code of an error that ends a command."""
    if isinstance(exc, TunedashError):
        return EXIT_FOR_REASON[exc.reason]
    if isinstance(exc, (ProfileError, HostError)):
        return EXIT_BAD_INPUT
    raise exc


def state_exit_code(state: ServerState) -> int:
    """The exit code of a command that ends in a server state (a start that ended elsewhere than READY: 4)."""
    return EXIT_FOR_STATE.get(state, EXIT_START_FAILED)


LIVE_LINES: list[Callable[[], None]] = []  # clear a terminal's rewritten progress line before a line is printed


def say(text: str) -> None:
    """One line on stdout, flushed (progress lines reach a pipe as they happen)."""
    for clear in LIVE_LINES:
        clear()
    print(text, flush=True)


def load_profile(args: argparse.Namespace) -> Profile:
    """The profile a command names, with its --set / --unset overrides (where the command has them)."""
    profile = resolve_profile(args.profile)
    sets = getattr(args, "set", None) or []
    unsets = getattr(args, "unset", None) or []
    if sets or unsets:
        profile = apply_overrides(profile, sets, unsets)
    return profile


_opened: list[Host] = []


def open_host(profile: Profile) -> Host:
    """The profile's host; every host a command opens is closed when the command ends (run_command)."""
    host = host_for(profile)
    _opened.append(host)
    return host


_held: list[tuple[DriverLock, asyncio.Task[None]]] = []


class Terminated(Exception):
    """SIGTERM or SIGHUP stopped a command; its driver locks were given back and its hosts closed (exit 128 + the
    signal's number: 143, 129)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.exit_code = 128 + signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # kill's default; the terminal or SSH connection going away


async def run_command(command: Coroutine[Any, Any, int]) -> int:
    """Run one async command, then give back the driver locks it took and close the hosts it opened (an SSH
    connection ends before the exit). SIGTERM cancels the command the way Ctrl-C does and ends in Terminated,
    after the same clean-up: a `kill`, `launch`, `relaunch` or `ab` stopped by a signal gives its lock back. SIGHUP
    (the terminal or the SSH session that ran it went away) does the same."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stopped_by: int | None = None

    def on_signal(signum: int) -> None:
        nonlocal stopped_by
        if stopped_by is None and task is not None:  # a second signal while cleaning up changes nothing
            stopped_by = signum
            task.cancel()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await command
    except asyncio.CancelledError:
        if stopped_by is None or task is None:
            raise
        task.uncancel()  # the clean-up below awaits; this task is no longer being cancelled
        raise Terminated(stopped_by) from None
    finally:
        while _held:
            lock, beating = _held.pop()
            beating.cancel()
            # The command's outcome is already said; release() swallows host errors itself and a claim it could
            # not remove expires after driver.STALE_S, so nothing here can lose what a user would want to see.
            with contextlib.suppress(Exception):
                await lock.release()
        while _opened:
            with contextlib.suppress(Exception):  # closing on the way out: every command on it has returned
                await _opened.pop().close()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


async def drive(lifecycle: ServerLifecycle, args: argparse.Namespace, command: str) -> None:
    """Take the profile's driver lock for this command (app.core.server.driver): refused with DrivenElsewhere
    while another live session drives, unless --take-over; held with a heartbeat until the command ends, and
    checked right before every signal and launch."""
    lock = DriverLock(lifecycle.host, lifecycle.profile, "cli")
    verdict = await lock.acquire(take_over=bool(getattr(args, "take_over", False)), command=command)
    if verdict.readonly:
        raise DrivenElsewhere(verdict.message.replace("read-only: ", f"{command} refused: ", 1))
    if verdict.level == "warning" and not getattr(args, "json", False):
        say(verdict.message)

    _held.append((lock, asyncio.create_task(keep_alive(lock))))
    lifecycle.before_act = lock.check


def narrator(json_mode: bool) -> Callable[[LifecycleEvent], None]:
    """A lifecycle listener that prints states and actions with the seconds since the command began."""
    started = time.monotonic()

    def listener(event: LifecycleEvent) -> None:
        if json_mode:
            return
        stamp = f"{time.monotonic() - started:6.1f}s"
        if isinstance(event, StateChanged):
            say(f"{stamp}  {event.state.value}")
        elif isinstance(event, ActionLogged):
            say(f"{stamp}  {event.text}")

    return listener


def lifecycle_for(profile: Profile, host: Host, args: argparse.Namespace) -> ServerLifecycle:
    """The lifecycle a command drives, with its --grace and --timeout (0 means 0, not the default)."""
    grace = getattr(args, "grace", None)
    timeout = getattr(args, "timeout", None)
    lifecycle = ServerLifecycle(
        host,
        profile,
        telemetry_for(host, "smi", tuple(profile.gpus)),
        grace_s=15.0 if grace is None else grace,
        free_timeout_s=60.0 if timeout is None else timeout,
    )
    lifecycle.subscribe(narrator(getattr(args, "json", False)))
    from app.core.adopt.takeover import watch_adopted  # kill/relaunch on a server started by hand (docs/adopt.md)

    watch_adopted(lifecycle, lambda text, level: None if getattr(args, "json", False) else say(text),
                  confirmed=bool(getattr(args, "adopted_ok", False)))
    return lifecycle


def with_adopted_ok(p: argparse.ArgumentParser) -> None:
    """--adopted-ok on a command that kills: it may stop the profile's server although tunedash did not launch it
    (a server started by hand that `tunedash adopt` wrote the profile of; docs/adopt.md)."""
    p.add_argument("--adopted-ok", action="store_true",
                   help="the profile's server was started by hand (tunedash adopt): kill it all the same, once its "
                        "pid, start time, command line and user are proven unchanged")


def with_take_over(p: argparse.ArgumentParser,
                   help: str = "act although another session drives this server (it turns read-only; both logs "
                               "say so)") -> None:
    """--take-over on a command that signals or launches (its driver lock: `drive`), or on `ui`."""
    p.add_argument("--take-over", action="store_true", help=help)
