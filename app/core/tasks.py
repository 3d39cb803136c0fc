"""Who owns the core's background tasks and listeners: `TaskOwner` cancels its tasks on close, `Listeners`
calls every listener even when one raises (docs/architecture.md#tasks-and-listeners)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

E = TypeVar("E")
T = TypeVar("T")

log = logging.getLogger("tunedash")

RECANCEL_S = 0.5  # close() cancels a task again when it has not ended this long after its cancel
CLOSE_WAIT_S = 10.0  # close() gives up on a task that still runs after this long (and logs its name)

Unsubscribe = Callable[[], None]
"""What every subscribe returns: call it (once or more, it is idempotent) to stop receiving events."""


def _describe(thing: object) -> str:
    return getattr(thing, "__qualname__", None) or getattr(thing, "__name__", None) or repr(thing)


class Listeners(Generic[E]):
    """The listeners of one publisher. `subscribe` returns the unsubscribe; `emit` calls each listener in turn,
    and one that raises is logged (the `tunedash` logger, and `on_failure` with a sentence for the event log)
    while the others still get the event."""

    def __init__(self, owner: str, on_failure: Callable[[str], None] | None = None) -> None:
        self.owner = owner
        self.on_failure = on_failure
        self._listeners: list[Callable[[E], None]] = []
        self._reporting = False

    def __len__(self) -> int:
        return len(self._listeners)

    def subscribe(self, listener: Callable[[E], None]) -> Unsubscribe:
        """Receive every event from now on; call the returned function to stop."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def emit(self, event: E) -> None:
        """Give `event` to every listener; a failing one does not stop the rest."""
        for listener in list(self._listeners):  # a listener may unsubscribe while it runs
            try:
                listener(event)
            except Exception as exc:
                self._failed(listener, event, exc)

    def _failed(self, listener: Callable[[E], None], event: E, exc: Exception) -> None:
        text = (f"{self.owner}: a listener ({_describe(listener)}) failed on {type(event).__name__}: "
                f"{type(exc).__name__}: {exc}")
        log.error(text, exc_info=exc)
        if self.on_failure is None or self._reporting:  # a report that fails again is only logged
            return
        self._reporting = True
        try:
            self.on_failure(text)
        except Exception as again:
            log.error("%s: reporting a listener's failure failed: %s", self.owner, again, exc_info=again)
        finally:
            self._reporting = False


class TaskOwner:
    """The named owner of one object's background tasks: `spawn` starts one (and forgets it when done); a task
    that fails is logged (and given to `on_failure`); `close` cancels every task still running and waits for
    them. Used where tasks outlive any one call (a lifecycle, a poller, a host's supervisor); a call whose tasks
    end with it uses asyncio.TaskGroup instead."""

    def __init__(self, name: str, on_failure: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.on_failure = on_failure
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        """The tasks running now."""
        return frozenset(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run `coro` as a task of this owner. After close, the coroutine is closed unrun and the task returned
        is already cancelled."""
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}: {name or _describe(coro)}")
        if self.closed:
            task.cancel()
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        text = f"{task.get_name()} failed: {type(exc).__name__}: {exc}"
        log.error(text, exc_info=exc)
        if self.on_failure is not None:
            try:
                self.on_failure(text)
            except Exception as again:
                log.error("%s: reporting a task's failure failed: %s", self.name, again, exc_info=again)

    async def close(self) -> None:
        """Cancel every task still running and wait until each has ended (their errors are logged, not raised)."""
        self.closed = True
        await self.cancel_all()

    def cancel(self) -> None:
        """Cancel every task now, without waiting (for a `finally` that cannot await, such as an async
        generator's); the owner is closed."""
        self.closed = True
        for task in self._tasks:
            task.cancel()

    async def cancel_all(self) -> None:
        """Cancel the running tasks and wait for them; the owner stays open for new ones. A task that swallowed its
        cancellation (Python 3.11's wait_for can, when its inner call ends at the same moment) is cancelled again
        every RECANCEL_S; one still running after CLOSE_WAIT_S is logged by name and left behind."""
        current = asyncio.current_task()
        pending = {task for task in self._tasks if task is not current}
        deadline = asyncio.get_running_loop().time() + CLOSE_WAIT_S
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
            if pending and asyncio.get_running_loop().time() >= deadline:
                log.error("%s: tasks still running %.0f s after their cancel: %s", self.name, CLOSE_WAIT_S,
                          ", ".join(sorted(task.get_name() for task in pending)))
                return
