"""The one command slot of a dashboard's Session: the command in progress, its progress line, its cancel.

Every command a person starts from a dashboard (launch, relaunch, kill, confirm free, a benchmark, an A/B, the
advisor's A/B; later the tuner and the warm relaunch) runs here, one at a time. A second command is refused with
what runs now (`refusal`); a kill is the one command that does not wait: it cancels the command in progress first
and then runs (`start(..., cancels=True)`). The slot names commands, never keys: the UI maps them to the keys the
person has (docs/architecture.md#the-command-slot).

Watchers hear every change of the slot (a command started, a progress line, the command ended) as a frozen
`CommandView` or None; one watcher's failure is kept from the others and from the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from app.core.data import EventLevel
from app.core.errors import Reason, TunedashError
from app.core.server.preflight import LaunchRefused

log = logging.getLogger(__name__)

KILL = "kill"
KILLS = frozenset({KILL, "kill all"})
"""The commands that cancel the one in progress instead of being refused: a kill, and a kill all (the weight cache
daemon too)."""


@dataclass(frozen=True)
class CommandView:
    """The command in progress, frozen: its name ("relaunch", "A/B"), its latest progress line, when it began."""

    name: str
    progress: str = ""
    started: float = 0.0  # time.monotonic()

    def describe(self) -> str:
        """"the A/B (arm A launch 1/2: relaunch with baseline)", for a refusal."""
        return f"the {self.name}" + (f" ({self.progress})" if self.progress else "")


class CommandRefused(TunedashError):
    """A command was refused before it began: another one runs, or the hook before a command said no."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Reason.ALREADY_RUNNING)


Note = Callable[[str, EventLevel], None]  # (text, level): a line in the event log
BeforeCommand = Callable[[str], Awaitable[None]]  # raises CommandRefused to stop the command before it acts
Watcher = Callable[[CommandView | None], None]


class CommandSlot:
    """One command in progress at a time, with its name, progress and cancel."""

    def __init__(self, note: Note) -> None:
        self._note = note
        self.current: CommandView | None = None
        self._task: asyncio.Task[None] | None = None
        self._watchers: list[Watcher] = []
        self._settle_s = 0.0  # the running command's wait on close (start's settle_s)

    # ---- watchers ------------------------------------------------------------------------------
    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Hear every change of the slot from now on; returns the function that stops it."""
        self._watchers.append(watcher)

        def unwatch() -> None:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

        return unwatch

    def _changed(self) -> None:
        for watcher in list(self._watchers):
            try:
                watcher(self.current)
            except Exception:  # one watcher's failure neither stops the others nor the command
                log.exception("a command slot watcher failed")

    # ---- the command ---------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def refusal(self, name: str) -> str | None:
        """Why `name` may not start now, naming what runs: "relaunch refused: the A/B runs (arm A launch 1/2 ...)"."""
        if not self.running or self.current is None:
            return None
        return f"{name} refused: {self.current.describe()} is in progress"

    def progress(self, text: str) -> None:
        """The command's newest progress line (the header and a refusal name it)."""
        if self.current is not None and text != self.current.progress:
            self.current = replace(self.current, progress=text)
            self._changed()

    def start(self, name: str, factory: Callable[[], Coroutine[Any, Any, Any]], *,
              before: BeforeCommand | None = None, settle_s: float = 0.0) -> asyncio.Task[None] | None:
        """Run `factory()` as the command `name`; None (and nothing runs) while another command runs, except a
        kill, which cancels that one first. `before` runs first and may refuse (CommandRefused: said, not run).
        `settle_s`: when the session stops (`close`), how long to wait for the cancelled command's own clean-up
        (a tune on slots kills its other slots' servers); 0: nothing waits for it."""
        previous = self._task if self.running else None
        if previous is not None and name not in KILLS:
            return None
        cancelled = self.current
        self._settle_s = settle_s

        async def runner() -> None:
            if previous is not None and cancelled is not None:
                self._note(f"{name}: cancelling {cancelled.describe()} in progress", "warning")
                previous.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):  # its own runner said how it ended
                    await previous
            self.current = CommandView(name, started=time.monotonic())
            self._changed()
            try:
                if before is not None:
                    await before(name)
                await factory()
            except (LaunchRefused, CommandRefused) as refused:  # refusals say what happened in their own words
                self._note(str(refused), "error")
            except Exception as exc:  # shown to the user, never swallowed silently
                self._note(f"{name} failed: {exc}", "error")
            finally:
                if self._task is asyncio.current_task():
                    self.current = None
                    self._changed()

        self._task = asyncio.create_task(runner(), name=f"command {name}")
        return self._task

    async def cancel(self) -> bool:
        """Cancel the command in progress and wait for it to end; False when none ran."""
        task = self._task if self.running else None
        if task is None:
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # its own runner said how it ended
            await task
        return True

    def cancel_soon(self) -> bool:
        """Cancel the command in progress without waiting (a key's handler); False when none ran."""
        if not self.running or self._task is None:
            return False
        self._task.cancel()
        return True

    def stop(self) -> None:
        """The session stops: cancel the command in progress (nothing waits for it)."""
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        """The session stops: cancel the command in progress and wait up to its `settle_s` for its clean-up to end
        (a command started without one is not waited for, as `stop`)."""
        task = self._task if self.running else None
        self.stop()
        if task is not None and self._settle_s > 0:
            done, _ = await asyncio.wait({task}, timeout=self._settle_s)
            if not done:
                log.warning("the %s still cleans up %.0f s after its cancel; left behind",
                            self.current.name if self.current else "command", self._settle_s)
