"""The Textual dashboard: one screen for the tuning loop, wired to a core Session.

`create_app(profile, ...)` is the one factory the CLI and the tests use. The app reads the Session's
state at 2 Hz inside batch_update and pushes plain data to the widgets; keys call Session commands,
which run in the background (one at a time). Quitting never touches the server.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar, Literal

import platformdirs
from textual import events
from textual.actions import parse as parse_action
from textual.app import App, ComposeResult, ScreenStackError, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Header

from app.core.data import ConnectionState, ServerState, printable
from app.core.flags.catalog import is_tuning_flag
from app.core.hosts.base import ConnectionChanged, Host, HostError
from app.core.profiles.types import Profile
from app.core.server.events import ActionLogged, LifecycleEvent
from app.core.session import ReadOnlyError, Session
from app.core.telemetry.pagecache import read_page_cache
from app.tui.adopt_confirm import ask_adopted
from app.tui.advisor import AdvisorKeys
from app.tui.commands import FlagCommands, untuned_flag_message
from app.tui.sigterm import exit_on_sigterm
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
    ServerView,
    ThroughputChart,
    ToggleRow,
)

UI_PERIOD_S = 0.5
PAGE_CACHE_PERIOD_S = 60.0  # how often the Server panel's page-cache line is read again (mincore: ~15 ms a GiB)
"""The UI pushes the Session's state at 2 Hz; a key does not wait for the tick, its action pushes what it changed
at once (see _refresh_soon). Why 2 Hz: docs/decisions.md#ui-push-rate."""
CHART_PERIOD_S = 2.0
"""The chart replots at most every 2 s (why: docs/decisions.md#chart-rate)."""
STALE_PERIOD_FLOOR_S = 0.5
"""The GPU panel marks a row stale after two sample periods, but never under two of these (1 s); why:
docs/decisions.md#ui-push-rate."""
KEYMAP_FILE = Path(platformdirs.user_config_dir("tunedash")) / "keys.toml"
THEME_FILE = Path(platformdirs.user_config_dir("tunedash")) / "theme.toml"
"""The theme chosen in the palette (Textual's "Theme" command), kept for the next start: `theme = "nord"`."""
WATCHER_REFUSES = {
    "bench": "a benchmark (b) loads the server and writes the history",
    "ab": "an A/B (a) relaunches the server and writes the history",
    "probe": "the probe (p) loads the server",
    "export_events": "export (x) writes a file",
    "press_toggle": "flag changes",
}
"""What a watching dashboard (`--readonly`, or `--watch` until T) refuses, and why: nothing that loads the server,
writes the owner's files or config, or answers a trust prompt (docs/decisions.md#read-only-is-read-only)."""
DRIVER_ONLY = {"relaunch": "relaunch", "kill": "kill", "confirm_free": "confirm free"}
"""Keys that signal or launch: refused in every read-only session (one that watches, or one another session drives)."""
FOOTER_RANK = ("bench", "mark_baseline", "ab", "log", "probe", "diff", "undo", "advise", "history", "confirm_free")
"""The footer's keys after help, quit, relaunch, kill and the toggles, most needed first (see _rank_footer_keys)."""


@dataclass(frozen=True)
class DashboardCommand:
    """One dashboard command as the help screen and the command palette list it."""

    key: str  # the key that runs it now (after keys.toml)
    title: str
    help: str
    action: str  # a Textual action string, e.g. "relaunch" or "press_toggle('s')"


class TunedashApp(AdvisorKeys):  # the advisor key v (app/tui/advisor.py) over the measuring keys b B a h
    """The dashboard for one profile's server."""

    CSS_PATH = "dashboard.tcss"
    TITLE = "tunedash"
    COMMANDS = App.COMMANDS | {FlagCommands}
    VERTICAL_BREAKPOINTS = [(0, "-compact"), (32, "-roomy")]  # noqa: RUF012 - Textual declares it an instance variable
    """Under 32 rows the screen gets class -compact (dashboard.tcss gives the chart more room); Textual
    re-applies it on every resize, including a tmux client of another size attaching."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "relaunch", "Relaunch", id="relaunch", tooltip="Apply pending flags: kill, free, launch, ready"),
        Binding("k", "kill", "Kill", id="kill", tooltip="Kill the server's process group (asks first)"),
        Binding("f", "confirm_free", "Free?", id="free", tooltip="Confirm the GPUs are back at idle"),
        Binding("p", "probe", "Probe", id="probe", tooltip="Probe load on/off (a continuous single stream)"),
        Binding("u", "undo", "Undo", id="undo", tooltip="Undo pending flag changes"),
        Binding("d", "diff", "Diff", id="diff", tooltip="Pending command line against the running one"),
        Binding("l", "log", "Log", id="log", tooltip="Server log (follow, search)"),
        Binding("x", "export_events", "Export", id="export", show=False, tooltip="Save the event log to a file"),
        Binding("T", "take_over", "Take over", id="take_over", show=False,
                tooltip="Drive this server from this read-only dashboard (the one driving it turns read-only)"),
        Binding("question_mark", "help", "Help", id="help", tooltip="Keys"),
        Binding("q", "quit", "Quit", id="quit", tooltip="Quit (the server keeps running)"),
    ]

    def __init__(self, session: Session, *, keymap_file: Path | None = KEYMAP_FILE, fleet: bool = False,
                 theme_file: Path | None = None, tuning_flags_only: bool = False) -> None:
        super().__init__()
        self.tuning_flags_only = tuning_flags_only  # `ui --tuning-flags-only` (serve's tabs): catalog.TUNING_FLAGS
        self.theme_file = theme_file  # None: the default theme, and a theme chosen is not kept
        self.fleet = fleet  # opened from `tunedash fleet`: Escape goes back to it (app/tui/fleet.py)
        self.back_to_fleet = False  # set when Escape ended the app, so the fleet shows again
        self.session = session
        self.keymap_file = keymap_file
        self._pushed_snapshot: object = None  # what was last pushed to the widgets (see _refresh_view)
        self._chart_key: object = None
        self._pushed_server: object = None  # the (ServerView, now) and toggle rows last pushed: unchanged, not pushed
        self._pushed_rows: list[ToggleRow] | None = None
        self._figures_key: object = None
        self._figures = ""
        self._last_event: ActionLogged | None = None
        self._connection_state: ConnectionState | None = None  # the last connection state toasted
        self._log_screen: LogViewScreen | None = None
        self._log_shown = 0
        self._keymap: dict[str, str] = {}
        self._refusing: object = None  # what check_action's answers depend on, when the footer last asked
        self._forget_sigterm = lambda: None  # on_mount: SIGTERM quits as `q` does (the driver lock given back)

    # ---- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield GpuPanel(id="gpus")
        with Horizontal(id="middle"):
            yield ServerPanel(id="server")
            with Vertical(id="right"):
                yield FlagsPanel(id="flags")
                yield ThroughputChart(id="chart", min_interval_s=CHART_PERIOD_S, own_timer=False)
        yield EventLog(id="events")
        yield KeyFooter()

    def on_mount(self) -> None:
        self._forget_sigterm = exit_on_sigterm(self)
        profile = self.session.profile
        self.title = f"tunedash · {profile.name} on {profile.host}"
        self.sub_title = "READ-ONLY" if self.session.readonly else profile.backend
        for toggle in profile.toggles:
            self.bind(toggle.key, f"press_toggle('{toggle.key}')", description=toggle.label)
        self._rank_footer_keys()
        self._load_keymap()
        self._load_theme()
        if self.fleet:
            self.bind("escape", "back_to_fleet", description="Fleet")
        if not self.session.samples_gpus:
            self.query_one(GpuPanel).show_placeholder(NO_GPUS)
        self.session.subscribe(self._on_session_event)
        self.run_worker(self.session.start(), name="session start", exit_on_error=False)
        self.set_interval(UI_PERIOD_S, self.refresh_view)
        self._read_page_cache()
        self.set_interval(PAGE_CACHE_PERIOD_S, self._read_page_cache)

    _page_cache: str | None = None  # the Server panel's page-cache line (page_cache_line), None: no line

    def _read_page_cache(self) -> None:
        """The Server panel's page-cache line, read in a worker (mincore on this machine, one exec over SSH)."""
        async def read() -> None:
            cache = await read_page_cache(self.session.host, self.session.profile.model)
            self._page_cache = page_cache_line(cache)

        self.run_worker(read(), name="page cache", group="page-cache", exclusive=True, exit_on_error=False)

    def _rank_footer_keys(self) -> None:
        """Which keys the footer keeps when not all fit (80 columns keeps the first few), and their order; the rest
        are in help (?) and the palette. The toggles come first on screen, help and quit last."""
        toggles = [f"press_toggle('{t.key}')" for t in self.session.profile.toggles]
        footer = self.query_one(KeyFooter)
        footer.importance = ["help", "quit", "relaunch", "kill", *toggles, *FOOTER_RANK]
        footer.order = [*toggles, "relaunch", "kill", *FOOTER_RANK, "help", "quit"]

    def _load_theme(self) -> None:
        """The theme kept from the last start (THEME_FILE), then keep each one chosen in the palette."""
        if self.theme_file is None:
            return
        try:
            if self.theme_file.exists():
                name = tomllib.loads(self.theme_file.read_text()).get("theme")
                if not isinstance(name, str) or name not in self.available_themes:
                    raise ValueError(f"unknown theme {name!r}; ctrl+p, Theme lists them (choosing one rewrites "
                                     "this file)")
                self.theme = name
        except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
            self.notify(f"{self.theme_file}: {exc}", title="theme ignored", severity="warning")
        self.theme_changed_signal.subscribe(self, self._save_theme)

    def _save_theme(self, theme: object) -> None:
        name = getattr(theme, "name", None)
        if self.theme_file is None or not isinstance(name, str):
            return
        if self.watching_only:
            self.notify(f"{name} for this dashboard only: a read-only dashboard does not write {self.theme_file}",
                        title="theme not kept", timeout=4)
            return
        try:
            self.theme_file.parent.mkdir(parents=True, exist_ok=True)
            self.theme_file.write_text(f'theme = "{name}"  # written by tunedash when a theme is chosen\n')
        except OSError as exc:
            self.notify(f"{self.theme_file}: {exc}", title="theme not kept", severity="warning")

    def _load_keymap(self) -> None:
        """Remap keys from keys.toml: `[keys]` with binding id = key, e.g. relaunch = "R"."""
        if self.keymap_file is None or not self.keymap_file.exists():
            return
        try:
            data = tomllib.loads(self.keymap_file.read_text())
            keys = data.get("keys", {})
            if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
                raise ValueError("[keys] must map binding ids to key names")
            self._keymap = {str(k): str(v) for k, v in keys.items()}
            self.set_keymap(self._keymap)
        except (OSError, ValueError) as exc:
            self.notify(f"{self.keymap_file}: {exc}", title="key map ignored", severity="warning")

    # ---- pushing state to widgets ----------------------------------------------------------------
    def refresh_view(self) -> None:
        """Push the Session's newest state to the widgets (the 2 Hz timer, and after a key)."""
        try:
            self._refresh_view()
        except (NoMatches, ScreenStackError):
            pass  # a tick while the app shuts down, after the dashboard's widgets (or screens) are gone

    def _refresh_view(self) -> None:
        """Push only what changed since the last push: a new GPU snapshot (else just the rows' ages), the
        chart's series when its length, newest point or markers changed, the chart's figures line when the
        series or the state changed or once a second (its 30 s window moves), and the new events (found
        from the newest end back to the last one shown). Widgets diff their own cells; nothing here copies
        the 4000-point series unless it changed."""
        if self.screen is not self.screen_stack[0]:
            self._feed_log_screen()
            return
        session = self.session
        now_wall = time.time()
        with self.batch_update():
            gpus = self.query_one(GpuPanel)
            period_s = max(session.sample_period_ms / 1000, STALE_PERIOD_FLOOR_S)
            if session.snapshot is not None and session.snapshot is not self._pushed_snapshot:
                self._pushed_snapshot = session.snapshot
                gpus.update(session.snapshot, time.monotonic(), period_s)
            else:
                gpus.set_ages(time.monotonic(), period_s)
            # on whole wall-clock seconds: the panel's ages change together, once a second (format_duration)
            server = (self._server_view(int(now_wall)), int(now_wall))
            if server != self._pushed_server:
                self._pushed_server = server
                self.query_one(ServerPanel).update(*server)
            rows = self._toggle_rows()
            if rows != self._pushed_rows:
                self._pushed_rows = rows
                self.query_one(FlagsPanel).update(rows)
            self._push_chart(now_wall)
            self._push_events()
            busy = f" · {session.busy}…" if session.busy else ""
            probe = probe_note(session.probe_wanted, session.probe_status)
            base = (f"READ-ONLY{self._driver_note()}{self._take_over_hint()}" if session.readonly
                    else session.profile.backend)
            alarm = session.acceptance.alarm  # in words, never in colour only (NO_COLOR)
            accept = f" · {alarm.header()}" if alarm is not None else ""
            self.sub_title = f"{base}{accept}{probe}{busy}{connection_note(session.connection, now_wall)}"
            refusing = (session.readonly, self.watching_only, session.probe_wanted)
            if refusing != self._refusing:  # driving or watching changed: the footer asks check_action again
                self._refusing = refusing
                self.refresh_bindings()

    # ---- core events ---------------------------------------------------------------------------
    def _on_session_event(self, event: LifecycleEvent) -> None:
        """The Session's listener: a toast on each change of a remote host's connection state (the header
        says the state until it is connected again; the event log has the details)."""
        if not isinstance(event, ConnectionChanged) or event.state == self._connection_state:
            return
        first = self._connection_state is None
        self._connection_state = event.state
        if first and event.state == "connected":
            return  # the first connection of a session is no news
        severity: Literal["information", "warning", "error"] = (
            "information" if event.state == "connected" else "error" if event.state == "failed" else "warning")
        self.notify(event.detail or f"connection {event.state}", title=f"{event.host}: connection {event.state}",
                    severity=severity, timeout=6 if event.state == "connected" else 10)
        self.refresh_view()

    def _push_chart(self, now_wall: float) -> None:
        session = self.session
        points, markers = session.throughput, session.markers
        key = (len(points), points[-1] if points else None, len(markers), markers[-1] if markers else None)
        chart = self.query_one(ThroughputChart)
        if key != self._chart_key:
            self._chart_key = key
            chart.update(list(points), now_wall, list(markers), version=key)
        # The chart's redraws (a replot and the figures line) happen together every CHART_PERIOD_S, in the first tick
        # of a wall-clock second, where the server panel's ages change too: one screen update carries them all
        # (changes in separate ticks cost a screen update each, and a redraw of the chart's region).
        life = session.view()
        figures_key = (life.state, life.since, int(now_wall // CHART_PERIOD_S))
        if figures_key != self._figures_key:
            chart.flush()
            self._figures_key = figures_key
            text = (latest_figures(points, now_wall, since=life.since)
                    if life.state == ServerState.READY else "")
            if text != self._figures:  # setting a border title refreshes the widget, even to the same text
                self._figures = text
                chart.border_subtitle = text

    def _push_events(self) -> None:
        events = self.session.events
        if not events or events[-1] is self._last_event:
            return
        new: list[ActionLogged] = []
        for event in reversed(events):  # newest first, back to the last one shown
            if event is self._last_event:
                break
            new.append(event)
        self._last_event = events[-1]
        self.query_one(EventLog).extend(EventEntry(e.at, printable(e.text), e.level) for e in reversed(new))

    def _push_flags(self) -> None:
        try:
            self._pushed_rows = self._toggle_rows()
            self.query_one(FlagsPanel).update(self._pushed_rows)
        except NoMatches:
            pass

    def _server_view(self, now_s: int) -> ServerView:
        """What the server panel shows; times on whole seconds of the wall clock (`now_s`, int(time.time()))."""
        return server_view(self.session.view(), self.session.server_version, now_s, self._page_cache)

    def _toggle_rows(self) -> list[ToggleRow]:
        return toggle_rows(self.session.profile, self.session.pending_flags)

    def _feed_log_screen(self) -> None:
        if self._log_screen is None or self.screen is not self._log_screen:
            return
        lines = list(self.session.log_lines)
        if len(lines) > self._log_shown:
            self._log_screen.add_lines([printable(line) for line in lines[self._log_shown:]])
            self._log_shown = len(lines)

    # ---- actions ---------------------------------------------------------------------------------
    def _refresh_soon(self) -> None:
        """Push the state once a command started by a key has taken its first steps, not at the next tick.

        run_command starts the command as a task; a callback scheduled after it runs after the task's first
        step (asyncio runs ready callbacks in order), when `busy` and the command's first event log line are
        set."""
        asyncio.get_running_loop().call_soon(self.refresh_view)

    def _driver_note(self) -> str:
        """" · alice@gpubox drives" in a read-only header; " · nobody drives" for a dashboard opened with --watch
        (a `serve` tab) while the lock is free."""
        session = self.session
        if session.driven_by:
            return f" · {printable(session.driven_by)} drives"
        return " · nobody drives" if session.watching else ""

    def _take_over_hint(self) -> str:
        """" · T takes over" while this read-only dashboard may take the driver lock (not with --readonly)."""
        return f" · {self._keymap.get('take_over', 'T')} takes over" if self.session.can_take_over else ""

    @property
    def watching_only(self) -> bool:
        """Whoever sits at this dashboard only watches: opened with --readonly, or with --watch (a `serve` tab) while
        it does not drive. Nothing that loads the server, writes the owner's files or config, or trusts a host key."""
        session = self.session
        return session.watch_only or (session.watching and session.readonly)

    def _how_to_drive(self) -> str:
        """"; T takes over", or how to drive a dashboard opened with --readonly."""
        if self.session.watch_only:
            return "; opened with --readonly: drive from a dashboard opened without it"
        return self._take_over_hint().replace(" · ", "; ", 1)

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
        if action == "press_toggle" and parameters and self.tuning_flags_only:
            toggle = session.profile.toggle(str(parameters[0]))
            for flag in toggle.flags if toggle is not None else ():
                if not is_tuning_flag(session.profile.backend, flag):
                    return untuned_flag_message(flag)
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
        active = self.screen.active_bindings.get(event.key)
        if active is None or active.enabled or active.node is not self:
            return
        _, action, parameters = parse_action(active.binding.action)
        text = self.refusal(action, parameters)
        if text:
            self.notify(text, severity="warning")

    def _refuse(self, text: str) -> None:
        """The toast of a key that needs the driver in a read-only dashboard, with the take-over key."""
        self.notify(f"{text}{self._how_to_drive()}", severity="warning")

    def _command(self, name: str, factory: object) -> None:
        try:
            self.session.run_command(name, factory)  # type: ignore[arg-type]
        except ReadOnlyError as exc:
            self._refuse(str(exc))
        self._refresh_soon()

    def action_press_toggle(self, key: str) -> None:
        toggle = self.session.profile.toggle(key)
        if toggle is None:
            return
        text = self.session.press_toggle(toggle)
        self._push_flags()  # only what the key changed; the rest comes with the next tick
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
            ask_adopted(self, adopted, "relaunch", self.action_relaunch)
            return
        life = self.session.view()
        if life.state in (ServerState.STOPPED, ServerState.FREE, ServerState.CRASHED,
                          ServerState.STUCK) and life.record is None:
            self._command("launch", self.session.launch)
            return
        self._command("relaunch", self.session.relaunch)

    def action_kill(self) -> None:
        adopted = self.session.adopted
        if adopted is not None and not adopted.confirmed:  # its question replaces the kill's
            ask_adopted(self, adopted, "kill", lambda: self._command("kill", self.session.kill))
            return
        record = self.session.view().record
        detail = f"SIGTERM to process group {record.pgid}, then SIGKILL after the grace period." if record else ""

        def answered(yes: bool | None) -> None:
            if yes:
                self._command("kill", self.session.kill)

        self.push_screen(ConfirmModal("Kill the server?", detail, yes_label="Kill"), answered)

    def action_confirm_free(self) -> None:
        self._command("confirm free", self.session.confirm_free)

    def action_probe(self) -> None:
        self.session.set_probe(not self.session.probe_wanted)
        self.refresh_view()

    def action_undo(self) -> None:
        self.session.undo_pending()
        self.refresh_view()

    def action_diff(self) -> None:
        # the argv as words to read: a value's control characters written out (app.core.data.printable)
        self.push_screen(DiffScreen([printable(word) for word in self.session.running_argv()],
                                    [printable(word) for word in self.session.pending_argv()]))

    def action_log(self) -> None:
        self._log_screen = LogViewScreen([printable(line) for line in self.session.log_lines], title="server log")
        self._log_shown = len(self.session.log_lines)
        self.push_screen(self._log_screen)

    def dashboard_commands(self) -> Iterator[DashboardCommand]:
        """The profile's toggles, then every binding with an id (of this class and its bases), keys as remapped."""
        for t in self.session.profile.toggles:
            yield DashboardCommand(t.key, f"Toggle {t.label}", t.help or " ".join(t.flags), f"press_toggle('{t.key}')")
        seen: set[str] = set()
        for cls in type(self).__mro__:
            for binding in cls.__dict__.get("BINDINGS", []):
                if isinstance(binding, Binding) and binding.id and binding.id not in seen:
                    seen.add(binding.id)
                    key = self._keymap.get(binding.id, binding.key)
                    yield DashboardCommand(key, binding.description, binding.tooltip or binding.description,
                                           binding.action)
        if self.fleet:
            yield DashboardCommand("escape", "Fleet", "back to the fleet (the server keeps running)", "back_to_fleet")

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """Every dashboard command is also in the command palette (ctrl+p), after Textual's own; those refused now
        (check_action) are left out, and so is Textual's Screenshot while watching (it writes a file)."""
        for system in super().get_system_commands(screen):
            if not (self.watching_only and system.title == "Screenshot"):
                yield system
        for command in self.dashboard_commands():
            _, action, parameters = parse_action(command.action)
            if self.refusal(action, parameters):
                continue
            # "· key r", not "[r]": the palette reads square brackets as markup ([r] is a reverse style)
            yield SystemCommand(f"{command.title} · key {command.key}", command.help,
                                partial(self.run_action, command.action))

    def action_help(self) -> None:
        """Every key as the footer writes it ("?", "^p"), the ones the footer had no room for marked."""
        left_out = set(self.query_one(KeyFooter).left_out)
        keys = []
        for c in self.dashboard_commands():
            text = c.help if c.help.lower().startswith(c.title.lower()) else f"{c.title}: {c.help}"
            key = self.get_key_display(Binding(c.key, c.action))
            keys.append((f"{key} ·" if c.action in left_out else key, text))
        keys.append((self.get_key_display(Binding("ctrl+p", "command_palette")),
                     "command palette: every command above, Textual's Theme (kept for the next start), any flag"))
        self.push_screen(HelpScreen(keys, note="keys marked · have no room in the footer" if left_out else ""))

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
        self.push_screen(ConfirmModal(f"Take over {session.profile.name}?",
                                      f"{printable(session.driven_by)} drives it now; their dashboard turns read-only.",
                                      yes_label="Take over"), answered)

    async def _take_over(self) -> None:
        try:
            text = await self.session.take_over_now()
        except (HostError, OSError) as exc:
            self.notify(f"take-over failed: {exc}", severity="error")
            return
        self.notify(text, severity="warning" if self.session.readonly else "information")
        self.refresh_view()

    async def on_unmount(self) -> None:
        """However the app ends (q, or a browser tab closed under `tunedash serve`): give the driver lock back and
        stop the Session's streams; the server keeps running."""
        self._forget_sigterm()
        await self.session.stop()

    def action_back_to_fleet(self) -> None:
        """Escape in a dashboard opened from the fleet: end it (on_unmount stops the Session; the fleet's host
        stays open) and let the fleet show again."""
        self.back_to_fleet = True
        self.exit()

    async def action_quit(self) -> None:
        await self.session.stop()
        await self.session.host.close()  # an SSH connection; nothing for the local host
        self.exit()


def create_app(
    profile: Profile,
    *,
    readonly: bool = False,
    probe: bool = False,
    autolaunch: bool = False,
    take_over: bool = False,
    watching: bool = False,
    host: Host | None = None,
    session: Session | None = None,
    keymap_file: Path | None = KEYMAP_FILE,
    fleet: bool = False,
    theme_file: Path | None = THEME_FILE,
    tuning_flags_only: bool = False,
) -> TunedashApp:
    """The one factory for the dashboard (CLI and tests); `fleet`: opened from the fleet (Escape goes back);
    `tuning_flags_only`: flags are changed only among the catalog's tuning flags (each `tunedash serve` tab)."""
    if session is None:
        if host is None:
            from app.connect import host_for

            host = host_for(profile)
        session = Session(host, profile, readonly=readonly, probe=probe, autolaunch=autolaunch, take_over=take_over,
                          watching=watching)
    app = TunedashApp(session, keymap_file=keymap_file, fleet=fleet, theme_file=theme_file,
                      tuning_flags_only=tuning_flags_only)
    from app.tui.trust import install_trust_prompt  # an unknown SSH host key: ask in a ConfirmModal

    install_trust_prompt(app, session.host, asks=lambda: not app.watching_only)
    return app
