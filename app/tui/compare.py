"""The compare screen of one stored run (what changed, the arms table, the verdict, the plots), and its SVG.

HistoryScreen opens CompareScreen on enter; `tunedash export ID --format svg` runs the same screen headless at
a fixed size and writes Textual's own screenshot of it (`compare_svg`), so the SVG is what the screen shows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from app.core.measure.report import RunReport, arm_rows, bench_rows, run_report
from app.core.measure.store import RequestRow, RunRow
from app.tui.plots import compare_plots_view
from widgets.arm_plot import ComparePlots

SVG_SIZE = (120, 40)
"""Columns x rows of the exported screen; wider when the arms table needs it (`svg_size`)."""
SVG_MAX_COLUMNS = 200


def _fill(table: DataTable[str], rows: list[list[str]]) -> None:
    table.clear(columns=True)
    table.add_columns(*rows[0])
    for row in rows[1:]:
        table.add_row(*row)


def run_heading(run: RunRow) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started_at))
    return f"{run.kind} #{run.id}: {run.profile} ({run.backend}, {run.model}) on {run.host}, {when}, {run.shown_status}"


def run_verdict(report: RunReport) -> str:
    """The verdict line(s) and, for an A/B, the flags that differ between the first two arms."""
    lines = [c.verdict for c in report.experiment.comparisons if c.verdict]

    def shown(value: object) -> str:
        return "unset" if value is None else str(value)

    diff = ", ".join(f"--{c.flag} {shown(c.old)} -> {shown(c.new)}" for c in report.config_diff)
    if diff:
        lines.append(f"A -> B: {diff}")
    return "\n".join(lines)


def table_rows(report: RunReport) -> list[list[str]]:
    """The screen's table: the arms for an A/B, the summary for a bench."""
    return arm_rows(report.experiment) if report.run.kind == "ab" else bench_rows(report.summary)


def svg_size(rows: list[list[str]]) -> tuple[int, int]:
    """SVG_SIZE, widened (up to SVG_MAX_COLUMNS) so that the table shows without a scroll bar."""
    # a DataTable cell is its text plus one column of padding on each side
    needed = sum(max(len(row[i]) for row in rows) + 2 for i in range(len(rows[0]))) + 2
    return (min(SVG_MAX_COLUMNS, max(SVG_SIZE[0], needed)), SVG_SIZE[1])


class CompareScreen(Screen[None]):
    """One stored run: heading, the arms table (a bench: its summary), the verdict and the compare plots."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "close", "Close")]
    DEFAULT_CSS = """
    CompareScreen #heading { padding: 0 1; text-style: bold; }
    CompareScreen DataTable { height: auto; max-height: 14; }
    CompareScreen #verdict { padding: 0 1; height: auto; color: $success; text-style: bold; }
    CompareScreen ComparePlots { height: 1fr; min-height: 10; }
    """

    def __init__(self, report: RunReport, rows: Sequence[RequestRow]) -> None:
        super().__init__()
        self.report = report
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(run_heading(self.report.run), id="heading")
            yield DataTable(id="arms", cursor_type="none", zebra_stripes=True)
            yield Static(run_verdict(self.report), id="verdict")
            yield ComparePlots(compare_plots_view(self.report.experiment, self.rows))
        yield Footer()

    def on_mount(self) -> None:
        _fill(self.query_one(DataTable), table_rows(self.report))

    def action_close(self) -> None:
        self.dismiss(None)


class _ShotApp(App[str]):
    """A bare app that shows one CompareScreen, screenshots it and exits with the SVG text."""

    def __init__(self, report: RunReport, rows: Sequence[RequestRow]) -> None:
        super().__init__()
        self.compare = CompareScreen(report, rows)

    def on_mount(self) -> None:
        self.push_screen(self.compare)


async def compare_svg(run: RunRow, rows: Sequence[RequestRow], size: tuple[int, int] | None = None) -> str:
    """The compare screen of `run` at `size` (default: `svg_size` of its table), as Textual's SVG screenshot."""
    report = run_report(run)
    app = _ShotApp(report, rows)
    size = size or svg_size(table_rows(report))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        svg = app.export_screenshot(title=f"tunedash {run.kind} #{run.id}")
    return svg
