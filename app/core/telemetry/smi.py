"""GPU telemetry sources (nvidia-smi over any Host, NVML locally), the factory, and the JSON shape.

Public API (both sources have the same three methods, see ``Telemetry``):

- ``SmiTelemetry(host, indices=None, *, executable="nvidia-smi", env=None, ...)``
    ``await sample() -> GpuSnapshot``; ``stream(period_ms=1000) -> AsyncIterator[GpuSnapshot]``;
    ``await close()``.
- ``NvmlTelemetry`` (app.core.telemetry.nvml, re-exported here): the same methods, local host only.
- ``telemetry_for(host, source="smi", indices=None) -> SmiTelemetry | NvmlTelemetry``: "nvml" needs a
  local host (``getattr(host, "is_local", False)``, which LocalHost sets); anything else is a ValueError.
- ``snapshot_to_json(snapshot) -> dict``: the shape of ``tunedash gpus --json``.

Failures never raise into the consumer: they become a GpuSnapshot with ``error`` set (and, when nvidia-smi
printed rows next to its complaint, the rows too).

How SmiTelemetry.stream works:

- It starts with one ``sample()`` (immediate first value; it also learns the GPU indices and uuids).
- Memory, utilization, temperature and power come from one long-lived
  ``nvidia-smi --query-gpu=... -lms PERIOD`` per host over ``host.stream_lines``. nvidia-smi prints one row
  per GPU per tick in index order with no separator, so a tick ends at the row of the highest known index,
  or earlier when an index goes backwards (then the partial tick is emitted with the GPUs it has). A row
  whose index reads "[GPU is lost]" takes the next expected index and its uuid from the first sample.
  Lines that are not rows (Xid events, infoROM warnings) are counted in ``skipped_lines`` of the tick.
- When the loop ends (EOF, non-zero exit, host error) an error snapshot is yielded, then the loop is
  restarted after a capped exponential backoff (0.5 s doubling to 8 s; reset after a healthy tick).

The process-list rule (why compute-apps is not a ``-lms`` loop): in loop mode ``--query-compute-apps``
prints nothing at all for a tick with no processes, so silence cannot be told apart from "not printed yet"
without guessing from timing. A one-shot query can: exit code 0 with empty stdout *is* "no processes".
So process lists come from a one-shot ``--query-compute-apps`` run at most every ``apps_interval_s``
(default 1 s; docs/gpus.md#loop-mode-and-the-process-list), never two at once. Each tick
waits up to min(period, 1 s) for the query in flight, then attaches the newest *completed* list, with
``GpuSample.processes_taken_at`` = the moment that query started. Consequences a consumer can rely on:

- ``processes == ()`` only when nvidia-smi really printed no row for that GPU, exit 0, in a query started
  at ``processes_taken_at``; a list can lag the memory reading by up to one query, so after a kill a
  stale list still shows the dead process (conservative). Confirm-free should accept only lists whose
  ``processes_taken_at`` is after its kill.
- ``processes is None`` (with ``unavailable["processes"]``) when no list exists yet, the last query failed,
  or the newest list is older than ``apps_max_age_s`` (default max(5 s, 3 x period)).
The cost is one nvidia-smi spawn per `apps_interval_s` (figures: docs/decisions.md#telemetry-stream) plus,
over SSH, one exec on the already open connection; the memory stream itself never respawns. A confirm-free
sampler may set ``apps_interval_s`` to its period: queries never overlap, so the list then refreshes as fast as it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.data import GpuProcess, GpuSample, GpuSnapshot, TelemetryError
from app.core.hosts.base import CommandResult, Host, HostError
from app.core.tasks import TaskOwner
from app.core.telemetry.nvml import NvmlTelemetry
from app.core.telemetry.smi_parse import (
    GPU_FIELDS,
    GPU_LOOP_FIELDS,
    SmiGpuRow,
    apps_query_argv,
    classify_smi_failure,
    gpu_query_argv,
    is_ignorable_line,
    parse_compute_apps_csv,
    parse_gpu_csv,
    parse_gpu_line,
)

__all__ = ["NvmlTelemetry", "SmiTelemetry", "Telemetry", "snapshot_to_json", "telemetry_for"]

_EXIT = "\x00exit:"
_STDERR = "\x00stderr:"
_APPS_ARRIVED = "\x00apps"  # a new process list from the apps loop (never a line a host prints: NUL)
APPS_LOOP_END = "tunedash-apps-end"
# One kept-open exec that runs the one-shot process-list query back to back and ends each run with a marker line
# and its exit status, so an empty list is still told apart from "not printed yet" (a failing query waits 1 s).
APPS_LOOP_STAGGER_S = 0.015  # several loops start this far apart, so their runs do not end together
APPS_LOOP_SCRIPT = f'while :; do "$@"; rc=$?; echo "{APPS_LOOP_END} $rc"; [ "$rc" -eq 0 ] || sleep 1; done'

log = logging.getLogger("tunedash")


class Telemetry(Protocol):
    """What the Session and the CLI need from a telemetry source."""

    async def sample(self) -> GpuSnapshot: ...

    def stream(self, period_ms: int = 1000) -> AsyncGenerator[GpuSnapshot, None]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class _AppsReading:
    """The outcome of one compute-apps query."""

    started_at: float
    processes: tuple[GpuProcess, ...] | None  # None: the query failed
    reason: str = ""


class SmiTelemetry:
    """GPU readings from nvidia-smi's CSV output on any Host (see the module docstring for the rules)."""

    source = "smi"

    def __init__(
        self,
        host: Host,
        indices: Sequence[int] | None = None,
        *,
        executable: str = "nvidia-smi",
        env: Mapping[str, str] | None = None,
        run_timeout_s: float = 20.0,
        apps_interval_s: float = 1.0,
        apps_max_age_s: float | None = None,
        backoff_s: tuple[float, float] = (0.5, 8.0),
        clock: Callable[[], float] = time.monotonic,
        apps_loops: int = 0,
    ) -> None:
        self.host = host
        self.indices = sorted(set(indices)) if indices else None
        self._executable = executable
        self._env = dict(env) if env else None
        self._run_timeout_s = run_timeout_s
        self._apps_interval_s = apps_interval_s
        self._apps_max_age_s = apps_max_age_s
        self._backoff_s = backoff_s
        self._clock = clock
        self._apps: _AppsReading | None = None
        self._apps_task: asyncio.Task[_AppsReading] | None = None
        self._tasks = TaskOwner(f"nvidia-smi {host.name}")
        self._known_uuids: dict[int, str] = {}
        self._apps_loops = apps_loops
        self._queue: asyncio.Queue[str | BaseException | None] | None = None
        self._apps_loop_tasks: list[asyncio.Task[None]] = []
        self._last_rows: list[tuple[int, SmiGpuRow]] = []

    # ---- one-shot --------------------------------------------------------------------------------

    async def sample(self) -> GpuSnapshot:
        """Both queries once, concurrently; processes joined to GPUs by uuid."""
        started = self._clock()
        gpu_argv = gpu_query_argv(GPU_FIELDS, self.indices, executable=self._executable)
        gpu_result, apps = await asyncio.gather(self._run(gpu_argv), self._query_apps(started))
        self._apps = apps
        if isinstance(gpu_result, TelemetryError):
            return GpuSnapshot(gpus=(), taken_at=self._clock(), error=gpu_result)
        rows, skipped = parse_gpu_csv(gpu_result.stdout, GPU_FIELDS)
        error = classify_smi_failure(gpu_result.returncode, gpu_result.stdout, gpu_result.stderr)
        if error is None and not rows and skipped:
            first = next(line for line in gpu_result.stdout.splitlines() if line.strip())
            error = TelemetryError(
                "garbage",
                f"{self._executable} on {self.host.name} printed {skipped} line(s) that are not its CSV output, "
                f"starting with: {first.strip()[:120]!r}",
                gpu_result.returncode,
                f"check which `{self._executable}` is first on PATH on {self.host.name} (`command -v "
                f"{self._executable}`): tunedash needs NVIDIA's tool",
            )
        taken_at = self._clock()
        gpus = self._samples(_indexed(rows, self.indices), taken_at, max_age_s=None)
        for gpu in gpus:
            if gpu.uuid:
                self._known_uuids[gpu.index] = gpu.uuid
        return GpuSnapshot(gpus=gpus, taken_at=taken_at, error=error, skipped_lines=skipped)

    async def _run(self, argv: list[str]) -> CommandResult | TelemetryError:
        try:
            return await self.host.run(argv, timeout=self._run_timeout_s, env=self._env)
        except Exception as exc:  # host errors, timeouts, lost connections: never into the consumer
            return _host_failure(self.host, exc)

    async def _query_apps(self, started: float) -> _AppsReading:
        result = await self._run(apps_query_argv(self.indices, executable=self._executable))
        if isinstance(result, TelemetryError):
            return _AppsReading(started, None, f"compute-apps query failed: {result.message}")
        error = classify_smi_failure(result.returncode, result.stdout, result.stderr)
        if error is not None and result.returncode != 0:
            return _AppsReading(started, None, f"compute-apps query failed: {error.message}")
        processes, _ = parse_compute_apps_csv(result.stdout)
        return _AppsReading(started, tuple(processes))

    def _samples(
        self, rows: list[tuple[int, SmiGpuRow]], taken_at: float, max_age_s: float | None
    ) -> tuple[GpuSample, ...]:
        apps = self._apps
        samples = []
        for index, row in rows:
            unavailable = dict(row.unavailable)
            uuid = row.uuid or self._known_uuids.get(index, "")
            if uuid:
                unavailable.pop("uuid", None)
            processes: tuple[GpuProcess, ...] | None = None
            processes_at: float | None = None
            if apps is None:
                unavailable["processes"] = "process list not read yet"
            elif apps.processes is None:
                unavailable["processes"] = apps.reason
            elif max_age_s is not None and taken_at - apps.started_at > max_age_s:
                unavailable["processes"] = f"process list is {taken_at - apps.started_at:.1f} s old"
            elif not uuid:
                unavailable["processes"] = "GPU uuid unreadable, processes cannot be matched"
            else:
                processes = tuple(p for p in apps.processes if p.gpu_uuid == uuid)
                processes_at = apps.started_at
            samples.append(
                GpuSample(
                    index=index,
                    uuid=uuid,
                    name=row.name,
                    memory_used_mib=row.memory_used_mib,
                    memory_total_mib=row.memory_total_mib,
                    utilization_pct=row.utilization_pct,
                    temperature_c=row.temperature_c,
                    power_w=row.power_w,
                    processes=processes,
                    unavailable=unavailable,
                    taken_at=taken_at,
                    source="smi",
                    processes_taken_at=processes_at,
                    memory_api="smi",
                )
            )
        return tuple(samples)

    # ---- continuous ------------------------------------------------------------------------------

    async def stream(self, period_ms: int = 1000) -> AsyncGenerator[GpuSnapshot, None]:
        """Snapshots every `period_ms` until the consumer stops iterating; failures arrive as snapshots."""
        period_ms = max(int(period_ms), 10 if self._apps_loops else 50)
        backoff = self._backoff_s[0]
        try:
            while True:
                first = await self.sample()
                yield first
                if first.error is not None and not first.gpus:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self._backoff_s[1])
                    continue
                if self._apps_loops and not self._apps_loop_tasks:
                    self._apps_loop_tasks = [  # owned by the sampler's TaskOwner; _cancel_apps ends them
                        self._tasks.spawn(self._run_apps_loop(k * APPS_LOOP_STAGGER_S), f"process-list loop {k}")
                        for k in range(self._apps_loops)
                    ]
                expected = sorted(gpu.index for gpu in first.gpus)
                async with contextlib.aclosing(self._loop(period_ms, expected)) as ticks:
                    async for snapshot in ticks:
                        if snapshot.error is None:
                            backoff = self._backoff_s[0]
                        yield snapshot
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff_s[1])
        finally:
            await self._cancel_apps()

    async def _lines(self, argv: list[str]) -> AsyncGenerator[str, None]:
        """The -lms loop's lines; with the apps loop, interleaved with _APPS_ARRIVED when a new list came."""
        if not self._apps_loops:
            async with contextlib.aclosing(self.host.stream_lines(argv, env=self._env)) as lines:
                async for line in lines:
                    yield line
            return
        queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue()
        self._queue = queue

        async def pump() -> None:
            try:
                async with contextlib.aclosing(self.host.stream_lines(argv, env=self._env)) as lines:
                    async for line in lines:
                        await queue.put(line)
            except Exception as exc:  # handed to the reader, which turns it into an error snapshot
                await queue.put(exc)
            await queue.put(None)

        # the pump lives exactly as long as this generator: cancelled and awaited in its finally below
        pumping = asyncio.create_task(pump(), name=f"nvidia-smi {self.host.name}: -lms pump")
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if self._queue is queue:
                self._queue = None
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumping

    async def _run_apps_loop(self, delay_s: float) -> None:
        """Keep APPS_LOOP_SCRIPT running on the host; each run's rows become the newest process list (unless a
        list started later came first: with several loops, their runs overlap)."""
        argv = ["sh", "-c", APPS_LOOP_SCRIPT, "sh", *apps_query_argv(self.indices, executable=self._executable)]
        await asyncio.sleep(delay_s)
        while True:
            rows: list[str] = []
            stderr: list[str] = []
            started = self._clock()
            try:
                async with contextlib.aclosing(self.host.stream_lines(argv, env=self._env)) as lines:
                    async for line in lines:
                        if line.startswith(_STDERR):
                            stderr.append(line[len(_STDERR) :])
                        elif line.startswith(APPS_LOOP_END):
                            reading = self._apps_reading(started, line, rows, stderr)
                            if self._apps is None or reading.started_at >= self._apps.started_at:
                                self._apps = reading
                                if self._queue is not None:
                                    self._queue.put_nowait(_APPS_ARRIVED)
                            rows, stderr, started = [], [], self._clock()
                        elif not line.startswith(_EXIT):
                            rows.append(line)
                reason = "the process-list loop ended"
            except Exception as exc:
                reason = f"the process-list loop failed: {_host_failure(self.host, exc).message}"
            self._apps = _AppsReading(self._clock(), None, reason)
            await asyncio.sleep(self._backoff_s[0])

    def _apps_reading(self, started: float, marker: str, rows: list[str], stderr: list[str]) -> _AppsReading:
        """One run of the apps loop: its rows when it exited 0, else why not (the tool's own words)."""
        code = _exit_code(_EXIT + marker[len(APPS_LOOP_END) :])
        text = "\n".join(rows)
        error = classify_smi_failure(code, text, "\n".join(stderr))
        if code != 0:
            message = error.message if error is not None else f"exit code {code}"
            return _AppsReading(started, None, f"compute-apps query failed: {message}")
        processes, _ = parse_compute_apps_csv(text + "\n" if text else "")
        return _AppsReading(started, tuple(processes))

    async def _loop(self, period_ms: int, expected: list[int]) -> AsyncGenerator[GpuSnapshot, None]:
        """One run of the -lms loop: ticks, then one error snapshot when it ends."""
        argv = gpu_query_argv(GPU_LOOP_FIELDS, self.indices, loop_ms=period_ms, executable=self._executable)
        pending: list[tuple[int, SmiGpuRow]] = []
        skipped = 0
        messages: deque[str] = deque(maxlen=20)
        stderr: deque[str] = deque(maxlen=20)
        returncode: int | None = None
        lines = self._lines(argv)
        try:
            async for line in lines:
                if line == _APPS_ARRIVED:
                    if not pending and self._last_rows:  # memory unchanged since the last tick, a new list
                        yield await self._tick(self._last_rows, 0, period_ms)
                    continue
                if line.startswith(_EXIT):
                    returncode = _exit_code(line)
                    break
                if line.startswith(_STDERR):
                    stderr.append(line[len(_STDERR) :])
                    continue
                if is_ignorable_line(line):
                    continue
                row = parse_gpu_line(line, GPU_LOOP_FIELDS)
                if row is None:
                    skipped += 1
                    messages.append(line)
                    continue
                previous = pending[-1][0] if pending else None
                index = row.index if row.index is not None else _next_index(previous, expected)
                if pending and previous is not None and index <= previous:
                    yield await self._tick(pending, skipped, period_ms)
                    pending, skipped = [], 0
                pending.append((index, row))
                if expected and index >= expected[-1]:
                    yield await self._tick(pending, skipped, period_ms)
                    pending, skipped = [], 0
        except Exception as exc:
            yield GpuSnapshot(gpus=(), taken_at=self._clock(), error=_host_failure(self.host, exc))
            return
        finally:
            aclose = getattr(lines, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except (HostError, OSError) as exc:  # the loop is over either way; its end was said above
                    log.warning("closing the nvidia-smi stream on %s: %s", self.host.name, exc)
        if pending:
            yield await self._tick(pending, skipped, period_ms)
            skipped = 0
        error = classify_smi_failure(returncode, "\n".join(messages), "\n".join(stderr))
        if error is None:
            error = TelemetryError(
                kind="other",
                message=f"the nvidia-smi loop on {self.host.name} ended (exit code {returncode})",
                exit_code=returncode,
                hint="It is restarted automatically; if this repeats, run nvidia-smi on the host by hand.",
            )
        yield GpuSnapshot(gpus=(), taken_at=self._clock(), error=error, skipped_lines=skipped)

    async def _tick(self, pending: list[tuple[int, SmiGpuRow]], skipped: int, period_ms: int) -> GpuSnapshot:
        period_s = period_ms / 1000
        self._last_rows = pending
        if not self._apps_loops:
            await self._refresh_apps(wait_s=min(period_s, 1.0))
        max_age = self._apps_max_age_s or max(5.0, 3 * max(period_s, self._apps_interval_s))
        taken_at = self._clock()
        return GpuSnapshot(
            gpus=self._samples(pending, taken_at, max_age), taken_at=taken_at, skipped_lines=skipped
        )

    async def _refresh_apps(self, wait_s: float) -> None:
        """Start a compute-apps query when one is due, then wait a little for the one in flight."""
        now = self._clock()
        due = self._apps is None or now - self._apps.started_at >= self._apps_interval_s
        if self._apps_task is None and due:
            self._apps_task = self._tasks.spawn(self._query_apps(now), "process list")
        task = self._apps_task
        if task is None:
            return
        await asyncio.wait({task}, timeout=wait_s)
        if task.done():
            self._apps_task = None
            if not task.cancelled():
                self._apps = task.result()

    async def close(self) -> None:
        """Stop the compute-apps query in flight (streams stop when their iterator is closed)."""
        await self._cancel_apps()

    async def _cancel_apps(self) -> None:
        task, self._apps_task = self._apps_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        loop_tasks, self._apps_loop_tasks = self._apps_loop_tasks, []
        self._queue = None
        for loop_task in loop_tasks:
            loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop_task


def _indexed(rows: list[SmiGpuRow], indices: Sequence[int] | None) -> list[tuple[int, SmiGpuRow]]:
    """Rows with their index; an unreadable index takes the next expected one (rows come in index order)."""
    out: list[tuple[int, SmiGpuRow]] = []
    expected = list(indices) if indices else []
    for row in rows:
        previous = out[-1][0] if out else None
        out.append((row.index if row.index is not None else _next_index(previous, expected), row))
    return out


def _next_index(previous: int | None, expected: Sequence[int]) -> int:
    if expected:
        later = [i for i in expected if previous is None or i > previous]
        return later[0] if later else expected[0]
    return 0 if previous is None else previous + 1


def _exit_code(line: str) -> int | None:
    try:
        return int(line[len(_EXIT) :].strip())
    except ValueError:
        return None


def _host_failure(host: Host, exc: BaseException) -> TelemetryError:
    """A host call that failed, in the host's own words (a HostError already names the host), and what
    happens next: an SSH host that lost its connection reconnects by itself; one that failed for good (a host
    key refused or changed, login refused) does not, and the hint says so."""
    if isinstance(exc, HostError):
        text = str(exc)
        message = text if text.startswith(f"{host.name}:") else f"{host.name}: {text}"
    else:
        message = f"{host.name}: {type(exc).__name__}: {exc}"
    state = getattr(host, "state", None)
    if state == "failed":
        hint = "tunedash does not retry this: do what the message says, then start tunedash again."
    elif state in ("lost", "reconnecting"):
        hint = "The values below are from before the loss; tunedash reconnects by itself."
    else:
        hint = f"Check that {host.name} is reachable; tunedash retries automatically."
    return TelemetryError(kind="connection", message=message, hint=hint)


def telemetry_for(
    host: Host, source: str = "smi", indices: Sequence[int] | None = None
) -> SmiTelemetry | NvmlTelemetry:
    """The telemetry source for a host: "smi" (any host) or "nvml" (the local host only)."""
    if source == "smi":
        return SmiTelemetry(host, indices)
    if source == "nvml":
        if not getattr(host, "is_local", False):
            raise ValueError(
                f"--source nvml reads this machine's GPUs through libnvidia-ml, but host {host.name!r} is "
                "remote: use --source smi for it (nvidia-smi runs on the host)."
            )
        return NvmlTelemetry(indices)
    raise ValueError(f"unknown telemetry source {source!r}: use 'nvml' (local host) or 'smi' (any host)")


_JSON_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory_used_mib",
    "memory_total_mib",
    "utilization_pct",
    "temperature_c",
    "power_w",
)


def snapshot_to_json(snapshot: GpuSnapshot) -> dict[str, Any]:
    """The `tunedash gpus --json` document: per GPU the readings (null when unreadable, with the reason
    in "unavailable"), processes (pid, name, used_mib; null when not read), and the error if any."""
    gpus: list[dict[str, Any]] = []
    for gpu in snapshot.gpus:
        entry: dict[str, Any] = {name: getattr(gpu, name) for name in _JSON_FIELDS}
        entry["uuid"] = gpu.uuid or None
        entry["processes"] = (
            None
            if gpu.processes is None
            else [{"pid": p.pid, "name": p.name, "used_mib": p.used_mib} for p in gpu.processes]
        )
        entry["unavailable"] = dict(gpu.unavailable)
        gpus.append(entry)
    error = snapshot.error
    return {
        "gpus": gpus,
        "error": None
        if error is None
        else {"kind": error.kind, "message": error.message, "exit_code": error.exit_code, "hint": error.hint},
        "skipped_lines": snapshot.skipped_lines,
    }
