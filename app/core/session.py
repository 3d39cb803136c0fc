"""Session: everything one dashboard shows about one profile's server, and the commands it can give.

Over 450 lines: it is the one owner of a dashboard's server (docs/architecture.md#who-owns-what), so the wiring
of every feed and command meets here; each job it wires lives in its own module (server/, measure/, flags/).

The Session owns the lifecycle, a GPU telemetry stream, the throughput series (from the server's log
and from the probe client), the relaunch markers, the event log (kept across relaunches), the server
log lines, and the pending flags (what the next relaunch will use). The TUI reads its fields at a
bounded rate and calls its commands; nothing here imports a UI.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any

from app.core.adopt.takeover import Adoption, watch_adopted
from app.core.advisor.acceptance_watch import AcceptanceWatch, ReadingSource
from app.core.command import KILLS, BeforeCommand, CommandSlot
from app.core.data import (
    DecodeStats,
    EventLevel,
    FlagChange,
    FlagValue,
    GpuSnapshot,
    RelaunchMarker,
    ServerState,
    SpecDecodeStats,
    ThroughputPoint,
)
from app.core.errors import TunedashError
from app.core.flags.discovery import ServerFlags, discover_flags, rejection_message
from app.core.flags.toggles import Toggle, apply_toggle, toggle_value
from app.core.flags.values import FlagError, set_flag
from app.core.hosts.base import ConnectionChanged, Host, HostError, NotRegularFile
from app.core.hosts.window import TAIL_BYTES
from app.core.measure.http_probes import server_info
from app.core.measure.metrics import MetricsPoller, MetricsRate
from app.core.measure.probe import ProbeStatus, probe_loop
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import for_server_version
from app.core.profiles.render import describe_change, flag_diff, launch_argv, launch_env
from app.core.profiles.types import Profile
from app.core.server.driver import HEARTBEAT_S, DrivenElsewhere, DriverClaim, DriverLock
from app.core.server.events import (
    ActionLogged,
    GpuSampled,
    Launched,
    LifecycleEvent,
    LifecycleView,
    Listeners,
    ServerLogEvent,
    StateChanged,
    ThroughputAdded,
)
from app.core.server.lifecycle import ServerLifecycle
from app.core.server.progress import LaunchProgress
from app.core.server.release import FreeProgress
from app.core.server.states import STARTING_STATES
from app.core.server.warm import warm_refusal
from app.core.tasks import TaskOwner
from app.core.telemetry.smi import Telemetry
from app.core.telemetry.steady import dashboard_telemetry

log = logging.getLogger("tunedash")

class WarmRefused(Exception):
    """Warm mode cannot be switched on here; the message says why (the backend, its version, the flags)."""


class ReadOnlyError(Exception):
    """A command that signals or launches was refused because the session is read-only."""


class Session:
    """One profile's server on one host, as the dashboard sees and drives it."""

    def __init__(
        self,
        host: Host,
        profile: Profile,
        *,
        readonly: bool = False,
        telemetry: Telemetry | None = None,
        gpu_source: str = "auto",
        sample_period_ms: int = 250,
        probe: bool = False,
        autolaunch: bool = False,
        take_over: bool = False,
        watching: bool = False,
    ) -> None:
        self.host = host
        self.take_over = take_over  # drive a server someone else drives (app.core.server.driver)
        self.connection: ConnectionChanged | None = None  # a remote host's latest connection state
        self.profile = profile  # what runs (or would run on launch)
        self.pending_flags: dict[str, FlagValue] = dict(profile.flags)
        self.pending_warm: bool | None = None  # warm mode for the next relaunch (`w`); None: as the profile says
        # no command may signal or launch: asked for, watching (a web tab), or another session drives
        self.readonly = readonly or watching
        self.watch_only = readonly  # asked for (--readonly): never takes the driver lock, not even by take_over_now
        self.watching = watching and not readonly  # starts read-only; drives only after take_over_now (a web tab)
        self.driver = DriverLock(host, profile, "dashboard")
        # set once start() has settled the driver lock: a key pressed while the lock is still being taken waits for
        # it instead of being refused as if another session drove (the claim is on disk before `held` is set)
        self._driver_settled = asyncio.Event()
        self._driver_settling = False
        self.driven_by: str | None = None  # who drives, when another session does ("alice@gpubox")
        # this machine's driver: NVML in-process; elsewhere nvidia-smi (app.core.telemetry.steady)
        self.telemetry: Telemetry = telemetry or dashboard_telemetry(host, profile.gpus, gpu_source)
        self.sample_period_ms = sample_period_ms
        self.lifecycle = ServerLifecycle(host, profile, self.telemetry)
        self.lifecycle.subscribe(self._on_lifecycle)
        self.lifecycle.before_act = self._before_act
        # each run's phase times, the next one's ETA; a read-only session writes nothing (it launches nothing either)
        self.lifecycle.phases.store_factory = lambda: None if self.readonly else HistoryStore()
        watch_adopted(self.lifecycle, self.note)  # no record of ours: a server started by hand runs this profile?
        self.snapshot: GpuSnapshot | None = None
        self._release_floor = 0.0  # monotonic: dashboard samples whose process lists are older are not shown
        self.throughput: deque[ThroughputPoint] = deque(maxlen=4000)
        self.markers: list[RelaunchMarker] = []
        self.events: deque[ActionLogged] = deque(maxlen=2000)
        self.log_lines: deque[str] = deque(maxlen=5000)
        self.server_version: str | None = None
        self.probe_wanted = probe
        self.probe_status: ProbeStatus | None = None  # the probe's last state (running, failing, stopped)
        self.autolaunch = autolaunch and not self.readonly
        self.command = CommandSlot(self.note)  # the one command in progress: name, progress, cancel
        # awaited before every command begins: raises CommandRefused to stop it before anything is signalled (a mode
        # that must ask the person first, e.g. before the first kill of a server tunedash did not launch)
        self.before_command: BeforeCommand | None = None
        # a listener that raises is logged and said in the event log; the other listeners still hear the event
        self._listeners = Listeners("session", on_failure=lambda text: self.note(text, "error"))
        self._tasks = TaskOwner("session", on_failure=lambda text: self.note(text, "error"))
        self._telemetry_task: asyncio.Task[None] | None = None
        self._probe_task: asyncio.Task[None] | None = None
        # /metrics and the installed server's flags (app.core.measure.metrics, app.core.flags.discovery)
        self.metrics_period_s = 2.0
        self.last_metrics: MetricsRate | None = None
        self.server_flags: ServerFlags | None = None  # None until discovered
        self._metrics_task: asyncio.Task[None] | None = None
        self._tail_task: asyncio.Task[None] | None = None
        self.log_path: str | None = None  # the log the log view follows: the running launch's
        self.acceptance = AcceptanceWatch()  # speculation not paying: its alarm is in the header and the event log
        self._stopped = False
        # a scheduler's word (a Slurm allocation's time running out) goes to the event log
        self._unsubscribe_notices = host.subscribe_notices(self.note)

    # ---- wiring ----------------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[LifecycleEvent], None]) -> Callable[[], None]:
        """Receive every lifecycle event (and the session's own notes) from now on; returns the unsubscriber."""
        return self._listeners.subscribe(listener)

    def view(self) -> LifecycleView:
        """The server as the lifecycle knows it now, frozen: what the screens (and an A/B) read. Its job record and
        phase times are copies (ServerLifecycle.view): the lifecycle keeps writing its own while a screen holds
        this one."""
        return self.lifecycle.view()

    def launch_progress(self) -> LaunchProgress | None:
        """The launch or relaunch under way: its phases, progress and ETA (app.core.server.progress); None when
        none is. The Server panel draws it."""
        return self.lifecycle.phases.progress()

    def note(self, text: str, level: EventLevel = "info") -> None:
        """A line in the event log (the session's own, and the advisor's findings and what was applied)."""
        self._on_lifecycle(ActionLogged(text, level))

    def _on_lifecycle(self, event: LifecycleEvent) -> None:
        if isinstance(event, ActionLogged):
            self.events.append(event)
        elif isinstance(event, ConnectionChanged):
            self.connection = event
        elif isinstance(event, StateChanged):
            self._on_state(event.state)
        elif isinstance(event, FreeProgress) and event.snapshot is not None:
            self._adopt_release_sample(event.snapshot)
        elif isinstance(event, Launched):  # whoever launched (a key, an A/B arm, a CLI): this is what runs now
            if self.pending_flags == self.profile.flags:  # nothing pending: the new running flags, as on attach
                self.pending_flags = dict(event.profile.flags)
            if self.pending_warm == event.profile.warm:  # applied
                self.pending_warm = None
            self.profile = event.profile
            self._follow_server_log(event.record.log_path)
        elif isinstance(event, ServerLogEvent):
            payload = event.event
            if event.replayed:
                pass  # a re-attach replays the log: its old throughput lines are not live figures
            elif isinstance(payload, DecodeStats):
                self._add_point(ThroughputPoint(time.time(), payload.gen_tps, "log", payload.accept_len))
                if payload.accept_len is not None:
                    self.observe_acceptance(time.time(), payload.accept_len, "log")
            elif isinstance(payload, SpecDecodeStats) and payload.mean_accept_len is not None:
                if self.throughput:
                    last = self.throughput[-1]
                    self.throughput[-1] = replace(last, accept_len=payload.mean_accept_len)
                    self._listeners.emit(ThroughputAdded(self.throughput[-1]))
                self.observe_acceptance(time.time(), payload.mean_accept_len, "log")
        self._listeners.emit(event)

    def _add_point(self, point: ThroughputPoint) -> None:
        """A throughput point into the series; its listeners hear of it (the chart follows them)."""
        self.throughput.append(point)
        self._listeners.emit(ThroughputAdded(point))

    def observe_acceptance(self, at: float, accept_len: float, source: ReadingSource) -> None:
        """One acceptance reading (a log line's, a /metrics window's): the event log hears when speculation stops
        paying for a sustained window, once per episode, and when it recovers (app.core.advisor.acceptance_watch)."""
        said = self.acceptance.add(at, accept_len, source)
        if said is not None:
            self.note(said.text(), "warning" if said.kind == "low" else "info")

    def _on_state(self, state: ServerState) -> None:
        if state != ServerState.READY:
            self.acceptance.reset()  # a kill or another launch: the next configuration's readings start afresh
        if state == ServerState.READY:
            self._spawn(self._read_version())
            if self.probe_wanted:
                self._start_probe()
            self._start_metrics()
        else:
            self._stop_probe()
            self._stop_metrics()

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """A background task of this session: cancelled by stop(); one that fails is said in the event log."""
        return self._tasks.spawn(coro, name)

    @property
    def adopted(self) -> Adoption | None:
        """The server started by hand this session watches (until its kill), or None (docs/adopt.md)."""
        adopted = self.lifecycle.adopted
        return adopted if isinstance(adopted, Adoption) else None

    @property
    def samples_gpus(self) -> bool:
        """Whether this session samples GPUs: not for a profile without GPUs (`gpus = []`, e.g. vLLM on CPU), whose
        host may have no nvidia-smi at all."""
        return bool(self.profile.gpus)

    async def start(self) -> None:
        """Re-attach to a running server of this profile (its flags become the running ones) and sample."""
        self._driver_settling = True
        try:
            await self._start()
        finally:
            self._driver_settling = False
            self._driver_settled.set()

    async def _start(self) -> None:
        if self.samples_gpus:
            self._telemetry_task = self._spawn(self._sample_gpus(), "GPU samples")
        self._spawn(self._discover_flags())
        record = None
        try:
            attached = await self.lifecycle.attach()
            record = self.lifecycle.record if attached else None
        except HostError as exc:  # the host is unreachable: its connection event says so once (and says when back)
            log.info("re-attach to %s's server waits for its host: %s", self.profile.name, exc)
        except (TunedashError, OSError) as exc:  # the record could not be read: said, and the dashboard still opens
            self.note(f"could not re-attach to the running server: {exc}", "error")
        if record is not None:
            self.profile = replace(self.profile, flags=dict(record.flags))
            self.lifecycle.profile = self.profile
            self.pending_flags = dict(record.flags)
            if record.log_path:
                self._follow_server_log(record.log_path)
            elif self.adopted is not None:
                self.log_lines.append(f"({self.adopted.log_note})")
        await self._settle_driver()
        self._driver_settled.set()
        if record is None and self.autolaunch and not self.readonly:
            self.note(f"no server of {self.profile.name} running: launching it")
            self.run_command("launch", self.launch)

    async def _settle_driver(self) -> None:
        """Take the driver lock (app.core.server.driver) unless watching only: read-only when another live
        session holds it (unless taking over); then keep it alive and notice a take-over within HEARTBEAT_S."""
        if self.watch_only or self.watching:
            await self._read_driver()  # the header says who drives from the first frame
            self._spawn(self._keep_driving())  # follows what the driver launches; takes no lock by itself
            return
        try:
            verdict = await self.driver.acquire(take_over=self.take_over)
        except (HostError, OSError):  # the host's own error is in the event log already
            self.readonly = True
            self.note(f"the driver lock on {self.host.name} cannot be read: read-only until the host answers",
                       "warning")
        else:
            self.readonly = verdict.readonly
            if verdict.message:
                self.note(verdict.message, verdict.level)
            if verdict.readonly:
                await self._read_driver()
        self._spawn(self._keep_driving())

    async def _read_driver(self) -> DriverClaim | None:
        """Who drives now (for the header), when it is not this session."""
        holder = await self.driver.holder()
        self.driven_by = holder.who if holder is not None and not self.driver.held else None
        return holder

    async def _keep_driving(self) -> None:
        """Every HEARTBEAT_S: renew the lock, or learn that someone took over; drive again once it is free."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            with contextlib.suppress(HostError, OSError):
                if self.driver.held:
                    taken = await self.driver.heartbeat()
                    if taken is not None:
                        # turned read-only and said so in one step (no await between): whoever sees the one sees
                        # the other; who drives now follows when the host answers
                        self.readonly = True
                        self.note(f"{taken} took over; this dashboard is now read-only", "warning")
                        await self._read_driver()
                else:
                    if not self.command.running:
                        await self.lifecycle.follow_record()  # the driver launched another server: show that one
                    if await self._read_driver() is None and not (self.watch_only or self.watching):
                        verdict = await self.driver.acquire(take_over=False)
                        if not verdict.readonly:
                            self.readonly, self.driven_by = False, None
                            self.note(f"nobody drives {self.profile.name} any more: this dashboard drives it now")

    @property
    def can_take_over(self) -> bool:
        """Whether take_over_now may make this read-only session drive (not one opened with --readonly)."""
        return self.readonly and not self.watch_only

    async def take_over_now(self) -> str:
        """Take the driver lock now, from whoever holds it (their session turns read-only within HEARTBEAT_S);
        returns the event log's line. Refused (ReadOnlyError) for a session opened with --readonly."""
        if self.watch_only:
            raise ReadOnlyError("read-only session (--readonly): take-over is disabled")
        if not self.readonly:
            return f"this session already drives {self.profile.name}"
        verdict = await self.driver.acquire(take_over=True)
        self.readonly = verdict.readonly
        if not verdict.readonly:
            self.driven_by = None
        self.note(verdict.message, verdict.level)
        return verdict.message

    async def _before_act(self, what: str) -> None:
        """Right before the lifecycle signals or launches: only while this session still drives."""
        if self.watch_only:
            raise ReadOnlyError(f"read-only session: {what} is disabled")
        if self._driver_settling and not self._driver_settled.is_set():
            await self._driver_settled.wait()  # start() is still taking the lock: its verdict decides
        try:
            await self.driver.check(what)
        except DrivenElsewhere:
            self.readonly = True
            raise

    async def stop(self) -> None:
        """Stop watching and sampling (once; a second call does nothing). The server keeps running."""
        if self._stopped:
            return
        self._stopped = True
        self._unsubscribe_notices()
        await self.command.close()  # a command that must clean up (a tune's other slots) ends first
        await self._tasks.close()  # the GPU samples, probe, /metrics, log tail, version and flag reads
        await self.lifecycle.close()
        await self.driver.release()  # never raises: a claim it cannot remove expires by itself (driver.STALE_S)
        try:
            await self.telemetry.close()
        except Exception as exc:  # NVML's own errors too: the session is ending, so the failure is only logged
            log.warning("closing the GPU sampler failed: %s", exc)

    async def _sample_gpus(self) -> None:
        async with contextlib.aclosing(self.telemetry.stream(self.sample_period_ms)) as snapshots:
            async for snapshot in snapshots:
                if _lists_processes_before(snapshot, self._release_floor):
                    continue  # older news than the sample that proved FREE (or STUCK): the panel keeps that one
                self.snapshot = snapshot
                self._listeners.emit(GpuSampled(snapshot))

    def _adopt_release_sample(self, snapshot: GpuSnapshot) -> None:
        """The release watcher's sample becomes the GPU panel's, so the panel shows what made the verdict (FREE,
        STUCK) when the verdict shows; the dashboard's own samples take over once theirs are as new."""
        if snapshot.error is not None or not snapshot.gpus:
            return
        self.snapshot = snapshot
        self._release_floor = min((g.processes_taken_at or g.taken_at) for g in snapshot.gpus)
        self._listeners.emit(GpuSampled(snapshot))

    def _follow_server_log(self, path: str) -> None:
        """Keep the log view's lines from this launch's log (one follower at a time)."""
        if self._tail_task is not None:
            self._tail_task.cancel()
        self.log_path = path
        self._tail_task = self._spawn(self._tail_log(path))

    async def _tail_log(self, path: str) -> None:
        """The log view's lines: the log's last TAIL_BYTES (never the whole log), then each line appended."""
        self.log_lines.clear()
        offset = None
        try:
            window = await self.host.read_window(path, 0, TAIL_BYTES)
        except NotRegularFile as exc:
            self.log_lines.append(f"(the log is not shown: {exc})")
            return
        except HostError:
            window = None  # out of reach for now: the follow waits for the host
        if window is not None:
            self.log_lines.extend(window.lines)
            offset = window.end
        async with contextlib.aclosing(self.host.follow(path, offset=offset)) as lines:
            async for line in lines:
                self.log_lines.append(line)

    async def _read_version(self) -> None:
        info = await server_info(await self.host.http_base(self.profile.port), self.profile.backend)
        if info:
            version = info.get("version")
            self.server_version = str(version) if version is not None else None

    # ---- probe -----------------------------------------------------------------------------------
    def set_probe(self, on: bool) -> None:
        """Turn the continuous single-stream probe on or off (it runs only while the server is READY)."""
        self.probe_wanted = on
        if on and self.lifecycle.state == ServerState.READY:
            self._start_probe()
        elif not on:
            self._stop_probe()
        self.note(f"probe {'on' if on else 'off'}")

    def _start_probe(self) -> None:
        if self._probe_task is not None and not self._probe_task.done():
            return

        def on_point(point: ThroughputPoint) -> None:
            self._add_point(point)

        def on_status(status: ProbeStatus) -> None:
            was = self.probe_status.state if self.probe_status is not None else "running"
            self.probe_status = status
            connected = self.connection is None or self.connection.state == "connected"
            if status.state == "failing" and connected:  # an outage of the host is said once, by the host
                self.note(f"probe failing: {status.error} ({status.failures} in a row; next try in "
                           f"{status.retry_in_s or 0:.0f} s)", "warning")
            elif status.state == "running" and was == "failing":
                self.note("probe answering again")
            elif status.state == "stopped" and status.error:
                self.note(f"probe stopped: {status.error}", "error")

        async def probe() -> None:
            base = await self.host.http_base(self.profile.port)  # a remote host forwards a local port
            await probe_loop(base, self.profile.model, on_point, on_status=on_status)  # failures: on_status

        def ended(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None:  # e.g. the port forward could not open
                on_status(ProbeStatus("stopped", error=str(task.exception()) or type(task.exception()).__name__))

        self.probe_status = ProbeStatus("running")
        self._probe_task = self._spawn(probe(), "probe")
        self._probe_task.add_done_callback(ended)

    def _stop_probe(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            self._probe_task = None

    # ---- /metrics and the installed server's flags ----------------------------------------------
    def _start_metrics(self) -> None:
        """Poll /metrics while READY: generation tokens/s into the chart (source "metrics") and acceptance."""
        if self._metrics_task is not None and not self._metrics_task.done():
            return
        async def poll() -> None:
            poller = MetricsPoller(await self.host.http_base(self.profile.port), self.profile.backend,
                                   period_s=self.metrics_period_s)
            await poller.run(on_rate)

        def on_rate(rate: MetricsRate) -> None:
            self.last_metrics = rate
            self._add_point(rate.point())  # an idle window is a real 0 tok/s
            if rate.accept_len is not None:
                self.observe_acceptance(rate.at, rate.accept_len, "metrics")

        self._metrics_task = self._spawn(poll(), "/metrics")

    def _stop_metrics(self) -> None:
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            self._metrics_task = None

    async def _discover_flags(self) -> None:
        """Which catalog flags the installed server accepts (the palette offers only those)."""
        found = await discover_flags(self.host, self.profile.backend, self.profile.python, self.profile.module,
                                     launch_env(self.profile))
        self.server_flags = found
        self.lifecycle.server_flags = found
        if found.known and found.version:
            self.server_version = self.server_version or found.version
            self._render_for_version(found)

    def _render_for_version(self, found: ServerFlags) -> None:
        """The toggles in the flags of the version found; a flag of the profile (or pending) that this version
        rejects is named with what replaces it, and never rewritten."""
        before = {t.key: t.flags for t in self.profile.toggles}
        self.profile = for_server_version(self.profile, found.version)
        self.lifecycle.profile = for_server_version(self.lifecycle.profile, found.version)
        changed = [t for t in self.profile.toggles if before.get(t.key) not in (None, t.flags)]
        if changed:
            keys = ", ".join(f"{t.key} = {' '.join('--' + f for f in t.flags)}" for t in changed)
            self.note(f"{found.describe()}: keys render this version's flags ({keys})")
        message = rejection_message(found, self.pending_flags, str(self.profile.source))
        if message:
            self.note(message.replace("; nothing was launched or killed", "; a relaunch refuses to launch it"),
                      "warning")

    # ---- pending flags ---------------------------------------------------------------------------
    @property
    def pending_changes(self) -> list[FlagChange]:
        return flag_diff(self.profile.flags, self.pending_flags)

    @property
    def pending_profile(self) -> Profile:
        warm = self.profile.warm if self.pending_warm is None else self.pending_warm
        return replace(self.profile, flags=dict(self.pending_flags), warm=warm)

    def warm_refusal(self) -> str:
        """Why warm mode cannot be switched on for this session's server (the backend or its version has no weight
        cache, or the flags refuse it: app.core.server.warm.warm_refusal); "" when it can."""
        return warm_refusal(replace(self.pending_profile, warm=True), self.server_flags)

    def toggle_warm(self) -> str:
        """Warm mode on or off for this session from the next relaunch (`w`, the palette's Warm mode); what it
        will do, for the toast and the event log. Raises WarmRefused with the reason when it cannot be on."""
        self._guard("warm mode")
        on = not self.pending_profile.warm
        if on:
            why = self.warm_refusal()
            if why:
                raise WarmRefused(why)
        self.pending_warm = None if on == self.profile.warm else on
        if on:
            text = ("warm mode on: the next relaunch (r) starts the weight cache daemon and runs the server as its "
                    "client; relaunches after it map the weights from the cache")
        else:
            text = ("warm mode off: the next relaunch (r) stops the weight cache daemon and loads the weights from "
                    "disk")
        if self.pending_warm is None:
            text = f"warm mode {'on' if on else 'off'}, as the running server (nothing pending)"
        self.note(text)
        return text

    def running_argv(self) -> list[str]:
        return launch_argv(self.profile)

    def pending_argv(self) -> list[str]:
        return launch_argv(self.pending_profile)

    def press_toggle(self, toggle: Toggle) -> str:
        """Apply one press of a toggle to the pending flags; returns what changed, for the event log."""
        try:
            self.pending_flags = apply_toggle(self.pending_flags, toggle)
        except FlagError as exc:
            self.note(str(exc), "warning")
            return str(exc)
        return self.describe_pending()

    def set_pending_flag(self, name: str, value: FlagValue | None) -> None:
        self.pending_flags = set_flag(self.pending_flags, name, value)

    def undo_pending(self) -> None:
        self.pending_flags = dict(self.profile.flags)
        self.pending_warm = None
        self.note("pending changes undone")

    def describe_pending(self) -> str:
        """The pending change for people: toggles first by their names ("steps 1 -> 3", "overlap sched ->
        sched+sbo"), then other flags; flags a toggle derives (draft tokens from steps) are not repeated."""
        running, pending = self.profile.flags, self.pending_flags
        parts: list[str] = []
        if self.pending_warm is not None and self.pending_warm != self.profile.warm:
            parts.append(f"warm {'off -> on' if self.pending_warm else 'on -> off'}")
        covered: set[str] = set()
        for toggle in self.profile.toggles:
            before, after = toggle_value(running, toggle), toggle_value(pending, toggle)
            covered.update(toggle.flags)
            if before != after:
                parts.append(f"{toggle.label} {before} -> {after}")
                if "speculative-num-steps" in toggle.flags:
                    covered.add("speculative-num-draft-tokens")
        parts += [
            describe_change(change, self.profile.toggles)
            for change in self.pending_changes
            if change.flag not in covered and change.flag.split(".")[0] not in covered
        ]
        return ", ".join(parts) or "no change"

    # ---- commands ----------------------------------------------------------------------------------
    def _guard(self, what: str) -> None:
        if self.readonly:
            raise ReadOnlyError(f"read-only session: {what} is disabled")

    @property
    def busy(self) -> str | None:
        """The name of the command in progress ("relaunch", "A/B", ...), or None (the header's note)."""
        current = self.command.current
        return current.name if current is not None else None

    def command_refusal(self, name: str) -> str | None:
        """Why command `name` may not start now (another one runs), or None; a kill is never refused here: it
        cancels the command in progress first."""
        return None if name in KILLS else self.command.refusal(name)

    def run_command(self, name: str, coro_factory: Callable[[], Coroutine[Any, Any, Any]], *,
                    signals: bool = True, settle_s: float = 0.0) -> asyncio.Task[None] | None:
        """Start `name` in the one command slot (app.core.command.CommandSlot); None when another command runs (the
        event log says which). A kill is the exception: it cancels the command in progress (a relaunch waiting for a
        server that never gets ready, an A/B) and then kills. A command that `signals` (or launches) is refused in a
        read-only session (ReadOnlyError); a benchmark only loads the server. `settle_s`: how long `stop` waits for
        the command's clean-up once it has cancelled it (CommandSlot.start)."""
        if signals:
            self._guard(name)
        refused = self.command_refusal(name)
        if refused:
            self.note(f"{refused} (a kill cancels it)", "warning")
            return None
        return self.command.start(name, coro_factory, before=self.before_command, settle_s=settle_s)

    async def launch(self) -> None:
        self._guard("launch")
        self.lifecycle.profile = self.pending_profile
        await self.lifecycle.launch()  # its Launched event makes the profile the running one and follows the log

    async def kill(self) -> None:
        self._guard("kill")
        self._stop_probe()
        await self.lifecycle.kill(confirm_free=True)

    async def kill_all(self) -> None:
        """Kill the server and its weight cache daemon: FREE at 0 MiB (ServerLifecycle.kill_all)."""
        self._guard("kill")
        self._stop_probe()
        await self.lifecycle.kill_all()

    async def confirm_free(self) -> None:
        self._guard("confirm free")
        await self.lifecycle.confirm_free(self.lifecycle.record)

    async def relaunch(self, profile: Profile | None = None, *, ready_timeout_s: float | None = None,
                       change: str | None = None) -> ServerState:
        """kill -> confirm free -> launch -> ready (ServerLifecycle.relaunch) with `profile`, by default the
        pending flags; marks the chart with the change. An A/B arm relaunches through here too."""
        self._guard("relaunch")
        new_profile = profile or self.pending_profile
        if change is None:
            change = self.describe_pending() if profile is None else self._describe(self.profile, new_profile)
        self._stop_probe()
        self.note(f"relaunch: {change}")
        self.markers.append(RelaunchMarker(time.time(), change))
        self._listeners.emit(ThroughputAdded(None))
        timeout = new_profile.ready_timeout_s if ready_timeout_s is None else ready_timeout_s
        state = await self.lifecycle.relaunch(new_profile, ready_timeout_s=timeout)
        if state == ServerState.READY:
            self.note(launch_summary(change, self.lifecycle.phase_times))
        elif state in STARTING_STATES:
            self.note(f"not ready after {timeout:.0f} s (still {state.value}); it keeps starting: a kill stops it, "
                       f"`ready_timeout` in {new_profile.source} waits longer", "warning")
        return state

    def _describe(self, old: Profile, new: Profile) -> str:
        changes = flag_diff(old.flags, new.flags)
        return ", ".join(describe_change(c, old.toggles) for c in changes) or "no change"


def launch_summary(change: str, times: Mapping[str, float]) -> str:
    """The event log's line after a relaunch reached READY, with the phases that happened (states.phase_durations):
    "relaunched with steps 1 -> 3: kill 2.1s, release 0.4s, start 0.3s, ..." after a kill; "launched: start 0.3s,
    load 3.9s, ..., ready 5.8s" when no server ran."""
    parts = ", ".join(f"{k} {v:.1f}s" for k, v in times.items())
    if "kill" in times:
        return f"relaunched with {change}: {parts}"
    return f"launched{'' if change == 'no change' else f' with {change}'}: {parts}"


def _lists_processes_before(snapshot: GpuSnapshot, floor: float) -> bool:
    """Whether a sample's process lists were read before `floor` (a monotonic time)."""
    if not floor or snapshot.error is not None or not snapshot.gpus:
        return False
    return any((g.processes_taken_at if g.processes_taken_at is not None else g.taken_at) < floor
               for g in snapshot.gpus)
