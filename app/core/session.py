"""Session: everything one dashboard shows about one profile's server, and the commands it can give.

The Session owns the lifecycle, a GPU telemetry stream, the throughput series (from the server's log
and from the probe client), the relaunch markers, the event log (kept across relaunches), the server
log lines, and the pending flags (what the next relaunch will use). The TUI reads its fields at a
bounded rate and calls its commands; nothing here imports a UI.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

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
from app.core.flags.discovery import ServerFlags, discover_flags
from app.core.flags.toggles import Toggle, apply_toggle, toggle_value
from app.core.flags.values import FlagError, set_flag
from app.core.hosts.base import ConnectionChanged, Host, HostError
from app.core.measure.http_probes import server_info
from app.core.measure.metrics import MetricsPoller, MetricsRate
from app.core.measure.probe import probe_loop
from app.core.profiles.render import describe_change, flag_diff, launch_argv, launch_env
from app.core.profiles.types import Profile
from app.core.server import driver, jobs
from app.core.server.events import (
    ActionLogged,
    Launched,
    LifecycleEvent,
    LifecycleView,
    Listeners,
    ServerLogEvent,
    StateChanged,
)
from app.core.server.lifecycle import ServerLifecycle
from app.core.server.preflight import LaunchRefused
from app.core.telemetry.smi import Telemetry, telemetry_for


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
        sample_period_ms: int = 250,
        probe: bool = False,
        autolaunch: bool = False,
        take_over: bool = False,
    ) -> None:
        self.host = host
        self.take_over = take_over  # drive a server someone else drives (app.core.server.driver)
        self.connection: ConnectionChanged | None = None  # a remote host's latest connection state
        self.profile = profile  # what runs (or would run on launch)
        self.pending_flags: dict[str, FlagValue] = dict(profile.flags)
        self.readonly = readonly
        self.telemetry: Telemetry = telemetry or telemetry_for(host, "smi", profile.gpus)
        self.sample_period_ms = sample_period_ms
        self.lifecycle = ServerLifecycle(host, profile, self.telemetry)
        self.lifecycle.subscribe(self._on_lifecycle)
        self.snapshot: GpuSnapshot | None = None
        self.throughput: deque[ThroughputPoint] = deque(maxlen=4000)
        self.markers: list[RelaunchMarker] = []
        self.events: deque[ActionLogged] = deque(maxlen=2000)
        self.log_lines: deque[str] = deque(maxlen=5000)
        self.server_version: str | None = None
        self.probe_wanted = probe
        self.autolaunch = autolaunch and not readonly
        self.busy: str | None = None  # the command in progress ("relaunch", "kill", ...)
        self.changed = asyncio.Event()  # set whenever something worth redrawing happened
        self._listeners = Listeners()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._telemetry_task: asyncio.Task[None] | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._command_task: asyncio.Task[None] | None = None
        # /metrics and the installed server's flags (app.core.measure.metrics, app.core.flags.discovery)
        self.metrics_period_s = 2.0
        self.last_metrics: MetricsRate | None = None
        self.server_flags: ServerFlags | None = None  # None until discovered
        self._metrics_task: asyncio.Task[None] | None = None
        self._tail_task: asyncio.Task[None] | None = None
        self.log_path: str | None = None  # the log the log view follows: the running launch's

    # ---- wiring ----------------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[LifecycleEvent], None]) -> Callable[[], None]:
        """Receive every lifecycle event (and the session's own notes) from now on; returns the unsubscriber."""
        return self._listeners.subscribe(listener)

    def view(self) -> LifecycleView:
        """The server as the lifecycle knows it now, frozen: what the screens (and an A/B) read."""
        return self.lifecycle.view()

    def _note(self, text: str, level: EventLevel = "info") -> None:
        self._on_lifecycle(ActionLogged(text, level))

    def _on_lifecycle(self, event: LifecycleEvent) -> None:
        if isinstance(event, ActionLogged):
            self.events.append(event)
        elif isinstance(event, ConnectionChanged):
            self.connection = event
        elif isinstance(event, StateChanged):
            self._on_state(event.state)
        elif isinstance(event, Launched):  # whoever launched (a key, an A/B arm): this is what runs now
            self.profile = event.profile
            self._follow_server_log(event.record.log_path)
        elif isinstance(event, ServerLogEvent):
            payload = event.event
            if event.replayed:
                pass  # a re-attach replays the log: its old throughput lines are not live figures
            elif isinstance(payload, DecodeStats):
                self.throughput.append(ThroughputPoint(time.time(), payload.gen_tps, "log", payload.accept_len))
            elif isinstance(payload, SpecDecodeStats) and payload.mean_accept_len is not None and self.throughput:
                last = self.throughput[-1]
                self.throughput[-1] = replace(last, accept_len=payload.mean_accept_len)
        self._listeners.emit(event)
        self.changed.set()

    def _on_state(self, state: ServerState) -> None:
        if state == ServerState.READY:
            self._spawn(self._read_version())
            if self.probe_wanted:
                self._start_probe()
            self._start_metrics()
        elif state not in (ServerState.READY,):
            self._stop_probe()
            self._stop_metrics()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def samples_gpus(self) -> bool:
        """Whether this session samples GPUs: not for a profile without GPUs (`gpus = []`, e.g. vLLM on CPU), whose
        host may have no nvidia-smi at all."""
        return bool(self.profile.gpus)

    async def start(self) -> None:
        """Re-attach to a running server of this profile (its flags become the running ones) and sample."""
        if self.samples_gpus:
            self._telemetry_task = asyncio.create_task(self._sample_gpus())
        self._spawn(self._discover_flags())
        record = None
        with contextlib.suppress(Exception):
            attached = await self.lifecycle.attach()
            record = self.lifecycle.record if attached else None
        if record is not None:
            self.profile = replace(self.profile, flags=dict(record.flags))
            self.lifecycle.profile = self.profile
            self.pending_flags = dict(record.flags)
            self._follow_server_log(record.log_path)
            await self._settle_driver(record)
        elif self.autolaunch:
            self._note(f"no server of {self.profile.name} running: launching it")
            self.run_command("launch", self.launch)
        self.changed.set()

    async def _settle_driver(self, record: jobs.JobRecord) -> None:
        """Read-only when someone else drives (unless taking over); watch for someone taking over from us."""
        me = jobs.who_am_i()
        with contextlib.suppress(HostError):
            verdict = await driver.settle_driver(
                self.host, record, me, take_over=self.take_over and not self.readonly, profile=self.profile.name
            )
            self.readonly = self.readonly or verdict.readonly
            if verdict.message:
                self._note(verdict.message, verdict.level)
        if not self.readonly:
            self._spawn(driver.watch_driver(self.host, self.profile.name, me, self._driver_taken))

    def _driver_taken(self, record: jobs.JobRecord) -> None:
        self.readonly = True
        if self.lifecycle.record is not None:  # so our own record writes keep the new driver
            self.lifecycle.record.driver, self.lifecycle.record.driver_since = record.driver, record.driver_since
        self._note(driver.taken_message(record), "warning")

    async def stop(self) -> None:
        """Stop watching and sampling. The server keeps running."""
        for task in [self._telemetry_task, self._probe_task, self._metrics_task, self._command_task, *self._tasks]:
            if task is not None:
                task.cancel()
        await self.lifecycle.close()
        with contextlib.suppress(Exception):
            await self.telemetry.close()

    async def _sample_gpus(self) -> None:
        async with contextlib.aclosing(self.telemetry.stream(self.sample_period_ms)) as snapshots:
            async for snapshot in snapshots:
                self.snapshot = snapshot
                self.changed.set()

    def _follow_server_log(self, path: str) -> None:
        """Keep the log view's lines from this launch's log (one follower at a time)."""
        if self._tail_task is not None:
            self._tail_task.cancel()
        self.log_path = path
        self._tail_task = self._spawn(self._tail_log(path))

    async def _tail_log(self, path: str) -> None:
        self.log_lines.clear()
        async with contextlib.aclosing(self.host.follow(path)) as lines:
            async for line in lines:
                self.log_lines.append(line)

    async def _read_version(self) -> None:
        info = await server_info(await self.host.http_base(self.profile.port), self.profile.backend)
        if info:
            version = info.get("version")
            self.server_version = str(version) if version is not None else None
            self.changed.set()

    # ---- probe -----------------------------------------------------------------------------------
    def set_probe(self, on: bool) -> None:
        """Turn the continuous single-stream probe on or off (it runs only while the server is READY)."""
        self.probe_wanted = on
        if on and self.lifecycle.state == ServerState.READY:
            self._start_probe()
        elif not on:
            self._stop_probe()
        self._note(f"probe {'on' if on else 'off'}")

    def _start_probe(self) -> None:
        if self._probe_task is not None and not self._probe_task.done():
            return

        def on_point(point: ThroughputPoint) -> None:
            self.throughput.append(point)
            self.changed.set()

        def on_error(message: str) -> None:
            connected = self.connection is None or self.connection.state == "connected"
            if self.lifecycle.state == ServerState.READY and connected:  # an outage is said once, not per request
                self._note(f"probe request failed: {message}", "warning")

        async def probe() -> None:
            base = await self.host.http_base(self.profile.port)  # a remote host forwards a local port
            await probe_loop(base, self.profile.model, on_point, on_error)

        self._probe_task = asyncio.create_task(probe())

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
            self.throughput.append(rate.point())  # an idle window is a real 0 tok/s
            self.changed.set()

        self._metrics_task = asyncio.create_task(poll())

    def _stop_metrics(self) -> None:
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            self._metrics_task = None

    async def _discover_flags(self) -> None:
        """Which catalog flags the installed server accepts (the palette offers only those)."""
        found = await discover_flags(self.host, self.profile.backend, self.profile.python, self.profile.module,
                                     launch_env(self.profile))
        self.server_flags = found
        if found.known and found.version:
            self.server_version = self.server_version or found.version
        self.changed.set()

    # ---- pending flags ---------------------------------------------------------------------------
    @property
    def pending_changes(self) -> list[FlagChange]:
        return flag_diff(self.profile.flags, self.pending_flags)

    @property
    def pending_profile(self) -> Profile:
        return replace(self.profile, flags=dict(self.pending_flags))

    def running_argv(self) -> list[str]:
        return launch_argv(self.profile)

    def pending_argv(self) -> list[str]:
        return launch_argv(self.pending_profile)

    def press_toggle(self, toggle: Toggle) -> str:
        """Apply one press of a toggle to the pending flags; returns what changed, for the event log."""
        try:
            self.pending_flags = apply_toggle(self.pending_flags, toggle)
        except FlagError as exc:
            self._note(str(exc), "warning")
            return str(exc)
        self.changed.set()
        return self.describe_pending()

    def set_pending_flag(self, name: str, value: FlagValue | None) -> None:
        self.pending_flags = set_flag(self.pending_flags, name, value)
        self.changed.set()

    def undo_pending(self) -> None:
        self.pending_flags = dict(self.profile.flags)
        self._note("pending changes undone")

    def describe_pending(self) -> str:
        """The pending change for people: toggles first by their names ("steps 1 -> 3", "overlap sched ->
        sched+sbo"), then other flags; flags a toggle derives (draft tokens from steps) are not repeated."""
        running, pending = self.profile.flags, self.pending_flags
        parts: list[str] = []
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

    # ---- commands --------------------------------------------------------------------------------
    def _guard(self, what: str) -> None:
        if self.readonly:
            raise ReadOnlyError(f"read-only session: {what} is disabled")

    def run_command(self, name: str, coro_factory: Callable[[], Coroutine[Any, Any, Any]]) -> bool:
        """Run one command at a time in the background; False when another is still running."""
        self._guard(name)
        if self._command_task is not None and not self._command_task.done():
            self._note(f"{self.busy} still in progress; {name} ignored", "warning")
            return False

        async def runner() -> None:
            self.busy = name
            try:
                await coro_factory()
            except LaunchRefused as refused:
                self._note(str(refused), "error")
            except Exception as exc:  # shown to the user, never swallowed silently
                self._note(f"{name} failed: {exc}", "error")
            finally:
                self.busy = None
                self.changed.set()

        self._command_task = asyncio.create_task(runner())
        return True

    async def launch(self) -> None:
        self._guard("launch")
        self.lifecycle.profile = self.pending_profile
        await self.lifecycle.launch()  # its Launched event makes the profile the running one and follows the log

    async def kill(self) -> None:
        self._guard("kill")
        self._stop_probe()
        await self.lifecycle.kill(confirm_free=True)

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
        self._note(f"relaunch: {change}")
        self.markers.append(RelaunchMarker(time.time(), change))
        state = await self.lifecycle.relaunch(new_profile, ready_timeout_s=ready_timeout_s)
        if state == ServerState.READY:
            parts = ", ".join(f"{k} {v:.1f}s" for k, v in self.lifecycle.phase_times.items())
            self._note(f"relaunched with {change}: {parts}")
        return state

    def _describe(self, old: Profile, new: Profile) -> str:
        changes = flag_diff(old.flags, new.flags)
        return ", ".join(describe_change(c, old.toggles) for c in changes) or "no change"
