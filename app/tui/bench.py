"""Dashboard keys for measuring: `b` benchmark, `B` mark baseline, `a` A/B pending vs baseline, `h` history.

The keys are the DashboardScreen's own bindings (app/tui/dashboard.py); its actions call start_bench, start_ab and
open_history here with the dashboard (`Dashboard`: its session, baseline and refusals). A benchmark and an A/B run
as the command in the Session's one slot (app.core.command), through the same core objects as the CLI
(recorded.run_recorded_bench, experiment.Experiment, store.HistoryStore); their RunScreen only shows progress and
results, and owns the keys while it is open: Escape cancels a running one (an A/B keeps the finished trials in the
history, status "cancelled"), `k` cancels it and kills the server, and a key that would start another command is
refused naming the one in progress. Screens: RunScreen (progress, results table; for an A/B progress through
every relaunch, then the compare view: arms side by side with the verdict, and the compare plots: launch values
with intervals, TTFT and ITL per arm), HistoryScreen (browse past runs: the highlighted run's table, plots and its
configs' tok/s over time; enter opens app.tui.compare's CompareScreen of a run).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, Protocol

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import DataTable, Footer, ProgressBar, RichLog, Static
from textual.worker import Worker

from app.core.measure.bench import BenchSpec, summary_lines
from app.core.measure.client import RequestResult
from app.core.measure.experiment import Experiment, ExperimentFailed, ExperimentProgress, ExperimentSpec, parse_arm
from app.core.measure.recorded import run_recorded_bench
from app.core.measure.report import RunReport, arm_rows, bench_rows, run_report
from app.core.measure.store import HistoryStore, RequestRow, RunRow, StoreError
from app.core.profiles.render import describe_change, profile_diff
from app.core.profiles.types import Profile
from app.core.server.events import LifecycleEvent, ServerLogEvent
from app.core.session import ReadOnlyError, Session
from app.core.telemetry.energy import energy_meter_for
from app.tui.compare import CompareScreen
from app.tui.plots import RunCache, compare_plots_view, trend_view
from widgets.arm_plot import ComparePlots, ComparePlotsView, TrendPlot


class Dashboard(Protocol):
    """What the measuring keys need of the dashboard screen that owns them (DashboardScreen)."""

    session: Session
    baseline: Profile | None

    @property
    def app(self) -> App[Any]: ...

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None: ...

    def refusal(self, action: str, parameters: tuple[object, ...] = ()) -> str | None: ...

    def flag_refusal(self, name: str) -> str | None: ...

    def refusal_for_key(self, key: str) -> str | None: ...

    def key_of(self, binding_id: str, default: str) -> str: ...

    def push_flags(self) -> None: ...

    def action_kill(self) -> None: ...


def _table(table: DataTable[str], rows: list[list[str]]) -> None:
    table.clear(columns=True)
    table.add_columns(*rows[0])
    for row in rows[1:]:
        table.add_row(*row)


class SlotScreen(Screen[None]):
    """A screen that runs one command in the Session's command slot (a bench, an A/B, a tune) and owns its keys
    while open: a dashboard key that would start another command is refused with why; escape cancels the command
    (what it finished is kept), then closes; `k` is the dashboard's kill, which cancels the command first."""

    KEPT = "finished trials are kept"  # what cancelling keeps, in the subclass's words

    def __init__(self, dashboard: Dashboard) -> None:
        super().__init__()
        self.dashboard = dashboard
        self._run_task: asyncio.Task[None] | None = None

    def start_command(self, command: str, job: Callable[[], Coroutine[Any, Any, None]], *,
                      signals: bool = True, settle_s: float = 0.0) -> asyncio.Task[None] | None:
        """Run `job` as the slot's command, or say why not (read-only, another command runs): its task or None.
        `settle_s`: how long quitting waits for its clean-up once cancelled (Session.run_command)."""
        session = self.dashboard.session
        try:
            self._run_task = session.run_command(command, job, signals=signals, settle_s=settle_s)
        except ReadOnlyError as exc:
            self.say(str(exc))
            return None
        if self._run_task is None:
            self.say(session.command_refusal(command) or f"{command} refused")
        return self._run_task

    @property
    def running(self) -> bool:
        return self._run_task is not None and not self._run_task.done()

    def on_key(self, event: events.Key) -> None:
        """A dashboard key that would start another command while this one runs: say why it does not."""
        if event.key in self.active_bindings or not self.running:
            return
        text = self.dashboard.refusal_for_key(event.key)
        if text:
            event.stop()
            self.notify(text, severity="warning")

    def say(self, text: str) -> None:
        self.query_one(RichLog).write(text)

    def action_close(self) -> None:
        if self._run_task is not None and self.running:
            self._run_task.cancel()  # the command slot's task: the slot is free once it has ended
            self.say(f"cancelling… ({self.KEPT})")
            return
        self.dismiss(None)

    def action_kill(self) -> None:
        """The dashboard's kill (asks first): the slot cancels this command, then kills."""
        self.dashboard.action_kill()


class RunScreen(SlotScreen):
    """Progress of a benchmark or an A/B, run as the Session's command `command`, then its results. Escape cancels a
    running one and closes a done one; `k` cancels it and kills the server; a key that would start another command
    is refused, naming this one."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Cancel/close", tooltip="Cancel the run (finished trials are kept) or close"),
        Binding("k", "kill", "Kill", id="kill", tooltip="Cancel the run, then kill the server (asks first)"),
    ]
    DEFAULT_CSS = """
    RunScreen { layout: vertical; }
    RunScreen #title { padding: 0 1; text-style: bold; }
    RunScreen #verdict { padding: 0 1; color: $success; text-style: bold; }
    RunScreen ProgressBar { padding: 0 1; }
    RunScreen RichLog { height: 1fr; min-height: 3; border: round $primary; }
    RunScreen DataTable { height: auto; max-height: 16; }
    RunScreen ComparePlots { height: 2fr; min-height: 8; max-height: 16; display: none; }
    RunScreen ComparePlots.-shown { display: block; }
    """

    def __init__(self, title: str, dashboard: Dashboard, command: str,
                 job: Callable[[RunScreen], Coroutine[Any, Any, None]], *, signals: bool = True) -> None:
        super().__init__(dashboard)
        self.title_text = title
        self.command = command  # its name in the command slot ("bench", "A/B")
        self.signals = signals  # whether it relaunches (refused in a read-only session)
        self.job = job
        self.worker: Worker[Any] | None = None  # follows the command; finished when the command ended

    def on_mount(self) -> None:
        task = self.start_command(self.command, self._run, signals=self.signals)
        if task is not None:
            self.worker = self.run_worker(self._follow(task), name="measure", exit_on_error=False)

    async def _run(self) -> None:
        try:
            await self.job(self)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # on this screen too, not only in the event log (the slot says it there)
            self.say(f"failed: {exc}")
            raise

    @staticmethod
    async def _follow(task: asyncio.Task[None]) -> None:
        await asyncio.wait({task})  # the command's end; closing the screen never cancels it by itself

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, id="title")
            yield ProgressBar(id="progress", show_eta=False)
            yield DataTable(id="results", cursor_type="row", zebra_stripes=True)
            yield Static("", id="verdict")
            yield ComparePlots()
            yield RichLog(id="steps", wrap=True, markup=False)
        yield Footer()

    def set_progress(self, done: float, total: float) -> None:
        self.query_one(ProgressBar).update(total=max(total, 1), progress=done)

    def show_table(self, rows: list[list[str]], verdict: str = "") -> None:
        _table(self.query_one(DataTable), rows)
        self.query_one("#verdict", Static).update(verdict)

    def show_plots(self, view: ComparePlotsView) -> None:
        """Show (and from then on keep) the compare plots: an A/B's launch values, TTFT and ITL per arm."""
        plots = self.query_one(ComparePlots)
        plots.add_class("-shown")
        plots.show(view)



class HistoryScreen(Screen[None]):
    """Past runs, newest first. The highlighted run's table, verdict and compare plots show below the list,
    beside its configs' tok/s over time; enter opens the run's full compare screen."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("enter", "open_run", "Compare", tooltip="The highlighted run's compare screen (plots, verdict)"),
    ]
    DEFAULT_CSS = """
    HistoryScreen #runs { height: 1fr; min-height: 4; }
    HistoryScreen #detail-table { height: auto; max-height: 8; }
    HistoryScreen #detail { padding: 0 1; height: auto; }
    HistoryScreen #history-plots { height: 12; }
    HistoryScreen TrendPlot { width: 1fr; }
    HistoryScreen ComparePlots { width: 3fr; height: 12; }
    """

    def __init__(self, store: HistoryStore) -> None:
        super().__init__()
        self.store = store
        self.cache = RunCache(store)
        self.listed: list[RunRow] = []
        self.shown: RunReport | None = None
        self.shown_rows: list[RequestRow] = []

    @property
    def shown_run(self) -> RunRow | None:
        return None if self.shown is None else self.shown.run

    def compose(self) -> ComposeResult:
        yield Static(f"history: {self.store.path}", id="where")
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="detail-table")
        yield Static("", id="detail")
        with Horizontal(id="history-plots"):
            yield TrendPlot(id="trend")
            yield ComparePlots()
        yield Footer()

    def on_mount(self) -> None:
        self.run_worker(self._list(), name="history list", group="history")

    async def _list(self) -> None:
        """The runs, read in a thread (SQLite may wait for another writer's lock), then the list."""
        try:
            self.listed = await self.store.in_thread(self.store.runs)
        except (StoreError, sqlite3.Error) as exc:
            self.notify(f"{self.store.path}: {exc}", title="history unreadable", severity="error")
            return
        rows = [["id", "kind", "profile", "status", "trials", "result"]]
        for r in self.listed:
            rows.append([str(r.id), r.kind, r.profile, r.shown_status, str(r.trial_count), (r.verdict or "")[:80]])
        table = self.query_one("#runs", DataTable)
        _table(table, rows)
        table.focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id != "runs":
            return
        row = event.data_table.get_row_at(event.cursor_row)
        self.run_worker(self._show(int(row[0])), name="history run", group="history-run", exclusive=True)

    def _read(self, run_id: int) -> tuple[RunReport, list[RequestRow], list[RunRow]] | None:
        """In a thread: the run's report, its requests and its profile's runs (for the trend)."""
        run = self.cache.get(run_id)
        if run is None:
            return None
        return run_report(run), self.cache.request_rows(run), self.cache.profile_runs(run.profile, self.listed)

    async def _show(self, run_id: int) -> None:
        try:
            loaded = await asyncio.to_thread(self._read, run_id)
        except (StoreError, sqlite3.Error) as exc:
            self.notify(f"{self.store.path}: run #{run_id}: {exc}", title="history unreadable", severity="error")
            return
        if loaded is None:
            return
        report, requests, others = loaded
        self.shown, self.shown_rows = report, requests
        detail = self.query_one("#detail-table", DataTable)
        if report.run.kind == "ab":
            _table(detail, arm_rows(report.experiment))
            diff = ", ".join(f"--{c.flag} {c.old} -> {c.new}" for c in report.config_diff)
            self.query_one("#detail", Static).update(f"{report.verdict or ''}\n{diff}")
        else:
            _table(detail, bench_rows(report.summary))
            self.query_one("#detail", Static).update("")
        self.query_one(ComparePlots).show(compare_plots_view(report.experiment, requests))
        self.query_one(TrendPlot).show(trend_view(report.run, others))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "runs":  # enter on the list (the table takes the key before the binding)
            self.action_open_run()

    def action_open_run(self) -> None:
        """The highlighted run's compare screen (read first when its detail has not shown yet)."""
        table = self.query_one("#runs", DataTable)
        if not table.row_count:
            return
        run_id = int(table.get_row_at(table.cursor_row)[0])
        if self.shown is not None and self.shown.run.id == run_id:
            self.app.push_screen(CompareScreen(self.shown, self.shown_rows))
        else:
            self.run_worker(self._open(run_id), name="history compare", group="history-open", exclusive=True)

    async def _open(self, run_id: int) -> None:
        try:
            loaded = await asyncio.to_thread(self._read, run_id)
        except (StoreError, sqlite3.Error) as exc:
            self.notify(f"{self.store.path}: run #{run_id}: {exc}", title="history unreadable", severity="error")
            return
        if loaded is not None:
            self.app.push_screen(CompareScreen(loaded[0], loaded[1]))

    def action_close(self) -> None:
        self.store.close()
        self.dismiss(None)


def open_store(dashboard: Dashboard) -> HistoryStore | None:
    """The history, or None with a toast that says why it cannot be opened."""
    try:
        return HistoryStore()
    except StoreError as exc:
        dashboard.notify(str(exc), title="history unavailable", severity="error")
        return None


# ---- b ---------------------------------------------------------------------------------------------
def start_bench(dashboard: Dashboard) -> None:
    """`b`: a benchmark of the running server (the dashboard refused it already while not READY or busy)."""
    profile = dashboard.session.profile
    spec = BenchSpec.from_settings(profile.bench)
    dashboard.app.push_screen(RunScreen(
        f"benchmark {profile.name}: {spec.requests} requests at concurrency {spec.concurrency}, "
        f"{spec.max_tokens} output tokens ({spec.warmup} warm-up)", dashboard, "bench",
        lambda screen: _bench(dashboard, screen, profile, spec), signals=False))


async def _bench(dashboard: Dashboard, screen: RunScreen, profile: Profile, spec: BenchSpec) -> None:
    session = dashboard.session
    base = await session.host.http_base(profile.port)

    def server_events(feed: Callable[[object], None]) -> Callable[[], None]:
        def listener(event: LifecycleEvent) -> None:
            if isinstance(event, ServerLogEvent):
                feed(event.event)

        return session.subscribe(listener)

    done = 0

    def on_result(_i: int, result: RequestResult) -> None:
        nonlocal done
        done += 1
        screen.set_progress(done, spec.requests)

    def measuring() -> None:
        screen.say("measuring…")
        session.command.progress("measuring")

    record = session.view().record
    store = open_store(dashboard)
    try:
        screen.say("warming up…")
        session.command.progress("warming up")
        recorded = await run_recorded_bench(
            base, profile, spec, host_name=session.host.name, store=store, events=server_events,
            running_flags=record.flags if record else profile.flags, on_result=on_result,
            on_warmup_done=measuring, energy=energy_meter_for(session.host, profile))
        screen.show_table(bench_rows(recorded.summary))
        for line in summary_lines(recorded.summary):  # energy (J/token, the method) and goodput
            screen.say(line)
        for warning in recorded.result.summary.warnings:
            screen.say(f"warning: {warning}")
        run_id = recorded.run_id
        screen.say(f"saved as run #{run_id} (tunedash export {run_id} --format md); escape closes")
    finally:
        if store is not None:
            store.close()


# ---- a ---------------------------------------------------------------------------------------------
def start_ab(dashboard: Dashboard) -> None:
    """`a`: the A/B of the baseline (A, marked with B) against the pending flags (B), as the slot's command."""
    session = dashboard.session  # refused in a read-only session or while a command runs (check_action)
    if dashboard.baseline is None:
        dashboard.notify(f"no baseline: press {dashboard.key_of('baseline', 'B')} on the running config first, then "
                         f"change flags and press {dashboard.key_of('ab', 'a')}", severity="warning")
        return
    a_profile = dashboard.baseline
    b_profile = session.pending_profile
    changes = profile_diff(a_profile, b_profile)
    b_text = ", ".join(describe_change(c, a_profile.toggles) for c in changes) or "same flags (A/A)"
    arms = [parse_arm(a_profile, "", "A"), parse_arm(b_profile, "", "B")]
    arms = [replace_overrides(arms[0], "baseline"), replace_overrides(arms[1], b_text)]
    bench = BenchSpec.from_settings(a_profile.bench)
    spec = ExperimentSpec(arms, a_profile.bench.trials, bench, launches=a_profile.bench.launches)
    dashboard.app.push_screen(RunScreen(
        f"A/B on {a_profile.name}: A = baseline, B = {b_text}; "
        f"{spec.launches} launches x {spec.trials} trials of {bench.requests} requests", dashboard, "A/B",
        lambda screen: _ab(dashboard, screen, spec)))


async def _ab(dashboard: Dashboard, screen: RunScreen, spec: ExperimentSpec) -> None:
    session = dashboard.session
    store = open_store(dashboard)
    total_requests = len(spec.schedule()) * spec.bench.requests

    def on_progress(p: ExperimentProgress) -> None:
        screen.set_progress(p.trials_done * spec.bench.requests + p.requests_done, total_requests)
        if p.kind != "request":
            screen.say(p.text)
            session.command.progress(p.text.split(": relaunch with")[0])  # "arm A launch 1/2", "A trial 2/4 ..."
        if p.kind == "trial":
            report = experiment.result.report()
            screen.show_table(arm_rows(report))
            screen.show_plots(compare_plots_view(report))  # launch values; the distributions at the end

    def on_lifecycle(event: LifecycleEvent) -> None:
        text = getattr(event, "text", None)
        if text and not isinstance(event, ServerLogEvent):
            screen.say(f"  {text}")

    async def request_rows() -> list[RequestRow]:
        if store is None or experiment.run_id is None:
            return []
        try:
            return await store.in_thread(store.request_rows, experiment.run_id)
        except sqlite3.Error:
            return []  # the plots go without distributions; the table and verdict still show

    experiment = Experiment(spec, session, store, on_progress=on_progress,
                            energy_for=lambda arm_profile: energy_meter_for(session.host, arm_profile))
    unsubscribe = session.subscribe(on_lifecycle)
    try:
        await experiment.run()
    except ExperimentFailed as exc:
        screen.say(f"stopped: {exc}")
    except asyncio.CancelledError:
        screen.say("cancelled; the finished trials are kept in the history")
        raise
    finally:
        unsubscribe()
        report = experiment.result.report()
        screen.show_table(arm_rows(report), report.verdict or "")
        screen.show_plots(compare_plots_view(report, await request_rows()))
        if store is not None:
            screen.say(f"saved as run #{experiment.run_id} (tunedash export {experiment.run_id} --format md)")
            store.close()


# ---- h ---------------------------------------------------------------------------------------------
def open_history(dashboard: Dashboard) -> None:
    store = open_store(dashboard)
    if store is not None:
        dashboard.app.push_screen(HistoryScreen(store))


def replace_overrides(arm: Any, text: str) -> Any:
    """The arm with a label for people ("baseline", "steps 1 -> 3") instead of override text."""
    from dataclasses import replace

    return replace(arm, overrides=text)

