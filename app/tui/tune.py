"""The tune screen (`t`, or "Tune" in the palette): the profile's [tune] race as the Session's command "tune".

The same core objects as `tunedash tune` (app.core.tune: build_space, TuneRunner, tune_results), with the Session
as the server's owner, so the dashboard's log view, chart markers and Flags panel follow every launch. The screen
owns its keys while the race runs: escape cancels it cleanly (every finished launch is kept; the run resumes with
`tunedash tune PROFILE --resume ID`) and closes it once done; `k` cancels and kills (asks first). It shows the live
leaderboard per shape (mean, 95% interval, state), the eliminated candidates with why, launches spent and left with
an ETA, and at the end the verdicts, the best single config and the Pareto fronts as text.

On parallel slots (`TuneScreen(dashboard, slots)`, opened by "Tune on parallel slots…": app.tui.tune_slots) the
race runs up to one candidate per slot at once, as `tunedash tune PROFILE --slots N`: slot 0 is the Session's own
server, each other slot a lifecycle of its own with its own driver lock (app.core.tune.slot_servers.SlotServers).
A line per slot says its GPUs, port and what it launches or measures now; at the end the A/A across the slots,
each slot's factor, what slot 0 runs and each other slot's "server killed, GPUs confirmed free". Escape and `k`
cancel as on one slot; the other slots' servers are then killed and their GPUs confirmed free before the command
ends (quitting waits for that too, up to SETTLE_S).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, ProgressBar, RichLog, Static

from app.core.advisor.advise import advise
from app.core.errors import TunedashError
from app.core.measure.slots import Slot
from app.core.server.driver import DrivenElsewhere
from app.core.telemetry.energy import energy_meter_for
from app.core.tune.export import board_rows, pareto_lines, slot_lines, summary_lines
from app.core.tune.model import OBJECTIVE_TEXT, TuneFailed, TuneSpec
from app.core.tune.results import TuneResults, tune_results
from app.core.tune.run import TuneProgress, TuneRunner
from app.core.tune.slot_servers import SlotServers
from app.core.tune.space import build_space
from app.tui.bench import Dashboard, SlotScreen, open_store
from widgets.pareto_plot import ParetoPlot, ParetoView

SETTLE_S = 60.0
"""How long quitting the dashboard waits for a tune on slots to kill its other slots' servers and confirm their GPUs
free (the kill's grace is 15 s; the sim's take well under a second)."""


def pareto_views(data: TuneResults) -> tuple[ParetoView, ParetoView]:
    """The results' two Pareto fronts as the plots' views: per stream vs total tok/s, per stream vs J/token."""
    points = data.pareto.points
    views = []
    for front, yk, title in ((data.pareto.stream_vs_total, "total_tok_s", "Pareto: per stream vs total tok/s"),
                             (data.pareto.stream_vs_j_per_token, "j_per_token", "Pareto: per stream vs J/token")):
        xy = [(p.figures.stream_tok_s, p.figures.axis(yk)) for p in points]
        got = tuple((x, y) for x, y in xy if x is not None and y is not None)
        on = tuple((x, y) for i in front.front if (x := xy[i][0]) is not None and (y := xy[i][1]) is not None)
        views.append(ParetoView(title, "tok/s per stream", yk.replace("_", " "), got, on))
    return views[0], views[1]


class TuneScreen(SlotScreen):
    """The live race of the profile's [tune] table (module docstring)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Cancel/close", tooltip="Cancel the tune (finished launches are kept) or close"),
        Binding("k", "kill", "Kill", id="kill", tooltip="Cancel the tune, then kill the server (asks first)"),
    ]
    KEPT = "finished launches are kept"
    DEFAULT_CSS = """
    TuneScreen { layout: vertical; }
    TuneScreen #title { padding: 0 1; text-style: bold; }
    TuneScreen #status { padding: 0 1; color: $accent; }
    TuneScreen #slots { padding: 0 1; height: auto; }
    TuneScreen #out { padding: 0 1; color: $warning; height: auto; max-height: 8; }
    TuneScreen #summary { padding: 0 1; color: $success; height: auto; }
    TuneScreen ProgressBar { padding: 0 1; }
    TuneScreen DataTable { height: auto; max-height: 16; }
    TuneScreen RichLog { height: 1fr; min-height: 3; border: round $primary; }
    TuneScreen #pareto { height: 1fr; min-height: 6; max-height: 16; }
    """

    def __init__(self, dashboard: Dashboard, slots: Sequence[Slot] = ()) -> None:
        super().__init__(dashboard)
        self.runner: TuneRunner | None = None
        self.data: TuneResults | None = None  # the latest results (live, then final)
        self.slots = list(slots) if len(slots) > 1 else []  # the plan on parallel slots; [] on one slot
        self.servers: SlotServers | None = None  # slots 1..'s servers while the race runs on slots
        self.slot_text = {slot.index: f"{slot.label}: waiting for its first launch" for slot in self.slots}
        self._on_slot: dict[int, str] = {}  # slot -> the candidate it launched last
        self.freed: list[str] | None = None  # each other slot's line once its server was killed (or why not)
        self._cancel_asked = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"tune {self.dashboard.session.profile.name}", id="title")
            yield ProgressBar(id="progress", show_eta=False)
            yield Static("", id="status")
            yield Static("", id="slots")
            yield DataTable(id="boards", zebra_stripes=True)
            yield Static("", id="out")
            yield Static("", id="summary")
            with Horizontal(id="pareto"):
                yield ParetoPlot(id="pareto-total")
                yield ParetoPlot(id="pareto-energy")
            yield RichLog(id="steps", wrap=True, markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#slots", Static).display = bool(self.slots)
        self._show_slots()
        self.start_command("tune", self._run, settle_s=SETTLE_S if self.slots else 0.0)

    def action_close(self) -> None:
        if self.running and self._cancel_asked:  # a second cancel would cut the other slots' clean-up short
            self.notify("cancelling: the finished launches are kept" + (
                "; the other slots' servers are being killed and their GPUs confirmed free" if self.slots else ""))
            return
        self._cancel_asked = self.running
        super().action_close()

    # ---- the race ---------------------------------------------------------------------------------
    async def _spec(self) -> TuneSpec | None:
        session = self.dashboard.session
        profile = session.profile
        tune = profile.tune
        if tune is None:
            self.say(f"{profile.source}: the profile has no [tune] table; add one (README: `tunedash tune`)")
            return None
        record = session.view().record
        running = dict(record.flags) if record is not None else None
        fixes: list[tuple[str, dict[str, Any]]] = []
        if running is not None and tune.advisor_seeds:
            try:
                advice = await advise(session.host, profile)
                fixes = [(f.rule, dict(f.fix)) for f in (*advice.slower_than_before, *advice.left_on_table) if f.fix]
            except TunedashError as exc:
                self.say(f"advisor seeds skipped: {exc}")
        space = build_space(profile, tune, running=running, fixes=fixes, server=session.server_flags)
        for dropped in space.dropped:
            self.say(f"dropped {dropped.label}: {dropped.why}")
        if not space.candidates:
            self.say("[tune] leaves no candidate")
            return None
        n = len(space.candidates)
        return TuneSpec(profile, space.candidates, tune.shapes, tune, tune.max_launches or 2 * n,
                        tune.time_budget_s, profile.ready_timeout_s)

    async def _run(self) -> None:
        spec = await self._spec()
        if spec is None:
            return
        session = self.dashboard.session
        servers = None
        if self.slots:
            servers = SlotServers(session.host, spec.profile, self.slots, server_flags=session.server_flags)
            try:
                await servers.drive(take_over=session.take_over)
            except DrivenElsewhere as exc:  # nothing was signalled: the locks taken are given back
                await servers.close()
                self.say(str(exc))
                self.notify(str(exc), title="tune on slots", severity="error")
                return
            self.servers = servers
        store = open_store(self.dashboard)
        self.query_one("#title", Static).update(
            f"tune {spec.profile.name}: {len(spec.candidates)} candidates x {len(spec.shapes)} shapes, ranked by "
            f"{OBJECTIVE_TEXT[spec.settings.objective]}, at most {spec.max_launches} launches"
            + (f", {len(self.slots)} slots at once" if self.slots else ""))

        def on_progress(p: TuneProgress) -> None:
            self.query_one(ProgressBar).update(total=max(1, p.launches_budget), progress=p.launches_done)
            eta = f", ETA {p.eta_s / 60:.1f} min" if p.eta_s is not None else ""
            self.query_one("#status", Static).update(
                f"launches {p.launches_done} spent, {max(0, p.launches_budget - p.launches_done)} left{eta}")
            if p.kind != "decision":
                self.say(p.text)
                session.command.progress(p.text.split(" (its launch")[0])
            if p.slot is not None and p.slot in self.slot_text:
                self._follow_slot(p)
            if p.decision is not None and runner is not None:
                self.show(tune_results(spec, runner.state, p.decision, status="running", run_id=runner.run_id))

        runner = TuneRunner(spec, session, store, on_progress=on_progress,
                            energy_for=lambda p: energy_meter_for(session.host, p),
                            slots=servers.owners(session) if servers is not None else None)
        self.runner = runner
        try:
            try:
                await runner.run()
            except TuneFailed as exc:
                text = str(exc)
                self.say(text if text.startswith("stopped:") else f"stopped: {text}")  # an allocation end says it
            finally:
                if store is not None:
                    store.close()
                if self.is_attached:  # not when the app quits under it
                    decision = runner.decision or runner.decide()
                    self.show(tune_results(spec, runner.state, decision, status=runner.status, run_id=runner.run_id,
                                           note=runner.note, ended_on=runner.ended_on), final=True)
                    if store is not None:
                        self.say(f"saved as run #{runner.run_id} (tunedash export {runner.run_id} --format md)")
        finally:
            if servers is not None:  # the other slots' servers go, however the race ended
                await self._free(servers, runner)

    # ---- parallel slots -----------------------------------------------------------------------------
    def _follow_slot(self, p: TuneProgress) -> None:
        """A slot's line from a launch, ready or shape step on it: the candidate and what it does now."""
        label, what = self.slots[p.slot or 0].label, p.candidate or ""
        self._on_slot[p.slot or 0] = what
        if p.kind == "launch":
            text = f"launching {what}"
        elif p.kind == "ready" and "did not become ready" in p.text:
            text = f"{what}: {p.text[p.text.index('did not become ready'):]}"
        elif p.kind == "ready":
            text = f"{what}: ready, measuring"
        elif p.kind == "shape":
            text = f"{what}: measured {p.text.split('] ', 1)[-1].strip()}"
        else:
            text = p.text
        self.slot_text[p.slot or 0] = f"{label}: {text}"
        self._show_slots()

    def _show_slots(self) -> None:
        if self.slots:
            self.query_one("#slots", Static).update("\n".join(self.slot_text[s.index] for s in self.slots))

    async def _free(self, servers: SlotServers, runner: TuneRunner) -> None:
        """The end of a race on slots, however it ended: the A/A across the slots, what slot 0 runs, then each other
        slot's server killed and its GPUs confirmed free (shielded: a cancel does not cut it short)."""
        aa = slot_lines(runner.slots_json())
        if runner.ended_on:
            self.slot_text[0] = f"{self.slots[0].label}: runs {runner.ended_on}"
        elif 0 in self._on_slot:  # cancelled or failed: the dashboard's server stays as the race left it
            self.slot_text[0] = f"{self.slots[0].label}: tune {runner.status}; last launched {self._on_slot[0]}"
        if self.is_attached:
            for line in aa:
                self.say(line)
            self.say("killing the other slots' servers and confirming their GPUs free…")
        try:
            self.freed = await servers.close()
        finally:
            self.servers = None
        for line in self.freed:
            for slot in self.slots[1:]:
                if line.startswith(f"{slot.label}:"):
                    self.slot_text[slot.index] = line
        if self.is_attached:
            for line in self.freed:
                self.say(line)
            self.query_one("#slots", Static).update("\n".join([aa[0], *(self.slot_text[s.index] for s in self.slots)]))

    def show(self, data: TuneResults, *, final: bool = False) -> None:
        """The leaderboards, the eliminated with why, and (final) the verdicts, best config and Pareto fronts."""
        self.data = data
        table = self.query_one(DataTable)
        table.clear(columns=True)
        header = ["shape", *board_rows(data, data.shapes[0])[0]] if data.shapes else ["shape"]
        table.add_columns(*header)
        for shape in data.shapes:
            table.add_row(shape.shape, *[""] * (len(header) - 2), shape.verdict[:60])
            for row in board_rows(data, shape)[1:]:
                table.add_row("", *row)
        out = [f"{c.label}: {c.why_out}" for c in data.out]
        self.query_one("#out", Static).update("eliminated:\n" + "\n".join(out) if out else "")
        total, energy = pareto_views(data)
        self.query_one("#pareto-total", ParetoPlot).show(total)
        self.query_one("#pareto-energy", ParetoPlot).show(energy)
        if final:  # what the server runs first: at 40 rows the rest may not fit (the plots show the fronts)
            lines = [f"the server runs {data.ended_on}"] if data.ended_on else []
            self.query_one("#summary", Static).update("\n".join([*lines, *summary_lines(data)]))
            for line in pareto_lines(data):
                self.say(line)



def start_tune(dashboard: Dashboard) -> None:
    """`t`: the tune screen over the dashboard (the dashboard refused it already while read-only or busy)."""
    profile = dashboard.session.profile
    if profile.tune is None:
        dashboard.notify(f"{profile.name} has no [tune] table; add one to the profile (README: tunedash tune)",
                         severity="warning")
        return
    dashboard.app.push_screen(TuneScreen(dashboard))
