"""The fleet poller: a one-line look at many profiles' servers on many hosts, without driving any of them.

Per profile: its state and time in state (the job record, its group's liveness, and its log followed like
`tail -F`, its window (never the whole log) replayed once on attach the way `tunedash status` does, inside the
look that attaches, so the first row already has the server's state), generation tokens/s and acceptance (the
server's /metrics while READY, else its log's decode lines; no load is sent), the memory of each of its GPUs,
who drives it (the driver lock, read only) and the release installed (flag discovery, cached on the host).

Per host: one task that looks at every profile on it each `look_period_s`, under a timeout of `timeout_s`, and
one GPU telemetry stream (one `nvidia-smi -lms` for all the host's GPUs, no process lists) started once the host
has answered. Hosts never wait on each other: an unreachable one keeps its error (retried with a capped
backoff) while the others go on. Profiles that share a Host object share its SSH connection; the caller
(app.connect.fleet_hosts) decides which do. Nothing here signals, launches or takes a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

from app.core.data import ConnectionState, DecodeStats, GpuSnapshot, LogEvent, ServerState, SpecDecodeStats
from app.core.flags.discovery import discover_flags
from app.core.hosts.base import ConnectionChanged, Host, HostError, NotRegularFile, SchedulerStep
from app.core.hosts.window import LogWindow
from app.core.logs.parser import LogParser
from app.core.logs.summary import TimestampClock, line_timestamp
from app.core.measure.http_probes import scrape_metrics
from app.core.measure.metrics import MetricsRate, MetricsReading, rate_between
from app.core.profiles.render import launch_env
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.driver import DriverClaim, DriverLock
from app.core.server.states import LIVE_STATES, gone_state, state_after
from app.core.tasks import TaskOwner, Unsubscribe
from app.core.telemetry.smi import SmiTelemetry

LOOK_PERIOD_S = 2.0
"""How often each host is asked for its profiles' job records and liveness (the log is followed live)."""
DRIVER_PERIOD_S = 5.0
"""How often the driver locks are read (a lock's heartbeat goes stale after 5 s anyway)."""
METRICS_PERIOD_S = 5.0
"""How often a READY server's /metrics is scraped (the dashboard scrapes every 2 s; a fleet glance needs less, and
each scrape is a new HTTP connection: docs/architecture.md#the-fleet has the cost)."""
HOST_TIMEOUT_S = 5.0
VERSION_RETRY_S = 60.0
"""How soon flag discovery is asked again after it found no version (a server not installed yet, a host away)."""
"""The most one host's look may take; past it the host shows "no answer" and the look is retried."""
RETRY_MAX_S = 30.0
"""An unreachable host is retried after 2 s, doubling to this."""
DECODE_FRESH_S = 30.0
"""A log decode line older than this no longer gives the row its tokens/s."""


@dataclass(frozen=True)
class GpuMemory:
    """One GPU of a profile: its memory in MiB (None: not read)."""

    index: int
    used_mib: int | None
    total_mib: int | None


@dataclass(frozen=True)
class FleetRow:
    """What the fleet knows about one profile's server right now."""

    key: str  # the profile file: unique in a fleet
    profile: str
    host: str
    backend: str
    version: str | None
    state: ServerState | None  # None: not known yet (the host has not answered)
    since: float | None  # time.time() the state began; None when unknown (first seen already stopped)
    tokens_per_s: float | None
    accept_len: float | None
    gpus: tuple[GpuMemory, ...]
    gpu_error: str  # why the GPUs could not be read ("" when they were)
    driver: str | None  # "alice@box (dashboard)": who drives and with what; None: nobody
    connection: str  # "local", "connecting", ConnectionState values, or "unreachable"
    error: str  # why the host or the profile could not be read ("" when fine)


@dataclass
class _Watch:
    """One profile's server as the fleet follows it (mutable; FleetPoller.rows() freezes it)."""

    profile: Profile
    record: jobs.JobRecord | None = None
    looked: bool = False
    alive: bool = False
    log_state: ServerState = ServerState.LAUNCHING
    log_entered: float | None = None  # seconds after the log's first timestamp when log_state began (the replay)
    state: ServerState | None = None
    since: float | None = None
    decode: DecodeStats | None = None
    decode_at: float = 0.0
    spec_accept: float | None = None
    metrics: MetricsReading | None = None
    metrics_at: float = 0.0
    rate: MetricsRate | None = None
    driver: DriverClaim | None = None
    driver_at: float = 0.0
    lock: DriverLock | None = None
    version: str | None = None
    version_task: asyncio.Task[None] | None = None  # flag discovery, outside the timed look (it can take minutes)
    version_at: float = -VERSION_RETRY_S  # when discovery was last started
    error: str = ""
    follow_path: str | None = None
    follow_task: asyncio.Task[None] | None = None
    log_error: str = ""  # why the log is not followed (not a regular file)


@dataclass
class _HostWatch:
    """One host and the profiles on it."""

    host: Host
    watches: list[_Watch]
    snapshot: GpuSnapshot | None = None
    connection: ConnectionChanged | None = None
    answered: bool = False
    error: str = ""
    telemetry: SmiTelemetry | None = None
    steps: list[SchedulerStep] = field(default_factory=list)  # a cluster's tunedash steps (Host.scheduler_steps)


def _state_of(watch: _Watch) -> ServerState:
    """The server's state from its record, its group's liveness and its log (the rule of status.inspect_job). A
    live group whose record says it became ready is READY whatever the log shows (a custom profile's health_url
    makes READY with no log line; a log whose ready line was not read yet)."""
    record = watch.record
    if record is None:
        return ServerState.STOPPED
    if record.pgid is None:
        return ServerState.LAUNCHING if record.outcome == "launching" else ServerState.STOPPED
    if watch.alive:
        return ServerState.READY if record.outcome == "ready" else watch.log_state
    return gone_state(record.outcome)


def _first_since(watch: _Watch, state: ServerState) -> float | None:
    """When a state seen on the first look began: READY at the record's ready time; else the launch plus how far
    into the log (by its own timestamps) the state began; the launch when the log does not say."""
    record = watch.record
    if record is None or state not in LIVE_STATES:
        return None
    if state == ServerState.READY and record.ready_at:
        return record.ready_at
    if state == watch.log_state and watch.log_entered is not None:
        return record.launched_at + watch.log_entered
    return record.launched_at


class FleetPoller:
    """Follows many profiles' servers (module docstring). `members`: (profile, host) pairs; profiles that
    should share a connection share the Host object. The caller closes the hosts."""

    def __init__(
        self,
        members: Sequence[tuple[Profile, Host]],
        *,
        look_period_s: float = LOOK_PERIOD_S,
        driver_period_s: float = DRIVER_PERIOD_S,
        metrics_period_s: float = METRICS_PERIOD_S,
        timeout_s: float = HOST_TIMEOUT_S,
        gpu_period_ms: int = 1000,
    ) -> None:
        by_host: dict[int, _HostWatch] = {}
        for profile, host in members:
            entry = by_host.setdefault(id(host), _HostWatch(host, []))
            entry.watches.append(_Watch(profile))
        self.hosts = list(by_host.values())
        self.look_period_s = look_period_s
        self.driver_period_s = driver_period_s
        self.metrics_period_s = metrics_period_s
        self.timeout_s = timeout_s
        self.gpu_period_ms = gpu_period_ms
        self.looks = 0  # completed host looks (benchmarks and tests read it)
        self._started = False
        self._tasks = TaskOwner("fleet")
        self._unsubscribes: list[Unsubscribe] = []

    # ---- running -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start one task per host (idempotent); call inside the running event loop."""
        if self._started:
            return
        self._started = True
        for entry in self.hosts:
            self._unsubscribes.append(entry.host.subscribe_connection(partial(self._on_connection, entry)))
            self._tasks.spawn(self._host_loop(entry), f"look {entry.host.name}")

    async def stop(self) -> None:
        """Unsubscribe from the hosts' connection events, cancel every task (their failures were logged as they
        ended) and close the telemetry streams (the hosts stay open: their owner closes them)."""
        for unsubscribe in self._unsubscribes:
            unsubscribe()
        self._unsubscribes.clear()
        await self._tasks.cancel_all()
        for entry in self.hosts:
            if entry.telemetry is not None:
                await entry.telemetry.close()
        self._started = False

    def look_soon(self) -> None:
        """Read the driver locks again at each host's next look (a dashboard opened from the fleet let go)."""
        for entry in self.hosts:
            for watch in entry.watches:
                watch.driver_at = 0.0

    def _on_connection(self, entry: _HostWatch, event: ConnectionChanged) -> None:
        entry.connection = event

    async def _host_loop(self, entry: _HostWatch) -> None:
        """Look at the host's profiles every look_period_s; an error or a timeout is kept and retried later."""
        retry = self.look_period_s
        while True:
            try:
                await asyncio.wait_for(self._look(entry), self.timeout_s)
            except TimeoutError:  # before OSError, whose subclass it is
                entry.error = f"{entry.host.name}: no answer within {self.timeout_s:.0f} s"
            except (HostError, OSError) as exc:
                entry.error = str(exc) or type(exc).__name__
            else:
                entry.error = ""
                if not entry.answered:
                    entry.answered = True
                    self._tasks.spawn(self._sample_gpus(entry), f"gpus {entry.host.name}")
            self.looks += 1
            if entry.error:
                await asyncio.sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)
            else:
                retry = self.look_period_s
                await asyncio.sleep(self.look_period_s)

    async def _look(self, entry: _HostWatch) -> None:
        """One look at every profile of one host: record, liveness, state; driver and metrics when due."""
        now = time.time()
        for watch in entry.watches:
            await self._look_profile(entry.host, watch, now)
        entry.steps = await entry.host.scheduler_steps()

    async def _look_profile(self, host: Host, watch: _Watch, now: float) -> None:
        profile = watch.profile
        read = await jobs.read_job(host, profile)
        watch.record, watch.error = read.record, read.problem or ""
        record = watch.record
        watch.alive = bool(record and await jobs.job_alive(host, record))
        if record is not None and watch.alive and record.log_path != watch.follow_path:
            await self._attach_log(host, watch, record.log_path)
        state = _state_of(watch)
        if state != watch.state:
            watch.since = _first_since(watch, state) if not watch.looked else now
            watch.state = state
        watch.looked = True
        if now - watch.driver_at >= self.driver_period_s:
            watch.lock = watch.lock or DriverLock(host, profile, "dashboard")
            watch.driver = await watch.lock.holder()
            watch.driver_at = now
        if watch.version is None and (watch.version_task is None or watch.version_task.done()) and (
                now - watch.version_at >= VERSION_RETRY_S):
            watch.version_at = now
            watch.version_task = self._tasks.spawn(self._discover(host, watch), f"version {profile.name}")
        if state == ServerState.READY and now - watch.metrics_at >= self.metrics_period_s:
            watch.metrics_at = now
            await self._scrape(host, watch)
        elif state != ServerState.READY:
            watch.metrics, watch.rate = None, None

    async def _discover(self, host: Host, watch: _Watch) -> None:
        """The installed server's version (app.core.flags.discovery; cached on the host after the first answer)."""
        profile = watch.profile
        with contextlib.suppress(HostError, OSError):
            found = await discover_flags(host, profile.backend, profile.python, profile.module, launch_env(profile))
            watch.version = found.version

    async def _attach_log(self, host: Host, watch: _Watch, path: str) -> None:
        """Replay the job's log as it is now, here in the look (the state it reached settles this look's row), then
        follow it past those lines with the same parser. The replayed lines' throughput figures are not live (as
        ServerLifecycle does)."""
        if watch.follow_task is not None:
            watch.follow_task.cancel()
        watch.follow_path = path
        watch.log_error = ""
        try:  # the replay: the log's window, never the whole log (this runs inside the look's timeout)
            window = await host.read_window(path)
        except NotRegularFile as exc:
            watch.log_error = f"{watch.profile.name}: its log is not followed: {exc}"
            return
        parser = LogParser(watch.profile.backend, ready_regex=watch.profile.ready_regex or None)
        _replay(watch, parser, window)
        watch.decode, watch.spec_accept = None, None
        watch.follow_task = self._tasks.spawn(self._follow(host, watch, path, parser, window),
                                              f"log {watch.profile.name}")

    async def _follow(self, host: Host, watch: _Watch, path: str, parser: LogParser, window: LogWindow | None) -> None:
        """Follow `path` from the end of the `window` _attach_log replayed (from its start when there was none)."""
        with contextlib.suppress(HostError, OSError):
            async with contextlib.aclosing(host.follow(path, offset=window.end if window else None)) as lines:
                async for line in lines:
                    for event in parser.feed(line):
                        self._on_log_event(watch, event)

    def _on_log_event(self, watch: _Watch, event: object) -> None:
        now = time.time()
        if isinstance(event, DecodeStats):
            watch.decode, watch.decode_at = event, now
        elif isinstance(event, SpecDecodeStats):
            watch.spec_accept = event.mean_accept_len
        moved = state_after(watch.log_state, event)  # type: ignore[arg-type]
        if moved is not None:
            watch.log_state, watch.log_entered = moved, None
            state = _state_of(watch)
            if watch.alive and watch.state != state:
                watch.state, watch.since = state, now

    async def _scrape(self, host: Host, watch: _Watch) -> None:
        """One /metrics scrape of a READY server (through the host's forward); a rate once two scrapes exist."""
        base = await host.http_base(watch.profile.port)
        values = await scrape_metrics(base, timeout_s=min(3.0, self.timeout_s))
        if values is None:
            watch.metrics, watch.rate = None, None
            return
        reading = MetricsReading(values, time.monotonic(), time.time())
        if watch.metrics is not None:
            watch.rate = rate_between(watch.metrics, reading, watch.profile.backend) or watch.rate
        watch.metrics = reading

    async def _sample_gpus(self, entry: _HostWatch) -> None:
        """The host's GPUs, all of them, at gpu_period_ms (process lists are not read: memory is enough here)."""
        entry.telemetry = SmiTelemetry(entry.host, None, apps_interval_s=3600.0)
        async with contextlib.aclosing(entry.telemetry.stream(self.gpu_period_ms)) as snapshots:
            async for snapshot in snapshots:
                entry.snapshot = snapshot

    # ---- reading -------------------------------------------------------------------------------
    def rows(self) -> list[FleetRow]:
        """Every profile's row, sorted by host, then profile name."""
        now = time.time()
        out = [self._row(entry, watch, now) for entry in self.hosts for watch in entry.watches]
        out += [row for entry in self.hosts for row in _step_rows(entry)]
        return sorted(out, key=lambda row: (row.host, row.profile, row.key))

    def _row(self, entry: _HostWatch, watch: _Watch, now: float) -> FleetRow:
        profile = watch.profile
        state = watch.state if watch.looked else None
        tokens, accept = self._figures(watch, state, now)
        return FleetRow(
            key=str(profile.source), profile=profile.name, host=entry.host.name, backend=profile.backend,
            version=watch.version, state=state, since=watch.since if state is not None else None,
            tokens_per_s=tokens, accept_len=accept,
            gpus=self._gpus(entry.snapshot, profile), gpu_error=_gpu_error(entry.snapshot),
            driver=f"{watch.driver.who} ({watch.driver.kind})" if watch.driver else None,
            connection=_connection(entry), error=entry.error or watch.error or watch.log_error,
        )

    @staticmethod
    def _figures(watch: _Watch, state: ServerState | None, now: float) -> tuple[float | None, float | None]:
        """Tokens/s (metrics first, then a fresh log decode line) and acceptance length, READY only."""
        if state != ServerState.READY:
            return None, None
        decode = watch.decode if watch.decode and now - watch.decode_at <= DECODE_FRESH_S else None
        accept = (watch.rate.accept_len if watch.rate and watch.rate.accept_len is not None
                  else decode.accept_len if decode and decode.accept_len is not None else watch.spec_accept)
        if watch.rate is not None:
            return watch.rate.tokens_per_s, accept
        return (decode.gen_tps if decode is not None else None), accept

    @staticmethod
    def _gpus(snapshot: GpuSnapshot | None, profile: Profile) -> tuple[GpuMemory, ...]:
        seen = {gpu.index: gpu for gpu in snapshot.gpus} if snapshot is not None else {}
        out = []
        for index in profile.gpus:
            gpu = seen.get(index)
            out.append(GpuMemory(index, gpu.memory_used_mib if gpu else None, gpu.memory_total_mib if gpu else None))
        return tuple(out)


def _replay(watch: _Watch, parser: LogParser, window: LogWindow | None) -> None:
    """Feed the lines of the log's `window` (its head and tail, whole lines; None: no log yet) to `parser`: the state
    they lead to from LAUNCHING (states.state_after, as status.inspect_job replays) and how far into the log it began
    go to `watch`. Nothing spans the part of the log between the head and the tail (the parser is flushed there)."""
    clock: TimestampClock | None = None
    state, entered = ServerState.LAUNCHING, None

    def feed(events: Iterable[LogEvent]) -> None:
        nonlocal clock, state, entered
        for event in events:
            moved = state_after(state, event)
            if moved is not None:
                if clock is None:  # seconds from the log's first timestamp, read in order from here on
                    clock = TimestampClock()
                    clock.seconds(parser.first_timestamp)
                state, entered = moved, clock.seconds(line_timestamp(event.line.text))

    if window is not None:
        for line in window.head:
            feed(parser.feed(line))
        if window.skipped:
            feed(parser.flush())
        for line in window.tail:
            feed(parser.feed(line))
    watch.log_state, watch.log_entered = state, entered


def _gpu_error(snapshot: GpuSnapshot | None) -> str:
    if snapshot is None:
        return "not read yet"
    return snapshot.error.message if snapshot.error is not None else ""


def _connection(entry: _HostWatch) -> str:
    """"local" for a host without connection events; else the last event's state, "unreachable" before any."""
    event = entry.connection
    if event is not None:
        state: ConnectionState = event.state
        return state
    if getattr(entry.host, "is_local", False):
        return "local"
    if entry.error:
        return "unreachable"
    return "connected" if entry.answered else "connecting"


def _step_rows(entry: _HostWatch) -> list[FleetRow]:
    """One row per tunedash step the cluster lists that none of this host's profiles is following (a launch from
    another profile file, another machine, a dashboard that quit): its step id, node and time running."""
    followed = _followed_tags(entry)
    rows = []
    for step in entry.steps:
        if step.name.removeprefix("tunedash-") in followed:
            continue
        rows.append(FleetRow(
            key=f"slurm-step:{step.step}", profile=f"step {step.step}", host=entry.host.name, backend="?",
            version=None, state=None, since=None, tokens_per_s=None, accept_len=None, gpus=(),
            gpu_error="a step no profile here names", driver=None, connection=_connection(entry),
            error=f"{step.name} on {step.node}, running {step.elapsed}: no profile given to the fleet launched it"))
    return rows


def _followed_tags(entry: _HostWatch) -> set[str]:
    return {watch.record.tag for watch in entry.watches if watch.record is not None and watch.record.tag}
