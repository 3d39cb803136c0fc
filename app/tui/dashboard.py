"""The dashboard screen: one profile's server, its keys, and the widgets that show it.

DashboardScreen is the App's default screen (TunedashApp.get_default_screen, as posting's MainScreen): it owns
the dashboard's keys as its own BINDINGS (the measuring keys b B a h and the advisor key v among them), so a screen
pushed over it (an A/B, a benchmark, the advisor, the history) owns the keys while it is open. Every key that
starts a command goes through the Session's one command slot (app.core.command); `check_action` turns keys off by
state (read-only, a command in progress, no ready server), so the footer dims them and the palette leaves them out,
and on_key says why when one is pressed anyway.

Core events reach the screen as messages on the app's loop (SessionMessage, CommandMessage, posted by the Session's
listeners; they do not bubble: the screen handles them, the App never sees them, so each costs one dispatch, not
two): the event log takes each new line, the footer asks check_action again when the state or the command changes
(`gates`, a reactive). What is drawn only at the tick waits there without a message: a GPU sample (GpuSampled, 4 Hz,
drawn at the 2 Hz tick) in a one-slot mailbox the tick hands to the GPU panel's `snapshot`, and a new throughput
point or marker (ThroughputAdded) as a flag the tick that starts a second reads to let the chart follow the series
before it replots. What only the clock moves (the server panel's times, the header's connection age, the chart's
figures line and replot) moves in whole seconds, so it is recomputed, into reactives that redraw only on change, on
the tick that starts a new second (docs/decisions.md#ui-push-rate).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import platformdirs
from textual import events
from textual.actions import parse as parse_action
from textual.app import ComposeResult, ScreenStackError
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Header

from app.core.command import CommandView
from app.core.data import GpuSnapshot, ServerState, printable
from app.core.flags.catalog import is_tuning_flag
from app.core.hosts.base import ConnectionChanged, HostError
from app.core.profiles.types import Profile
from app.core.server.events import (
    ActionLogged,
    GpuSampled,
    LifecycleEvent,
    LifecycleView,
    StateChanged,
    ThroughputAdded,
)
from app.core.session import ReadOnlyError, Session, WarmRefused
from app.core.telemetry.pagecache import read_page_cache
from app.tui import advisor, bench, tune, tune_slots
from app.tui.adopt_confirm import ask_adopted
from app.tui.commands import untuned_flag_message
from app.tui.progress_view import progress_view
from app.tui.views import (
    NO_GPUS,
    connection_note,
    latest_figures,
    page_cache_line,
    probe_note,
    server_view,
    toggle_rows,
)
from widgets import (
    ConfirmModal,
    DiffScreen,
    EventEntry,
    EventLog,
    FlagsPanel,
    GpuPanel,
    HelpScreen,
    KeyFooter,
    LogViewScreen,
    ServerPanel,
    ThroughputChart,
    ToggleRow,
)

UI_PERIOD_S = 0.5
"""What the clock moves (the server panel's times, the figures line) is recomputed at 2 Hz, and the GPU panel shows
a new sample at most this often; a key does not wait for the tick, its action pushes what it changed at once. Why
2 Hz: docs/decisions.md#ui-push-rate."""
CHART_PERIOD_S = 2.0
"""The chart replots at most every 2 s (why: docs/decisions.md#chart-rate)."""
PAGE_CACHE_PERIOD_S = 60.0
"""How often the Server panel's page-cache line is read again (mincore: ~15 ms a GiB)."""
STALE_PERIOD_FLOOR_S = 0.5
"""The GPU panel marks a row stale after two sample periods, but never under two of these (1 s); why:
docs/decisions.md#ui-push-rate."""
WATCHER_REFUSES = {
    "bench": "a benchmark (b) loads the server and writes the history",
    "ab": "an A/B (a) relaunches the server and writes the history",
    "tune": "a tune (t) relaunches the server and writes the history",
    "tune_slots": "a tune on parallel slots launches servers and writes the history",
    "probe": "the probe (p) loads the server",
    "export_events": "export (x) writes a file",
    "press_toggle": "flag changes",
    "warm": "warm mode (w) starts a weight cache daemon on the next relaunch",
}
"""What a watching dashboard (`--readonly`, or `--watch` until T) refuses, and why: nothing that loads the server,
writes the owner's files or config, or answers a trust prompt (docs/decisions.md#read-only-is-read-only)."""
DRIVER_ONLY = {"relaunch": "relaunch", "kill": "kill", "kill_all": "kill all", "confirm_free": "confirm free"}
"""Keys that signal or launch: refused in every read-only session (one that watches, or one another session drives)."""
COMMANDS = {"relaunch": "relaunch", "confirm_free": "confirm free", "bench": "bench", "ab": "A/B",
            "advise": "advisor", "tune": "tune", "tune_slots": "tune"}
"""Keys that start a command in the Session's one slot: refused (dimmed) while another command runs. The kill is
not here: it cancels the command in progress, then kills."""
NEEDS_READY = {"bench": "a benchmark", "mark_baseline": "the baseline", "advise": "the advisor"}
"""Keys that read the running server: off until it is READY."""
FOOTER_RANK = ("bench", "mark_baseline", "ab", "log", "probe", "diff", "undo", "advise", "history", "confirm_free")
"""The footer's keys after help, quit, relaunch, kill and the toggles, most needed first (see _rank_footer_keys)."""


@dataclass(frozen=True)
class DashboardCommand:
    """One dashboard command as the help screen and the command palette list it."""

    key: str  # the key that runs it now (after keys.toml)
    title: str
    help: str
    action: str  # a Textual action string, e.g. "relaunch" or "press_toggle('s')"


class SessionMessage(Message, bubble=False):
    """A Session event (an event log line, a state change, a connection change), delivered on the app's loop, with
    the GPU snapshot the Session held when it happened (frozen): a connection's loss is shown over the last sample
    from before it, even when the error's own snapshot has replaced it by the time the message is handled."""

    def __init__(self, event: LifecycleEvent, snapshot: GpuSnapshot | None = None) -> None:
        super().__init__()
        self.event = event
        self.snapshot = snapshot


class CommandMessage(Message, bubble=False):
    """The command slot changed: a command began, said how far it is, or ended (None)."""

    def __init__(self, command: CommandView | None) -> None:
        super().__init__()
        self.command = command


POSTED = (ActionLogged, StateChanged, ConnectionChanged)
"""The Session events the screen hears as SessionMessages (GpuSampled and ThroughputAdded wait for the tick)."""


class DashboardScreen(Screen[None]):
    """The dashboard for one profile's server."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "relaunch", "Relaunch", id="relaunch", tooltip="Apply pending flags: kill, free, launch, ready"),
        Binding("k", "kill", "Kill", id="kill",
                tooltip="Kill the server's process group (asks first; cancels the command in progress)"),
        Binding("K", "kill_all", "Kill all", id="kill_all", show=False,
                tooltip="Kill the server and its weight cache daemon (warm profiles): FREE at 0 MiB (asks first)"),
        Binding("f", "confirm_free", "Free?", id="free", tooltip="Confirm the GPUs are back at idle"),
        Binding("w", "warm", "Warm mode", id="warm", show=False,
                tooltip="Warm mode on/off for this session: the next relaunch keeps the weights in the backend's "
                        "weight cache daemon (SGLang 0.5.23+, vLLM 0.32+), so later relaunches skip the disk load"),
        Binding("p", "probe", "Probe", id="probe", tooltip="Probe load on/off (a continuous single stream)"),
        Binding("u", "undo", "Undo", id="undo", tooltip="Undo pending flag changes"),
        Binding("d", "diff", "Diff", id="diff", tooltip="Pending command line against the running one"),
        Binding("l", "log", "Log", id="log", tooltip="Server log (follow, search)"),
        Binding("x", "export_events", "Export", id="export", show=False, tooltip="Save the event log to a file"),
        Binding("T", "take_over", "Take over", id="take_over", show=False,
                tooltip="Drive this server from this read-only dashboard (the one driving it turns read-only)"),
        Binding("question_mark", "help", "Help", id="help", tooltip="Keys"),
        Binding("v", "advise", "Advise", id="advise",
                tooltip="Advisor: flags slower than the best recorded run, features left off (with the evidence)"),
        Binding("b", "bench", "Bench", id="bench", tooltip="Benchmark the running server (the profile's [bench])"),
        Binding("B", "mark_baseline", "Baseline", id="baseline", tooltip="Mark the running config as the baseline"),
        Binding("a", "ab", "A/B", id="ab", tooltip="A/B: baseline (A) vs pending flags (B), relaunching each"),
        Binding("h", "history", "History", id="history", tooltip="Past benchmarks and A/B runs"),
        Binding("t", "tune", "Tune", id="tune", show=False,
                tooltip="Race the profile's [tune] candidates over its request shapes (tunedash tune)"),
        Binding("ctrl+t", "tune_slots", "Tune on parallel slots…", id="tune_slots", show=False,
                tooltip="Tune on parallel slots: asks how many, then races that many candidates at once on disjoint "
                        "GPU sets of the host (tunedash tune --slots N)"),
    ]

    APP_BINDINGS: ClassVar[list[Binding]] = [
        Binding("q", "quit", "Quit", id="quit", tooltip="Quit (the server keeps running)"),
    ]
    """The App's own keys (quit works on every screen), listed with the dashboard's in help and the palette."""

    gates: reactive[tuple[object, ...]] = reactive((), init=False)
    """What check_action's answers depend on (read-only, watching only, probe wanted, a command in progress, READY):
    set on every Session and command message; a change asks the footer and the palette again."""

    def __init__(self, session: Session, *, keymap: dict[str, str], tuning_flags_only: bool = False,
                 back_to_fleet: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.session = session
        self.keymap = keymap  # the App's keys.toml map (filled when it loads): a refusal names the keys as remapped
        self.tuning_flags_only = tuning_flags_only  # `ui --tuning-flags-only` (serve's tabs): catalog.TUNING_FLAGS
        self.fleet = back_to_fleet is not None  # opened from `tunedash fleet`: Escape goes back to it
        self._back_to_fleet = back_to_fleet
        self.baseline: Profile | None = None  # B: the config an A/B compares the pending flags against
        self._connection_state: str | None = None  # the last connection state toasted
        self._log_screen: LogViewScreen | None = None
        self._log_shown = 0
        self._unsubscribe: list[object] = []
        self._gpu_newest: GpuSnapshot | None = None  # the newest GpuSampled's snapshot, until the tick shows it
        self._throughput_grew = False  # a ThroughputAdded since the chart last followed the series (the tick's)
        self._second = -1  # the wall-clock second of the last whole tick (the chart's replot, the ages)

    # ---- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        period_s = max(self.session.sample_period_ms / 1000, STALE_PERIOD_FLOOR_S)
        yield GpuPanel(id="gpus", min_interval_s=UI_PERIOD_S, period_s=period_s, own_timer=False)
        with Horizontal(id="middle"):
            yield ServerPanel(id="server")
            with Vertical(id="right"):
                yield FlagsPanel(id="flags")
                yield ThroughputChart(id="chart", min_interval_s=CHART_PERIOD_S, own_timer=False)
        yield EventLog(id="events")
        yield KeyFooter()

    def on_mount(self) -> None:
        session = self.session
        for toggle in session.profile.toggles:
            self._bindings.bind(toggle.key, f"press_toggle('{toggle.key}')", description=toggle.label)
        if self.fleet:
            self._bindings.bind("escape", "back_to_fleet", description="Fleet")
        self._rank_footer_keys()
        if not session.samples_gpus:
            self.query_one(GpuPanel).show_placeholder(NO_GPUS)
        # the log so far, then each new line as a message (subscribed first: no line falls between the two)
        self._unsubscribe = [session.subscribe(self._on_session_event), session.command.watch(self._on_command)]
        self.query_one(EventLog).extend(EventEntry(e.at, printable(e.text), e.level) for e in session.events)
        if session.snapshot is not None:
            self.query_one(GpuPanel).snapshot = session.snapshot
        self._follow_throughput()
        self.set_interval(UI_PERIOD_S, self._tick)
        self._read_page_cache()
        self.set_interval(PAGE_CACHE_PERIOD_S, self._read_page_cache)
        self.refresh_bindings()

    _page_cache: str | None = None  # the Server panel's page-cache line (page_cache_line), None: no line

    def _read_page_cache(self) -> None:
        """The Server panel's page-cache line, read in a worker (mincore on this machine, one exec over SSH)."""
        async def read() -> None:
            cache = await read_page_cache(self.session.host, self.session.profile.model)
            self._page_cache = page_cache_line(cache)

        self.run_worker(read(), name="page cache", group="page-cache", exclusive=True, exit_on_error=False)

    def on_unmount(self) -> None:
        for unsubscribe in self._unsubscribe:
            if callable(unsubscribe):
                unsubscribe()

    def _rank_footer_keys(self) -> None:
        """Which keys the footer keeps when not all fit (80 columns keeps the first few), and their order; the rest
        are in help (?) and the palette. The toggles come first on screen, help and quit last."""
        toggles = [f"press_toggle('{t.key}')" for t in self.session.profile.toggles]
        footer = self.query_one(KeyFooter)
        footer.importance = ["help", "quit", "relaunch", "kill", *toggles, *FOOTER_RANK]
        footer.order = [*toggles, "relaunch", "kill", *FOOTER_RANK, "help", "quit"]

    # ---- core events, as messages on the app's loop ----------------------------------------------
    def _on_session_event(self, event: LifecycleEvent) -> None:
        """The Session's listener: called inside the core's code, so it only posts (never touches a widget)."""
        if isinstance(event, GpuSampled):
            # the panel draws a sample only at the tick, so the newest waits in a one-slot mailbox the tick empties
            # (a message per sample, 4 Hz, was dispatched twice as often as the panel draws: measured in
            # docs/decisions.md#ui-push-rate); a plain attribute set, on the app's loop, touching no widget
            self._gpu_newest = event.snapshot
        elif isinstance(event, ThroughputAdded):
            # the chart replots only on the tick that starts a second, so the tick follows the series then: a flag
            # set here, on the app's loop, instead of a message per point (docs/decisions.md#ui-push-rate)
            self._throughput_grew = True
        elif isinstance(event, POSTED):
            self.post_message(SessionMessage(event, self.session.snapshot))

    def _on_command(self, command: CommandView | None) -> None:
        self.post_message(CommandMessage(command))

    def on_session_message(self, message: SessionMessage) -> None:
        event = message.event
        if isinstance(event, ActionLogged):
            self.query_one(EventLog).extend([EventEntry(event.at, printable(event.text), event.level)])
        elif isinstance(event, StateChanged):
            life = self.session.view()
            self._push_server(life, int(time.time()))
            self._gate(life)
        elif isinstance(event, ConnectionChanged):
            self._on_connection(event, message.snapshot)
        if not isinstance(event, StateChanged):
            self._gate()  # a note may say the session turned read-only, or drives now

    def on_command_message(self, message: CommandMessage) -> None:
        self._push_header()
        self._gate()

    def _follow_throughput(self) -> None:
        """The chart takes a copy of the series when it grew (ThroughputChart.follow); it replots at the tick."""
        session = self.session
        self.query_one(ThroughputChart).follow(session.throughput, time.time(), session.markers)

    def _on_connection(self, event: ConnectionChanged, before: GpuSnapshot | None) -> None:
        """A toast on each change of a remote host's connection state (the header says the state until it is
        connected again; the event log has the details)."""
        if event.state == self._connection_state:
            return
        first = self._connection_state is None
        self._connection_state = event.state
        if before is not None and before.gpus and self.is_current:
            # the last sample from before a loss: its rows stay, and go stale with their age
            panel = self.query_one(GpuPanel)
            panel.update(before, time.monotonic(), panel.period_s)
        self.refresh_view()
        if first and event.state == "connected":
            return  # the first connection of a session is no news
        severity: SeverityLevel = ("information" if event.state == "connected"
                                   else "error" if event.state == "failed" else "warning")
        self.notify(event.detail or f"connection {event.state}", title=f"{event.host}: connection {event.state}",
                    severity=severity, timeout=6 if event.state == "connected" else 10)

    def _gate(self, life: LifecycleView | None = None) -> None:
        """Ask check_action again (the footer and the palette) when what its answers depend on changed."""
        session = self.session
        state = (life or session.view()).state
        self.gates = (session.readonly, self.watching_only, session.probe_wanted, session.busy,
                      state == ServerState.READY)

    def watch_gates(self) -> None:
        self.refresh_bindings()

    # ---- pushing the clock-driven state to widgets -------------------------------------------------
    def _tick(self) -> None:
        """The 2 Hz clock: the GPU panel's newest sample (or its rows' ages) on every tick; the rest, whose
        figures move in whole seconds (the server panel's ages, the chart's window and replot, the header's
        connection age), only on the tick that starts a new wall-clock second (docs/decisions.md#ui-push-rate)."""
        self.refresh_view(whole=int(time.time()) != self._second)

    def refresh_view(self, whole: bool = True) -> None:
        """Push the Session's newest state to the widgets (the tick, and everything at once after a key)."""
        try:
            self._refresh_view(whole)
        except (NoMatches, ScreenStackError):
            pass  # a tick while the app shuts down, after the dashboard's widgets (or screens) are gone

    def _refresh_view(self, whole: bool) -> None:
        """Recompute what the clock moves into the widgets' reactives, which redraw only when a value differs from
        the last: the server panel's view (its times), the flags panel's rows, the chart's figures line (its 30 s
        window moves), the header; the GPU panel's newest sample and, when told the series grew, the chart's series
        (the mailbox and the flag that the Session's events leave, module docstring)."""
        if not self.is_current:
            self._feed_log_screen()
            return
        with self.app.batch_update():  # one screen update for the tick's changes, the widgets' own ticks included
            panel = self.query_one(GpuPanel)
            if self._gpu_newest is not None:  # the newest GpuSampled since the last tick
                panel.snapshot, self._gpu_newest = self._gpu_newest, None
            panel.tick()  # that sample, else its rows' ages
            if not whole:
                return
            session = self.session
            now_wall = time.time()
            life = session.view()
            # on whole wall-clock seconds: the panel's ages change together, once a second (format_duration)
            self._push_server(life, int(now_wall))
            self.query_one(FlagsPanel).data = tuple(self._toggle_rows())
            chart = self.query_one(ThroughputChart)
            chart.figures = (latest_figures(session.throughput, now_wall, since=life.since)
                             if life.state == ServerState.READY else "")
            # a replot (with the figures) at most once a wall-clock second, when it was sent new points: the
            # server panel's ages change on that tick too, so both land in one screen update
            second = int(now_wall)
            if self._throughput_grew:  # the series or markers grew since the last whole tick
                self._throughput_grew = False
                self._follow_throughput()
            if second != self._second:
                self._second = second
                chart.flush()
            self._push_header(now_wall)

    def _push_server(self, life: LifecycleView, now_s: int) -> None:
        view = server_view(life, self.session.server_version, now_s, self._page_cache)
        progress = progress_view(self.session.launch_progress())  # a launch or relaunch under way: bar and ETA
        if progress is not None:
            view = replace(view, progress=progress)
        self.query_one(ServerPanel).data = (view, now_s)

    def _push_header(self, now_wall: float | None = None) -> None:
        session, app = self.session, self.app
        now_wall = time.time() if now_wall is None else now_wall
        busy = f" · {session.busy}…" if session.busy else ""
        probe = probe_note(session.probe_wanted, session.probe_status)
        base = (f"READ-ONLY{self._driver_note()}{self._take_over_hint()}" if session.readonly
                else session.profile.backend)
        alarm = session.acceptance.alarm  # in words, never in colour only (NO_COLOR)
        accept = f" · {alarm.header()}" if alarm is not None else ""
        scheduler = session.host.scheduler_line()  # a Slurm allocation: its job, node and time left
        sched = f" · {scheduler}" if scheduler else ""
        app.sub_title = f"{base}{accept}{sched}{probe}{busy}{connection_note(session.connection, now_wall)}"

    def push_flags(self) -> None:
        """The Flags panel now (a key or the advisor changed the pending flags)."""
        try:
            self.query_one(FlagsPanel).data = tuple(self._toggle_rows())
        except NoMatches:
            pass

    def _toggle_rows(self) -> list[ToggleRow]:
        return toggle_rows(self.session.profile, self.session.pending_flags)

    def _feed_log_screen(self) -> None:
        if self._log_screen is None or self.app.screen is not self._log_screen:
            return
        lines = list(self.session.log_lines)
        if len(lines) > self._log_shown:
            self._log_screen.add_lines([printable(line) for line in lines[self._log_shown:]])
            self._log_shown = len(lines)

    # ---- what may run now ----------------------------------------------------------------------
    def key_of(self, binding_id: str, default: str) -> str:
        """The key a command has now (keys.toml), for the words a refusal says."""
        return self.keymap.get(binding_id, default)

    @property
    def watching_only(self) -> bool:
        """Whoever sits at this dashboard only watches: opened with --readonly, or with --watch (a `serve` tab) while
        it does not drive. Nothing that loads the server, writes the owner's files or config, or trusts a host key."""
        session = self.session
        return session.watch_only or (session.watching and session.readonly)

    def _driver_note(self) -> str:
        """" · alice@gpubox drives" in a read-only header; " · nobody drives" for a dashboard opened with --watch
        (a `serve` tab) while the lock is free."""
        session = self.session
        if session.driven_by:
            return f" · {printable(session.driven_by)} drives"
        return " · nobody drives" if session.watching else ""

    def _take_over_hint(self) -> str:
        """" · T takes over" while this read-only dashboard may take the driver lock (not with --readonly)."""
        return f" · {self.key_of('take_over', 'T')} takes over" if self.session.can_take_over else ""

    def _how_to_drive(self) -> str:
        """"; T takes over", or how to drive a dashboard opened with --readonly."""
        if self.session.watch_only:
            return "; opened with --readonly: drive from a dashboard opened without it"
        return self._take_over_hint().replace(" · ", "; ", 1)

    def busy_refusal(self, action: str) -> str | None:
        """Why `action` may not start while the command slot holds another command, with the keys that end it."""
        name = COMMANDS.get(action)
        text = self.session.command_refusal(name) if name is not None else None
        if text is None:
            return None
        return f"{text}; {self.key_of('kill', 'k')} cancels it and kills the server"

    def refusal_for_key(self, key: str) -> str | None:
        """For a screen over the dashboard while a command runs: why this dashboard key would not start another one
        now (None for a key that starts no command, or when none runs)."""
        for command in self.dashboard_commands():
            if command.key == key:
                return self.busy_refusal(parse_action(command.action)[1])
        return None

    def refusal(self, action: str, parameters: tuple[object, ...] = ()) -> str | None:
        """Why this dashboard refuses `action` now (its toast), or None when it may run: check_action's one rule."""
        session = self.session
        if action in DRIVER_ONLY and session.readonly:
            return f"read-only session: {DRIVER_ONLY[action]} is disabled{self._how_to_drive()}"
        if action == "probe" and session.probe_wanted:
            return None  # turning the probe off never loads anything
        if action in WATCHER_REFUSES and self.watching_only:
            return f"read-only: {WATCHER_REFUSES[action]}, so it is off here{self._how_to_drive()}"
        if action == "ab" and session.readonly:
            return f"read-only session: A/B relaunches the server, so it is disabled{self._how_to_drive()}"
        if action in ("tune", "tune_slots") and session.readonly:
            return f"read-only session: a tune relaunches the server, so it is disabled{self._how_to_drive()}"
        if action == "press_toggle" and parameters and self.tuning_flags_only:
            toggle = session.profile.toggle(str(parameters[0]))
            for flag in toggle.flags if toggle is not None else ():
                if not is_tuning_flag(session.profile.backend, flag):
                    return untuned_flag_message(flag)
        busy = self.busy_refusal(action)
        if busy:
            return busy
        if action in NEEDS_READY:
            state = session.view().state
            if state != ServerState.READY:
                return (f"{NEEDS_READY[action]} needs a ready server (now {state.value}); "
                        f"{self.key_of('relaunch', 'r')} launches it")
        return None

    def flag_refusal(self, name: str) -> str | None:
        """Why the palette (or the advisor) may not change flag `name` here, or None (FlagEditor)."""
        if self.watching_only:
            return self.refusal("press_toggle", ())
        if self.tuning_flags_only and not is_tuning_flag(self.session.profile.backend, name):
            return untuned_flag_message(name)
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Textual asks before a key, a click or the palette runs an action, and when it draws the footer: a refused
        action shows dimmed there and does not run (on_key says why)."""
        return None if self.refusal(action, parameters) else True

    def on_key(self, event: events.Key) -> None:
        """A key of this dashboard that check_action turned off: say why (Textual itself ignores it silently)."""
        active = self.active_bindings.get(event.key)
        if active is None or active.enabled or active.node is not self:
            return
        _, action, parameters = parse_action(active.binding.action)
        text = self.refusal(action, parameters)
        if text:
            self.notify(text, severity="warning")

    def _refuse(self, text: str) -> None:
        """The toast of a key that needs the driver in a read-only dashboard, with the take-over key."""
        self.notify(f"{text}{self._how_to_drive()}", severity="warning")

    def _refresh_soon(self) -> None:
        """Push the state once a command started by a key has taken its first steps, not at the next tick.

        run_command starts the command as a task; a callback scheduled after it runs after the task's first
        step (asyncio runs ready callbacks in order), when the command's first event log line is set."""
        asyncio.get_running_loop().call_soon(self.refresh_view)

    def command(self, name: str, factory: object) -> None:
        """Start a command in the Session's slot; a refusal is toasted (the slot's, or a read-only session's)."""
        try:
            started = self.session.run_command(name, factory)  # type: ignore[arg-type]
        except ReadOnlyError as exc:
            self._refuse(str(exc))
        else:
            if started is None:
                refused = self.session.command_refusal(name)
                if refused:
                    self.notify(f"{refused}; {self.key_of('kill', 'k')} cancels it and kills the server",
                                severity="warning")
        self._refresh_soon()

    # ---- actions ---------------------------------------------------------------------------------
    def action_press_toggle(self, key: str) -> None:
        toggle = self.session.profile.toggle(key)
        if toggle is None:
            return
        text = self.session.press_toggle(toggle)
        self.push_flags()  # only what the key changed; the rest comes with the next tick
        # The toast after the frame that shows the new value: mounting it costs a layout pass, which the
        # key's own change need not wait for.
        self.call_after_refresh(self.notify, f"pending: {text}", timeout=2)

    def on_flags_panel_toggle_requested(self, message: FlagsPanel.ToggleRequested) -> None:
        """A click on a flag row does what pressing its key does (and is refused as the key is)."""
        text = self.refusal("press_toggle", (message.key,))
        if text:
            self.notify(text, severity="warning")
            return
        self.action_press_toggle(message.key)

    def on_gpu_panel_selected(self, message: GpuPanel.Selected) -> None:
        """A click on a GPU row selects it: the panel highlights that row."""
        self.query_one(GpuPanel).select(message.uuid)

    def action_relaunch(self) -> None:
        adopted = self.session.adopted
        if adopted is not None and not adopted.confirmed:  # a server started by hand: ask once (adopt_confirm)
            ask_adopted(self.app, adopted, "relaunch", self.action_relaunch)
            return
        life = self.session.view()
        if life.state in (ServerState.STOPPED, ServerState.FREE, ServerState.CRASHED,
                          ServerState.STUCK) and life.record is None:
            self.command("launch", self.session.launch)
            return
        self.command("relaunch", self.session.relaunch)

    def action_kill(self) -> None:
        """Ask, then kill: the slot cancels the command in progress (an A/B, a relaunch) before the kill."""
        session = self.session
        adopted = session.adopted
        if adopted is not None and not adopted.confirmed:  # its question replaces the kill's
            ask_adopted(self.app, adopted, "kill", lambda: self.command("kill", self.session.kill))
            return
        record = session.view().record
        detail = session.host.kill_text(record.pgid) if record and record.pgid is not None else ""
        if session.busy:
            detail = f"{detail} The {session.busy} in progress is cancelled first.".strip()

        def answered(yes: bool | None) -> None:
            if yes:
                self.command("kill", self.session.kill)

        self.app.push_screen(ConfirmModal("Kill the server?", detail, yes_label="Kill"), answered)

    def action_kill_all(self) -> None:
        """Ask, then kill the server and its weight cache daemon (a warm profile): the GPUs end at 0 MiB."""
        adopted = self.session.adopted
        if adopted is not None and not adopted.confirmed:  # a server started by hand: its question first
            ask_adopted(self.app, adopted, "kill", lambda: self.command("kill all", self.session.kill_all))
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.command("kill all", self.session.kill_all)

        self.app.push_screen(ConfirmModal("Kill the server and the weight cache daemon?",
                                          "The GPUs then hold nothing: the next launch loads the weights from disk.",
                                          yes_label="Kill all"), answered)

    def action_warm(self) -> None:
        """Warm mode on/off from the next relaunch; says why not where discovery found no weight cache."""
        try:
            text = self.session.toggle_warm()
        except WarmRefused as exc:
            self.notify(f"warm mode unavailable: {exc}", severity="warning", timeout=6)
            return
        except ReadOnlyError as exc:
            self._refuse(str(exc))
            return
        self.notify(text, timeout=4)
        self.refresh_view()

    def action_confirm_free(self) -> None:
        self.command("confirm free", self.session.confirm_free)

    def action_probe(self) -> None:
        self.session.set_probe(not self.session.probe_wanted)
        self.refresh_view()

    def action_undo(self) -> None:
        self.session.undo_pending()
        self.refresh_view()

    def action_diff(self) -> None:
        # the argv as words to read: a value's control characters written out (app.core.data.printable)
        self.app.push_screen(DiffScreen([printable(word) for word in self.session.running_argv()],
                                        [printable(word) for word in self.session.pending_argv()]))

    def action_log(self) -> None:
        self._log_screen = LogViewScreen([printable(line) for line in self.session.log_lines], title="server log")
        self._log_shown = len(self.session.log_lines)
        self.app.push_screen(self._log_screen)

    def action_bench(self) -> None:
        bench.start_bench(self)

    def action_mark_baseline(self) -> None:
        self.baseline = self.session.profile
        self.notify("baseline = the running config; change flags, then press "
                    f"{self.key_of('ab', 'a')} to A/B against it", timeout=3)

    def action_ab(self) -> None:
        bench.start_ab(self)

    def action_history(self) -> None:
        bench.open_history(self)

    def action_tune(self) -> None:
        tune.start_tune(self)

    def action_tune_slots(self) -> None:
        tune_slots.ask_slots(self)

    def action_advise(self) -> None:
        self.run_worker(advisor.advise(self), name="advise", exit_on_error=False)

    def action_back_to_fleet(self) -> None:
        """Escape in a dashboard opened from the fleet: end the app and let the fleet show again."""
        if self._back_to_fleet is not None:
            self._back_to_fleet()

    def dashboard_commands(self) -> Iterator[DashboardCommand]:
        """The profile's toggles, then every binding with an id (this screen's, then the app's), keys as remapped."""
        for t in self.session.profile.toggles:
            yield DashboardCommand(t.key, f"Toggle {t.label}", t.help or " ".join(t.flags), f"press_toggle('{t.key}')")
        seen: set[str] = set()
        for binding in [*self.BINDINGS, *self.APP_BINDINGS]:
            if isinstance(binding, Binding) and binding.id and binding.id not in seen:
                seen.add(binding.id)
                key = self.keymap.get(binding.id, binding.key)
                yield DashboardCommand(key, binding.description, binding.tooltip or binding.description,
                                       binding.action)
        if self.fleet:
            yield DashboardCommand("escape", "Fleet", "back to the fleet (the server keeps running)", "back_to_fleet")

    def action_help(self) -> None:
        """Every key as the footer writes it ("?", "^p"), the ones the footer had no room for marked."""
        left_out = set(self.query_one(KeyFooter).left_out)
        keys = []
        for c in self.dashboard_commands():
            text = c.help if c.help.lower().startswith(c.title.lower()) else f"{c.title}: {c.help}"
            key = self.app.get_key_display(Binding(c.key, c.action))
            keys.append((f"{key} ·" if c.action in left_out else key, text))
        keys.append((self.app.get_key_display(Binding("ctrl+p", "command_palette")),
                     "command palette: every command above, Textual's Theme (kept for the next start), any flag"))
        self.app.push_screen(HelpScreen(keys, note="keys marked · have no room in the footer" if left_out else ""))

    def action_export_events(self) -> None:
        target = Path(platformdirs.user_state_dir("tunedash")) / f"events-{time.strftime('%Y%m%d-%H%M%S')}.log"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.query_one(EventLog).export_text())
        self.notify(f"event log saved to {target}")

    def action_take_over(self) -> None:
        """Drive the server from this read-only dashboard: asks first when another session drives it."""
        session = self.session
        if not session.can_take_over:
            text = ("read-only session (--readonly): take-over is disabled" if session.watch_only
                    else f"this dashboard already drives {session.profile.name}")
            self.notify(text, severity="warning" if session.watch_only else "information")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._take_over(), name="take over", exit_on_error=False)

        if session.driven_by is None:
            answered(True)
            return
        self.app.push_screen(ConfirmModal(f"Take over {session.profile.name}?",
                                          f"{printable(session.driven_by)} drives it now; their dashboard turns "
                                          "read-only.", yes_label="Take over"), answered)

    async def _take_over(self) -> None:
        try:
            text = await self.session.take_over_now()
        except (HostError, OSError) as exc:
            self.notify(f"take-over failed: {exc}", severity="error")
            return
        self.notify(text, severity="warning" if self.session.readonly else "information")
        self.refresh_view()
