"""The server state machine: launch -> ready -> kill -> confirm free -> relaunch, each phase timed.

Over 450 lines: one class whose launch, watch, kill and relaunch share one state; its rules, refusals, events
and the release live beside it (states.py, preflight.py, events.py, release.py).

One ServerLifecycle drives one profile's server on one host. It launches the server detached (it
outlives tunedash), records a job file on the host so a later tunedash re-attaches, follows the log to
move through LAUNCHING -> LOADING -> CAPTURING -> WARMING -> READY, watches the process group so a
death before READY is CRASHED (with the fatal event and the last log lines), kills by process group
(SIGTERM, grace period, SIGKILL) and confirms the GPUs free (FREE, or STUCK with the holders), both
through app.core.server.release; the log events move it by the rule of app.core.server.states.
Listeners receive LifecycleEvents; nothing here knows about a UI.

A custom profile (backend = "custom") is READY when its ready_regex matches a log line; with only a
health_url, when that URL first answers 200 (polled every HEALTH_POLL_S while starting). A profile with no
GPUs (gpus = []) skips the GPU checks: launch does not read the GPUs, confirm-free is FREE at once. A
profile with no port (custom, port unset) skips the port check.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol

from app.core.data import (
    DecodeStats,
    EventLevel,
    FatalEvent,
    GpuSnapshot,
    Holder,
    LogEvent,
    LogLine,
    Notice,
    ServerState,
)
from app.core.errors import Reason
from app.core.flags.discovery import ServerFlags, rejection_message
from app.core.hosts.base import ConnectionChanged, Host, HostError, reach_url
from app.core.hosts.window import LogWindow
from app.core.logs.parser import LogParser
from app.core.profiles.render import health_url, launch_argv, launch_env
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.events import (
    CONNECTION_LEVELS,
    ActionLogged,
    Launched,
    LifecycleEvent,
    LifecycleView,
    Listeners,
    RunStarted,
    ServerLogEvent,
    StateChanged,
)
from app.core.server.health import check_url
from app.core.server.preflight import LaunchRefused, claim_launch, fresh_sample, preflight, refuse_unspawnable
from app.core.server.progress import PhaseTracker
from app.core.server.release import (
    FreeProgress,
    FreeWatch,
    freed_text,
    start_free_watch,
    stuck_text,
    terminate_group,
    wait_free,
)
from app.core.server.states import LIVE_STATES, STARTING_STATES, phase_durations, state_after, telling_fatal
from app.core.server.warm import WeightCacheJob, client_argv, key_change, key_flags, warm_refusal
from app.core.server.warm_state import WarmShare, WarmTracker
from app.core.tasks import TaskOwner
from app.core.telemetry.freecheck import FreeCheck, FreeVerdict
from app.core.telemetry.smi import Telemetry

HEALTH_POLL_S = 0.25  # a custom profile's health_url, while it starts
RECORD_WRITE_WAIT_S = 5.0  # close() waits this long at most for a record write under way (READY, a crash)


class AdoptedServer(Protocol):
    """A server started by hand that this lifecycle watches (app.core.adopt.takeover.Adoption): its in-memory record
    (never saved), why its log is not followed, its liveness, and its one proven kill."""

    record: jobs.JobRecord
    log_note: str

    async def alive(self) -> bool: ...

    async def terminate(self, grace_s: float, say: Callable[[str, EventLevel], None]) -> None: ...


class ServerLifecycle:
    """Launch, watch, kill and confirm-free one profile's server on one host."""

    def __init__(
        self,
        host: Host,
        profile: Profile,
        telemetry: Telemetry,
        *,
        grace_s: float = 15.0,
        free_timeout_s: float = 60.0,
        liveness_period_s: float = 0.2,
    ) -> None:
        self.host = host
        self.profile = profile
        self.telemetry = telemetry
        self.grace_s = grace_s
        self.free_timeout_s = free_timeout_s
        self.liveness_period_s = liveness_period_s
        self.state = ServerState.STOPPED
        self.state_since = time.time()
        self.record: jobs.JobRecord | None = None
        self.notices: list[Notice] = []
        self.fatal: FatalEvent | None = None
        self.last_lines: deque[str] = deque(maxlen=30)
        self.holders: tuple[Holder, ...] = ()
        self.last_free: FreeVerdict | None = None
        self.warm: WarmShare | None = None  # what the weight cache holds while WARM (app.core.server.warm_state)
        self._warm_tracker: WarmTracker | None = None
        self._warm_seen = asyncio.Event()
        self._watch_baseline: dict[str, int] = {}
        self._release_sample: GpuSnapshot | None = None  # the release watch's last sample (preflight.fresh_sample)
        self.last_decode: DecodeStats | None = None
        self.health_ok: bool | None = None
        self.server_flags: ServerFlags | None = None  # what the installed server accepts, once discovered
        self._interrupted_kill: tuple[jobs.JobRecord, float, bool] | None = None  # (record, SIGTERM at, confirm)
        # called right before every signal and launch (the driver lock's check); raises to refuse
        self.before_act: Callable[[str], Awaitable[None]] | None = None
        # with no record of ours: the server started by hand that runs this profile (a Session sets it; docs/adopt.md)
        self.find_adopted: Callable[[], Awaitable[AdoptedServer | None]] | None = None
        self.adopted: AdoptedServer | None = None
        self._marks: dict[str, float] = {}
        self._in_relaunch = False  # launch() inside relaunch(): the run (RunStarted) began with the kill
        self._attached_times: dict[str, float] | None = None  # a re-attached job's recorded phase times
        # A listener or a background task that fails is said in the event log (and the `tunedash` logger).
        self._listeners = Listeners(f"{profile.name} lifecycle", on_failure=lambda text: self._say(text, "error"))
        self._watch_task: asyncio.Task[None] | None = None
        self._state_event = asyncio.Event()
        self._tasks = TaskOwner(f"{profile.name} lifecycle", on_failure=lambda text: self._say(text, "error"))
        self._record_writes: set[asyncio.Task[Any]] = set()  # close() lets these finish (RECORD_WRITE_WAIT_S)
        self._unsubscribe_connection = host.subscribe_connection(self._on_connection)
        # each run's progress and ETA, and its phase times into the history once its store_factory is set
        self.phases = PhaseTracker(None, self._say, self.marks)
        self._listeners.subscribe(self.phases.on_event)

    def _spawn(self, coro: Coroutine[Any, Any, Any], *, writes_record: bool = False) -> None:
        task = self._tasks.spawn(coro)
        if writes_record:
            self._record_writes.add(task)
            task.add_done_callback(self._record_writes.discard)

    # ---- listeners -------------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[LifecycleEvent], None]) -> Callable[[], None]:
        """Receive every event from now on; returns the function that unsubscribes."""
        return self._listeners.subscribe(listener)

    def view(self) -> LifecycleView:
        """What this lifecycle knows now, frozen: the job record is a copy (and phase_times a fresh dict), since the
        lifecycle goes on writing its own (outcome, ready_at, phase times) while a screen or an A/B holds this."""
        return LifecycleView(
            state=self.state, since=self.state_since,
            record=None if self.record is None else self.record.copy(), profile=self.profile,
            phase_times=self.phase_times, notices=tuple(self.notices), fatal=self.fatal,
            last_lines=tuple(self.last_lines), holders=self.holders, health_ok=self.health_ok,
            last_decode=self.last_decode,
        )

    def _emit(self, event: LifecycleEvent) -> None:
        self._listeners.emit(event)

    def _say(self, text: str, level: EventLevel = "info") -> None:
        self._emit(ActionLogged(text, level))

    def _set_state(self, state: ServerState) -> None:
        if state == self.state:
            return
        previous = self.state
        self.state = state
        self.state_since = time.time()
        if self._attached_times is None:  # a replayed log says nothing about how long phases took
            self._marks.setdefault(state.value, time.monotonic())
        self._emit(StateChanged(state, previous, self.state_since))
        self._state_event.set()

    def marks(self) -> dict[str, float]:
        """When each state of the run under way began (time.monotonic(), by state value; "BEGIN": the launch or
        relaunch call, "DAEMON"/"DAEMON_READY": the weight cache daemon's start), a copy: app.core.server.progress."""
        return dict(self._marks)

    async def cache_state(self, profile: Profile) -> str:
        """The weight cache's state for a launch of `profile` now (RunStarted): cold, fill or warm."""
        cache = self.weight_cache(profile)
        if cache is None:
            return "cold"
        try:
            record = await cache.current()
        except HostError:
            return "fill"
        if record is None or key_change(profile.backend, record.flags, key_flags(profile)):
            return "fill"
        return "warm"

    async def _begin_run(self, kind: str, profile: Profile) -> None:
        began = time.monotonic()
        self._marks["BEGIN"] = began
        self._emit(RunStarted(kind, profile, await self.cache_state(profile), began))

    @property
    def phase_times(self) -> dict[str, float]:
        """Seconds per phase of the last launch (start, load, capture, warmup, ready; kill, release)."""
        if self._attached_times is not None:
            return dict(self._attached_times)
        return phase_durations(self._marks)

    # ---- connection (remote hosts) ---------------------------------------------------------------
    def _on_connection(self, event: ConnectionChanged) -> None:
        """Pass the change on, log it, and after a reconnect re-attach to the job from its record."""
        self._emit(event)
        self._say(event.detail, CONNECTION_LEVELS[event.state])
        if event.state == "connected" and event.since is not None:
            self._spawn(self._reattach_after_reconnect())

    async def _reattach_after_reconnect(self) -> None:
        """The record may have changed while we were away (someone relaunched): follow whatever it names now.
        A kill the lost connection interrupted resumes instead."""
        if self._interrupted_kill is not None:
            await self._resume_kill()
            return
        if self.state in (ServerState.KILLING, ServerState.RELEASING):
            return
        with contextlib.suppress(HostError):
            record = await jobs.load_job(self.host, self.profile)
            same = record is not None and self.record is not None and record.pgid == self.record.pgid
            if record is not None and (not same or self._watch_task is None or self._watch_task.done()):
                await self.attach()

    # ---- attach ----------------------------------------------------------------------------------
    async def attach(self) -> bool:
        """Re-attach to this profile's recorded job. True when it is alive and now watched."""
        record = await jobs.load_job(self.host, self.profile, report=self._say)
        if record is None:
            return await self._attach_adopted()
        self.record = record
        check = await jobs.check_job(self.host, record)
        if not check.members:
            self._say(check.refusal or f"recorded server (pid {record.pid}) is not running any more",
                      "warning" if check.refusal else "info")
            self._set_state(ServerState.STOPPED)
            return await self._attach_adopted()
        self._say(f"re-attached to pid {record.pid} (group {record.pgid}) launched by {record.launched_by}")
        self._attached_times = dict(record.phase_times)
        try:  # the lines already there are a replay: its window only (app.core.hosts.window), never the whole log
            window: LogWindow | bool | None = await self.host.read_window(record.log_path)
        except HostError as exc:
            self._say(f"the log of {record.profile} is not followed ({exc}); its state comes from the process "
                      "alone", "warning")
            window = False
        self._set_state(ServerState.LAUNCHING)
        self._start_watch(record, window)
        return True

    async def _attach_adopted(self) -> bool:
        """Watch the server started by hand that runs this profile (find_adopted), as attach watches a job of ours:
        its log (its stdout, when a file) replayed and followed, READY once its health URL answers."""
        adopted = self.adopted
        if adopted is None or not await adopted.alive():
            adopted = await self.find_adopted() if self.find_adopted is not None else None
        if adopted is None:
            return False
        self.adopted, self.record = adopted, adopted.record
        self._attached_times = {}
        window: LogWindow | bool | None = False
        if adopted.record.log_path:
            try:
                window = await self.host.read_window(adopted.record.log_path)
            except HostError as exc:
                adopted.log_note = f"the log {adopted.record.log_path} is not followed ({exc})"
        if adopted.log_note:
            self.notices.append(Notice("warning", adopted.log_note, LogLine(0, "")))
            self._say(adopted.log_note, "warning")
        self._set_state(ServerState.LAUNCHING)
        self._start_watch(adopted.record, window)
        self._spawn(self._adopted_ready(adopted.record))
        return True

    async def _adopted_ready(self, record: jobs.JobRecord) -> None:
        """An adopted server is READY when its health URL answers (its log may say nothing, or be out of sight)."""
        url = health_url(self.profile)
        if not url:
            return
        with contextlib.suppress(HostError):
            url = await reach_url(self.host, url)
        while self.state in STARTING_STATES and self.record is record:
            health = await check_url(url, timeout_s=2.0)
            if health.ok and self.state in STARTING_STATES:
                self.health_ok = True
                self._became_ready(record, confirm=False)
                return
            await asyncio.sleep(HEALTH_POLL_S * 4)

    async def _alive(self, record: jobs.JobRecord) -> bool:
        if self.adopted is not None and record is self.adopted.record:
            return await self.adopted.alive()
        return await jobs.job_alive(self.host, record)

    # ---- launch ----------------------------------------------------------------------------------
    async def preflight(self) -> dict[int, int]:
        """Refuse to launch onto a running job, a taken port or held GPUs, or what the host could not spawn
        (LaunchRefused); the idle baseline."""
        self.refuse_rejected(self.profile)
        if not self._in_relaunch:  # relaunch() asked the host right before its kill
            await refuse_unspawnable(self.host, self.profile)
        cache = self.weight_cache()
        recent = fresh_sample(self._release_sample, self.profile.gpus)
        self._release_sample = None  # one launch's read at most
        try:
            return await preflight(self.host, self.profile, self.telemetry,
                                   own_pids=await cache.pids() if cache else frozenset(), recent=recent)
        except LaunchRefused as exc:
            if cache is None or exc.reason != Reason.GPUS_HELD or not exc.holders:
                raise
            raise await self._foreign_holders(exc) from None

    async def _daemon_holders(self, verdict: FreeVerdict) -> FreeVerdict:
        """The holders that are this profile's weight cache daemon, said so (STUCK names them as ours)."""
        cache = self.weight_cache()
        pids = await cache.pids() if cache is not None else set()
        if not pids:
            return verdict
        holders = tuple(dataclasses.replace(h, owner="this profile's weight cache daemon") if h.pid in pids else h
                        for h in verdict.holders)
        return dataclasses.replace(verdict, holders=holders)

    async def _foreign_holders(self, exc: LaunchRefused) -> LaunchRefused:
        """A warm launch's GPUs held by others: each holder with whose it is; another tunedash session's job (its
        weight cache daemon, say) named as such, with how to stop it."""
        named = await jobs.with_owners(self.host, None, FreeVerdict(False, False, {}, exc.holders))
        foreign = any(h.owner.startswith("another tunedash launch's") for h in named.holders)
        hint = (" (another tunedash session's job holds them, such as its weight cache daemon: stop it from its "
                "own profile, `tunedash kill PROFILE --all`)") if foreign else ""
        text = (f"GPUs of {self.profile.name} on {self.host.name} are not free: "
                f"{'; '.join(h.describe() for h in named.holders)}{hint}")
        self._say(text, "error")
        return LaunchRefused(text, Reason.GPUS_HELD, named.holders)

    def weight_cache(self, profile: Profile | None = None) -> WeightCacheJob | None:
        """The profile's weight cache daemon job when it runs warm (app.core.server.warm), else None."""
        profile = profile or self.profile
        return WeightCacheJob(self.host, profile, self._say) if profile.warm else None

    def refuse_rejected(self, profile: Profile) -> None:
        """LaunchRefused when `profile` sets a flag the installed server rejects (known from discovery:
        `server_flags`); checked before anything is killed or launched."""
        if self.server_flags is None or self.server_flags.backend != profile.backend:
            return
        message = rejection_message(self.server_flags, profile.flags, str(profile.source))
        if message:
            raise LaunchRefused(message, Reason.BAD_INPUT)
        cold = warm_refusal(profile, self.server_flags) if profile.warm else ""
        if cold:
            raise LaunchRefused(cold, Reason.BAD_INPUT)

    async def launch(self) -> jobs.JobRecord:
        """Start the server detached and watch it. Raises LaunchRefused without starting anything."""
        try:
            return await self._launch()
        except BaseException:
            if not self._in_relaunch:
                self.phases.abort()
            raise

    async def _launch(self) -> jobs.JobRecord:
        if not self._in_relaunch:
            for key in ("BEGIN", "DAEMON", "DAEMON_READY", "KILLING", "RELEASING", "FREE", "WARM"):
                self._marks.pop(key, None)
        if self.weight_cache() is None:  # warm mode switched off (`w`): this profile's daemon would hold the GPUs
            await self._stop_daemon_of_cold(self.profile)
        baseline = await self.preflight()
        if self.before_act is not None:  # the driver lock, right before the launch
            await self.before_act("launch")
        profile = self.profile
        if not self._in_relaunch:
            await self._begin_run("launch", profile)
        cache = self.weight_cache()
        if cache is not None:  # the daemon first: kept when its cache key matches, else (re)started; then ready
            if await cache.stop_if_stale(profile):  # its memory must be back before the new daemon loads
                freed = await self.confirm_free(self.record)
                if not freed.confirmed:
                    raise LaunchRefused("GPUs did not come free after stopping the weight cache daemon: "
                                        + stuck_text(freed, 0.0), Reason.GPUS_HELD, freed.holders)
            await cache.ensure(profile, profile.ready_timeout_s, on_start=self._mark_daemon)
            if "DAEMON" in self._marks:
                self._marks["DAEMON_READY"] = time.monotonic()
            profile = self.profile  # the daemon took a while: discovery may have rendered the toggles meanwhile
        argv = client_argv(profile) if cache is not None else launch_argv(profile)
        log_path = jobs.log_path_for(self.host, profile)
        me = jobs.who_am_i()
        now = time.time()
        record = jobs.JobRecord(
            profile=profile.name,
            host=self.host.name,
            backend=profile.backend,
            model=profile.model,
            port=profile.port,
            argv=list(argv),
            flags=dict(profile.flags),
            pid=None,
            pgid=None,
            start_time="",
            log_path=log_path,
            launched_by=me,
            launched_at=now,
            gpus=list(profile.gpus),
            baseline_mib={str(k): v for k, v in baseline.items()},
            profile_file=jobs.profile_file_of(profile),
        )
        await claim_launch(self.host, profile, record)  # the record (its tag, no pid) before the spawn
        self._reset_run()
        self._marks.pop("LAUNCHING", None)
        self._set_state(ServerState.LAUNCHING)
        self._marks["LAUNCHING"] = time.monotonic()
        self.record = record
        try:
            spawned = await self.host.spawn_detached(argv, log_path=log_path, env={**launch_env(profile),
                                                                                    **jobs.tag_env(record)})
        except HostError as exc:  # nothing started: say so, and leave the record as a launch that never ran
            self._set_state(ServerState.STOPPED)
            record.outcome = "killed"
            with contextlib.suppress(HostError, jobs.StaleRecord):
                await jobs.save_job(self.host, record)
            raise LaunchRefused(f"the launch of {profile.name} did not start: {exc}", Reason.START_FAILED) from None
        jobs.fill_spawned(record, spawned)
        await self._save(record, follow=False)
        self._say(f"launched pid {spawned.pid} (group {spawned.pgid}) on {self.host.name}, log {log_path}")
        self._emit(Launched(record, profile))
        self._start_watch(record)
        return record

    async def _stop_daemon_of_cold(self, profile: Profile) -> None:
        """A launch without warm mode stops this profile's running weight cache daemon first (proven ours, as
        every signal is), and waits for its memory, so the launch's GPU check does not find the GPUs held."""
        if profile.backend not in ("sglang", "vllm"):
            return
        daemon = WeightCacheJob(self.host, profile, self._say)
        record = await daemon.current()
        if record is None:
            return
        if self.before_act is not None:  # the driver lock, right before the signal
            await self.before_act("kill")
        self._say("warm mode is off: stopping the weight cache daemon before the launch")
        await daemon.stop(record)
        freed = await self.confirm_free(self.record)
        if not freed.confirmed:
            raise LaunchRefused("GPUs did not come free after stopping the weight cache daemon: "
                                + stuck_text(freed, 0.0), Reason.GPUS_HELD, freed.holders)

    def _mark_daemon(self) -> None:
        self._marks["DAEMON"] = time.monotonic()

    def _reset_run(self) -> None:
        self._attached_times = None
        self.notices = []
        self.fatal = None
        self.last_lines.clear()
        self.holders = ()
        self.health_ok = None
        self.last_decode = None
        for key in ("LAUNCHING", "LOADING", "CAPTURING", "WARMING", "READY", "CRASHED"):
            self._marks.pop(key, None)

    async def wait_ready(self, timeout_s: float | None = None) -> ServerState:
        """Wait until READY, CRASHED or STOPPED (or the timeout); returns the state then."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.state in STARTING_STATES:
            self._state_event.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state_event.wait(), remaining)
        return self.state

    # ---- watching --------------------------------------------------------------------------------
    def _start_watch(self, record: jobs.JobRecord, window: LogWindow | bool | None = None) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
        self._watch_task = self._tasks.spawn(self._watch(record, window), f"watch {record.profile}")

    async def _watch(self, record: jobs.JobRecord, window: LogWindow | bool | None = None) -> None:
        """Follow the log (after replaying `window`, on an attach; False: the log is not followed) and poll the
        group's liveness until it is gone."""
        parser = LogParser(record.backend, ready_regex=self.profile.ready_regex or None)
        follower = self._tasks.spawn(self._follow_log(record, parser, window), f"follow {record.log_path}")
        if self.profile.health_url and not self.profile.ready_regex:
            self._spawn(self._poll_health_ready(record, follower))
        try:
            while True:
                await asyncio.sleep(self.liveness_period_s)
                if self.state in (ServerState.KILLING, ServerState.RELEASING):
                    continue
                try:
                    if not await self._alive(record):  # the leader's stat, not all of /proc
                        break
                except HostError:  # a remote host out of reach says nothing about the server: keep watching
                    continue
            # The group is gone on its own: give the log a moment to deliver its last lines.
            await asyncio.sleep(0.3)
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            for event in parser.flush():
                self._handle_log_event(event, record)
            if self.state in LIVE_STATES:
                current = await self._current_record()
                if current is not None and self._names_another_job(current, record) and \
                        await jobs.job_members(self.host, current):  # relaunched elsewhere: follow the new one
                    self._spawn(self._follow_relaunch(current))
                    return
                if current is not None and not self._names_another_job(current, record) and \
                        current.outcome == "killed":  # another session (a CLI, a dashboard) stopped it
                    self._say(f"the server (pid {record.pid}) was stopped by another session", "warning")
                    self._set_state(ServerState.STOPPED)
                    return
                self._mark_crashed(record)
        finally:
            follower.cancel()

    async def _current_record(self) -> jobs.JobRecord | None:
        try:
            return await jobs.load_job(self.host, self.profile)
        except HostError:
            return None

    @staticmethod
    def _names_another_job(current: jobs.JobRecord, record: jobs.JobRecord | None) -> bool:
        return record is None or (current.pid, current.start_time) != (record.pid, record.start_time)

    async def follow_record(self) -> bool:
        """When the record on the host names another live job than the one watched (someone else launched or
        relaunched this profile), follow it; True when it did. A session that does not drive calls this."""
        if self.state in (ServerState.KILLING, ServerState.RELEASING):
            return False
        current = await self._current_record()
        if current is None or not current.pid or not self._names_another_job(current, self.record):
            return False
        if not await jobs.job_members(self.host, current):
            return False
        await self._follow_relaunch(current)
        return True

    async def _follow_relaunch(self, current: jobs.JobRecord) -> None:
        self._say(f"{current.launched_by or 'someone'} relaunched {self.profile.name}: following pid {current.pid} "
                  f"(group {current.pgid}) instead of the server that was here", "warning")
        await self._adopt()

    async def _adopt(self) -> None:
        """Watch the job the record on the host names now, and tell listeners it is what runs (Launched)."""
        if await self.attach() and self.record is not None:
            self.profile = dataclasses.replace(self.profile, flags=dict(self.record.flags))
            self._emit(Launched(self.record, self.profile))

    def _mark_crashed(self, record: jobs.JobRecord) -> None:
        was = self.state
        self._set_state(ServerState.CRASHED)
        reason = self.fatal.text if self.fatal else "the process group exited"
        when = "while starting" if was in STARTING_STATES else "after it was ready"
        self._say(f"server crashed {when}: {reason}", "error")
        record.outcome = "crashed"
        self._spawn(self._save(record), writes_record=True)

    async def _follow_log(self, record: jobs.JobRecord, parser: LogParser, window: LogWindow | bool | None) -> None:
        """The log's lines through the parser: a re-attach's `window` first (replayed), then from its end on."""
        if window is False:
            return
        offset = None
        if isinstance(window, LogWindow):
            for line in window.head:
                self._replay_line(line, parser, record)
            if window.skipped:
                for event in parser.flush():  # nothing spans the gap between the head and the tail
                    self._handle_log_event(event, record, True)
            for line in window.tail:
                self._replay_line(line, parser, record)
            if record.outcome == "ready":  # its ready line may lie in the part of the log not read
                self._became_ready(record, confirm=False)
            offset = window.end
        async with contextlib.aclosing(self.host.follow(record.log_path, offset=offset)) as lines:
            async for line in lines:
                self.last_lines.append(line)
                for event in parser.feed(line):
                    self._handle_log_event(event, record)

    def _replay_line(self, line: str, parser: LogParser, record: jobs.JobRecord) -> None:
        self.last_lines.append(line)
        for event in parser.feed(line):
            self._handle_log_event(event, record, True)

    def _handle_log_event(self, event: LogEvent, record: jobs.JobRecord, replayed: bool = False) -> None:
        self._emit(ServerLogEvent(event, replayed))
        target = state_after(self.state, event)
        if target == ServerState.READY:
            self._became_ready(record)
        elif target is not None:
            self._advance(target)
        if isinstance(event, Notice):
            self.notices.append(event)
            self._say(event.text, "warning")
        elif isinstance(event, FatalEvent):
            self.fatal = telling_fatal(self.fatal, event)
            self._say(f"fatal: {event.text}", "error")
        elif isinstance(event, DecodeStats):
            self.last_decode = event

    def _advance(self, target: ServerState) -> None:
        if target == ServerState.WARMING and self.state == ServerState.LAUNCHING:
            self._set_state(ServerState.LOADING)  # a warm-up seen first still shows (and times) the loading
        self._set_state(target)

    def _became_ready(self, record: jobs.JobRecord, *, confirm: bool = True) -> None:
        if self.state not in STARTING_STATES:
            return
        self._set_state(ServerState.READY)
        if self._attached_times is not None:  # re-attached: the record already holds this launch's times
            return
        times = self.phase_times
        self._say(f"ready after {times['ready']:.1f} s" if "ready" in times else "ready")
        record.outcome = "ready"
        record.ready_at = time.time()
        record.phase_times = times
        self._spawn(self._confirm_health(record) if confirm else self._save(record), writes_record=True)

    async def _poll_health_ready(self, record: jobs.JobRecord, follower: asyncio.Task[None]) -> None:
        """A custom profile with only a health_url: READY when the URL first answers 200."""
        url = await reach_url(self.host, health_url(self.profile))
        while self.state in STARTING_STATES and not follower.done():
            health = await check_url(url, timeout_s=1.0)
            if health.ok and self.state in STARTING_STATES:
                self.health_ok = True
                self._say(f"{url} answered 200")
                self._became_ready(record, confirm=False)
                return
            await asyncio.sleep(HEALTH_POLL_S)

    async def _confirm_health(self, record: jobs.JobRecord) -> None:
        url = health_url(self.profile)
        if url:
            with contextlib.suppress(HostError):
                url = await reach_url(self.host, url)
            health = await check_url(url)
            self.health_ok = health.ok
            if not health.ok:
                self._say(f"{url} did not confirm ready: {health.status or health.error}", "warning")
        try:
            await self._save(record)
        except HostError as exc:  # the server is READY all the same; only the record does not say so yet
            self._say(f"the job record of {self.profile.name} could not be written ({exc}): `tunedash status` and "
                      "the fleet may not show it READY", "warning")

    async def _save(self, record: jobs.JobRecord, *, follow: bool = True) -> None:
        """Save `record`, a compare-and-swap on its generation (jobs.save_job). When another tunedash wrote a
        newer record meanwhile (a CLI relaunch started another server), it is not overwritten: say so and, with
        `follow`, re-attach to the server that record names. An adopted server's record is never saved."""
        if self.adopted is not None and record is self.adopted.record:
            return
        try:
            await jobs.save_job(self.host, record)
        except jobs.StaleRecord as exc:
            self._say(str(exc), "warning")
            if follow and self.record is record:
                await self._adopt()

    # ---- kill and free ---------------------------------------------------------------------------
    async def kill(self, *, confirm_free: bool = True) -> FreeVerdict | None:
        """SIGTERM the group, wait the grace period, SIGKILL what is left; then confirm the GPUs free."""
        if self.adopted is not None and self.record is self.adopted.record:
            return await self._kill_adopted(self.adopted, confirm_free)
        record = self.record or await jobs.load_job(self.host, self.profile, report=self._say)
        if record is not None:
            self.record = record
        check = await jobs.check_job(self.host, record) if record else None
        members = list(check.members) if check else []
        if (record is None or not members) and self.find_adopted is not None and await self._attach_adopted():
            assert self.adopted is not None  # no record of ours, but a server started by hand runs this profile
            return await self._kill_adopted(self.adopted, confirm_free)
        if record is None or not members:
            self._say(check.refusal if check and check.refusal else "no server of this profile is running")
            if self._watch_task:
                self._watch_task.cancel()
            return await self.confirm_free() if confirm_free else None
        if self.before_act is not None:
            await self.before_act("kill")
        self._marks.pop("KILLING", None)
        self._marks.pop("RELEASING", None)
        self._marks.pop("FREE", None)
        self._marks.pop("WARM", None)
        self._attached_times = None
        self._set_state(ServerState.KILLING)
        # Sample the GPUs from the signal on: the driver frees memory as the ranks exit, often before the
        # whole group is gone, so FREE can follow the group's exit at once instead of starting to look then.
        cache = self.weight_cache() if confirm_free and self.profile.gpus else None
        daemon_pids = await cache.pids() if cache is not None else set()  # WARM is judged from the SIGTERM on
        watch = self._watch_free(record, daemon_pids) if confirm_free and self.profile.gpus else None
        try:
            await terminate_group(self.host, record, self.grace_s, self._say)
        except BaseException as exc:
            if watch is not None:
                await watch.stop()
            if isinstance(exc, HostError):  # the connection went between SIGTERM and SIGKILL
                self._interrupted_kill = (record, time.monotonic(), confirm_free)
                self._say(f"the kill was interrupted ({exc}): the server's state is unknown until {self.host.name} "
                          "is back; the kill then resumes (SIGKILL if the grace has passed)", "error")
            raise
        return await self._finish_kill(record, watch, confirm_free)

    async def _kill_adopted(self, adopted: AdoptedServer, confirm_free: bool) -> FreeVerdict | None:
        """The adopted server's one kill (AdoptedServer.terminate proves it first; a refusal signals nothing and
        leaves it watched). After it the server is gone and this profile has no record until the next launch."""
        record = adopted.record
        if await adopted.alive():
            if self.before_act is not None:
                await self.before_act("kill")
            was = self.state
            self._set_state(ServerState.KILLING)
            watch = self._watch_free(record) if confirm_free and self.profile.gpus else None
            try:
                await adopted.terminate(self.grace_s, self._say)
            except BaseException:
                if watch is not None:
                    await watch.stop()
                self._set_state(was)
                raise
        else:
            self._say(f"the adopted server (pid {record.pid}) is not running any more")
            watch = None
        if self._watch_task:
            self._watch_task.cancel()
        self.adopted, self.record = None, None
        if not confirm_free:
            self._set_state(ServerState.STOPPED)
            return None
        return await self.confirm_free(record, watch=watch)

    async def _resume_kill(self) -> None:
        """After a reconnect: finish a kill the lost connection interrupted, SIGKILL at once if the grace passed."""
        assert self._interrupted_kill is not None
        record, started, confirm_free = self._interrupted_kill
        self._interrupted_kill = None
        left = max(0.0, self.grace_s - (time.monotonic() - started))
        if await jobs.job_alive(self.host, record):
            self._say(f"{self.host.name} is back: resuming the kill of group {record.pgid}"
                      + (" (the grace has passed: SIGKILL)" if left == 0 else f" ({left:.0f} s of grace left)"))
            watch = self._watch_free(record) if confirm_free and self.profile.gpus else None
            try:
                await terminate_group(self.host, record, left, self._say)
            except BaseException:
                if watch is not None:
                    await watch.stop()
                raise
        else:
            self._say(f"{self.host.name} is back: group {record.pgid} is gone; confirming the GPUs free")
            watch = None
        await self._finish_kill(record, watch, confirm_free)

    async def _finish_kill(self, record: jobs.JobRecord, watch: FreeWatch | None,
                           confirm_free: bool) -> FreeVerdict | None:
        """The group is gone: mark the record killed, then confirm the GPUs free (or say STOPPED)."""
        if self._watch_task:
            self._watch_task.cancel()
        record.outcome = "killed"
        await self._save(record, follow=False)
        if not confirm_free:
            self._set_state(ServerState.STOPPED)
            return None
        return await self.confirm_free(record, watch=watch)

    async def confirm_free(
        self,
        record: jobs.JobRecord | None = None,
        timeout_s: float | None = None,
        *,
        watch: FreeWatch | None = None,
    ) -> FreeVerdict:
        """Poll the GPUs until free on two consecutive samples (FREE) or the timeout (STUCK)."""
        timeout = self.free_timeout_s if timeout_s is None else timeout_s
        if not self.profile.gpus:
            self._set_state(ServerState.RELEASING)
            self.holders = ()
            self._set_state(ServerState.FREE)
            self._say("no GPUs in the profile: nothing to confirm")
            return FreeVerdict(True, True, {}, ())
        if watch is None:
            watch = self._watch_free(record)
        self._set_state(ServerState.RELEASING)
        verdict, elapsed = await self._wait_free_or_warm(watch, timeout)
        if self._warm_tracker is not None and self._warm_tracker.share is not None and not verdict.confirmed:
            self.warm = self._warm_tracker.share
            self.holders = ()
            self._set_state(ServerState.WARM)
            self._say(f"WARM: {self.warm.describe()} ({freed_text(verdict, elapsed)})")
            return verdict
        if verdict.confirmed:
            self.holders = ()
            self._set_state(ServerState.FREE)
            self._say(freed_text(verdict, elapsed))
        else:
            verdict = await jobs.with_owners(self.host, record or self.record, verdict)  # whose each holder is
            verdict = await self._daemon_holders(verdict)
            self.holders = verdict.holders
            self._set_state(ServerState.STUCK)
            self._say(stuck_text(verdict, elapsed), "error")
        return verdict

    def _watch_free(self, record: jobs.JobRecord | None, daemon_pids: set[int] | None = None) -> FreeWatch:
        def progress(update: FreeProgress) -> None:
            self._emit(update)

        def sample(verdict: FreeVerdict, snapshot: GpuSnapshot) -> None:  # every sample, at the watch's pace:
            self.last_free = verdict  # WARM's two consecutive ones; the launch's GPU read (fresh_sample)
            self._release_sample = snapshot
            if self._warm_tracker is not None and self._warm_tracker.feed(verdict) is not None:
                self._warm_seen.set()

        baseline = record.baseline_mib if record else {}
        self._warm_tracker = self._new_warm_tracker(daemon_pids, baseline) if daemon_pids else None
        self._warm_seen = asyncio.Event()
        self._watch_baseline = baseline
        return start_free_watch(self.host, self.profile.gpus, self.telemetry, baseline, progress, sample)

    def _new_warm_tracker(self, daemon_pids: set[int], baseline: Mapping[str, int]) -> WarmTracker:
        limit = FreeCheck(tuple(self.profile.gpus), {int(k): v for k, v in baseline.items()}).limit
        return WarmTracker(daemon_pids, limit)

    async def _wait_free_or_warm(self, watch: FreeWatch, timeout_s: float) -> tuple[FreeVerdict, float]:
        """wait_free, or WARM: only the weight cache daemon's pids still hold memory (app.core.server.warm_state)."""
        if self._warm_tracker is None:  # a watch begun without the daemon's pids (confirm free on its own)
            cache = self.weight_cache()
            pids = await cache.pids() if cache is not None else set()
            if not pids:
                return await wait_free(watch, timeout_s)
            self._warm_tracker = self._new_warm_tracker(pids, self._watch_baseline)
            if self.last_free is not None and self._warm_tracker.feed(self.last_free) is not None:
                self._warm_seen.set()
        waits = {asyncio.ensure_future(self._warm_seen.wait()), asyncio.ensure_future(watch.confirmed.wait())}
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED), timeout_s)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            await watch.stop()
        return watch.verdict, time.monotonic() - watch.started

    async def kill_all(self) -> FreeVerdict | None:
        """Kill the server, then stop the weight cache daemon too, and confirm the GPUs free (0 MiB): FREE."""
        await self.kill(confirm_free=False)
        cache = WeightCacheJob(self.host, self.profile, self._say)
        record = await cache.current()
        if record is not None:
            if self.before_act is not None:
                await self.before_act("kill")
            await cache.stop(record)
        else:
            self._say(await cache.refusal() or "no weight cache daemon of this profile is running")
        self.warm = None
        return await self.confirm_free(self.record)

    # ---- relaunch --------------------------------------------------------------------------------
    async def relaunch(self, profile: Profile, *, ready_timeout_s: float | None = None,
                       change: str | None = None) -> ServerState:
        """kill -> confirm free -> launch -> wait ready, with the new profile (flags); `change` is said first."""
        self.refuse_rejected(profile)  # a doomed relaunch keeps the running server
        await refuse_unspawnable(self.host, profile)  # so does one the host could not start (E2BIG, no python)
        if change:
            self._say(f"relaunch: {change}")
        try:
            return await self._relaunch(profile, ready_timeout_s)
        except BaseException:
            self.phases.abort()
            raise

    async def _relaunch(self, profile: Profile, ready_timeout_s: float | None) -> ServerState:
        self._marks.clear()
        await self._begin_run("relaunch", profile)
        verdict = await self.kill(confirm_free=True)
        if verdict is not None and not verdict.confirmed and self.state != ServerState.WARM:
            raise LaunchRefused(
                "GPUs did not come free after the kill: "
                + ("; ".join(h.describe() for h in verdict.holders) or verdict.unreadable),
                Reason.GPUS_HELD,
                verdict.holders,
            )
        self.profile = profile
        kept = {k: v for k, v in self._marks.items() if k in ("BEGIN", "KILLING", "RELEASING", "FREE", "WARM")}
        self._in_relaunch = True
        try:
            await self.launch()
        finally:
            self._in_relaunch = False
        self._marks.update(kept)
        return await self.wait_ready(ready_timeout_s)

    async def close(self) -> None:
        """Stop watching: unsubscribe from the host's connection events and cancel every task (the watch, the
        log follower, a re-attach, a health poll). The server keeps running. A record write still under way
        (READY's outcome, ready time and phase times; a crash) gets up to RECORD_WRITE_WAIT_S to land first:
        `tunedash launch --wait` ends right after READY, and without it the record never said the server was
        ready (the fleet, `status`)."""
        self._unsubscribe_connection()
        await self.phases.close()
        if self._record_writes:
            await asyncio.wait(set(self._record_writes), timeout=RECORD_WRITE_WAIT_S)
        await self._tasks.close()  # errors of the tasks were logged as they ended
        self._watch_task = None
