"""SIGTERM and SIGHUP end a dashboard the way `q` does, so its driver lock is given back (docs/architecture.md).

Once one arrives, a watchdog makes sure the process does end: when the terminal is gone (a tmux pane killed, an SSH
session dropped), Textual's own shutdown can hang for ever after the dashboard has stopped. The kernel sends SIGCONT
with the SIGHUP, Textual's driver answers it by starting a second output thread, that thread dies writing to the
dead terminal, and the driver's close then blocks putting its stop mark into that thread's full queue (seen in
`tests/faults/test_driver_lock.py`'s real-tmux test, which left such a dashboard behind, and 1 run in 3 by hand:
the Session had stopped and given its lock back; the process stayed, idle, for good). So if the process still runs
`grace_s` after the signal, it exits with 128 + the signal's number, as a shell reports a process that signal ended.
The grace is longer than any clean-up the Session waits for (a tune on slots freeing its other slots, up to 60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from textual.app import App

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
GRACE_S = 90.0
"""How long a signalled dashboard may take to end before the watchdog ends it (TUNEDASH_EXIT_GRACE_S overrides)."""


def exit_grace_s() -> float:
    """GRACE_S, or the positive number of seconds in TUNEDASH_EXIT_GRACE_S (a test's shorter wait)."""
    try:
        value = float(os.environ.get("TUNEDASH_EXIT_GRACE_S", ""))
    except ValueError:
        return GRACE_S
    return value if 0 < value < GRACE_S else GRACE_S


def end_after(grace_s: float, code: int) -> threading.Thread:
    """A daemon thread that ends the process with `code` unless it has ended by itself within `grace_s`."""
    def watch() -> None:
        threading.Event().wait(grace_s)
        os._exit(code)  # the process is hung past its own shutdown: nothing is left to flush or give back

    thread = threading.Thread(target=watch, name="tunedash-exit-watchdog", daemon=True)
    thread.start()
    return thread


def exit_on_sigterm(app: App[Any]) -> Callable[[], None]:
    """While `app` runs, SIGTERM (kill's default) and SIGHUP (the tmux pane or SSH session closed) call
    `app.exit()` (its on_unmount then stops the Session, which releases the driver lock) and arm the watchdog
    (module docstring); returns the function that puts them back as they were. Without a main-thread event loop
    (an app run elsewhere) nothing is installed."""
    armed: list[threading.Thread] = []

    def stop(signum: int) -> None:
        if not armed:
            armed.append(end_after(exit_grace_s(), 128 + signum))
        app.exit()

    try:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, stop, int(signum))
    except (RuntimeError, NotImplementedError, ValueError):
        return lambda: None

    def forget() -> None:
        for signum in STOP_SIGNALS:
            with contextlib.suppress(RuntimeError, ValueError):  # not installed, or the loop already closed
                loop.remove_signal_handler(signum)

    return forget
