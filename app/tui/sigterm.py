"""SIGTERM and SIGHUP end a dashboard the way `q` does, so its driver lock is given back (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Any

from textual.app import App

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def exit_on_sigterm(app: App[Any]) -> Callable[[], None]:
    """While `app` runs, SIGTERM (kill's default) and SIGHUP (the tmux pane or SSH session closed) call
    `app.exit()` (its on_unmount then stops the Session, which releases the driver lock); returns the function
    that puts them back as they were. Without a main-thread event loop (an app run elsewhere) nothing is
    installed."""
    try:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, app.exit)
    except (RuntimeError, NotImplementedError, ValueError):
        return lambda: None

    def forget() -> None:
        for signum in STOP_SIGNALS:
            with contextlib.suppress(RuntimeError, ValueError):  # not installed, or the loop already closed
                loop.remove_signal_handler(signum)

    return forget
