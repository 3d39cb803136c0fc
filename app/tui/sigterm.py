"""SIGTERM ends a dashboard the way `q` does, so the driver lock it holds is given back (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Any

from textual.app import App


def exit_on_sigterm(app: App[Any]) -> Callable[[], None]:
    """While `app` runs, SIGTERM calls `app.exit()` (its on_unmount then stops the Session, which releases the
    driver lock); returns the function that puts SIGTERM back as it was. Without a main-thread event loop (an
    app run elsewhere) nothing is installed."""
    try:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, app.exit)
    except (RuntimeError, NotImplementedError, ValueError):
        return lambda: None

    def forget() -> None:
        with contextlib.suppress(RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGTERM)

    return forget
