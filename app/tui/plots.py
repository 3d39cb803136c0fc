"""Turns history rows and experiment results into the plain views of widgets.arm_plot.

`compare_plots_view` takes an experiment's typed report (app.core.measure.results.ExperimentReport: a stored run's
`report.run_report(run).experiment`, or a live `ExperimentResult.report()`) and the run's stored requests
(`HistoryStore.request_rows`, `RequestRow`s); `trend_view` takes the runs of the store. Values that are not finite
are left out here, so a widget only sees plottable floats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from app.core.measure.results import ExperimentReport
from app.core.measure.store import HistoryStore, RequestRow, RunRow
from widgets.arm_plot import (
    ArmValuesView,
    ComparePlotsView,
    DistributionView,
    LaunchPlotView,
    TrendPoint,
    TrendSeries,
    TrendView,
)

TREND_RUNS = 100
"""How many of the profile's newest runs the trend plot looks through."""


def _finite(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(v for v in values if math.isfinite(v))


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def launch_plot_view(report: ExperimentReport) -> LaunchPlotView:
    """Each arm's launch values (the launch means) with its mean and 95% interval."""
    arms = tuple(
        ArmValuesView(label=arm.label, values=_finite(arm.launch_values), mean=_finite_or_none(arm.mean),
                      interval=arm.ci95 if arm.ci95 is not None and all(map(math.isfinite, arm.ci95)) else None)
        for arm in report.arms)
    return LaunchPlotView(arms, unit="launch")


def distribution_views(labels: Sequence[str], rows: Iterable[RequestRow]) -> tuple[DistributionView,
                                                                                    DistributionView]:
    """TTFT and ITL (the request's mean time per output token after the first) in ms, per arm, from the
    finished requests' rows; a row of an arm the labels do not name, or a failed request, is left out."""
    ttft: list[list[float]] = [[] for _ in labels]
    itl: list[list[float]] = [[] for _ in labels]
    for row in rows:
        if not 0 <= row.arm_idx < len(labels) or not row.ok:
            continue
        for value, into in ((row.ttft_s, ttft), (row.tpot_s, itl)):
            if value is not None and math.isfinite(value) and value >= 0:
                into[row.arm_idx].append(value * 1000.0)
    return (DistributionView("TTFT ms", tuple((label, tuple(v)) for label, v in zip(labels, ttft, strict=True))),
            DistributionView("ITL ms", tuple((label, tuple(v)) for label, v in zip(labels, itl, strict=True))))


def compare_plots_view(report: ExperimentReport, rows: Iterable[RequestRow] = ()) -> ComparePlotsView:
    """The compare view's three plots from an experiment's report and the run's stored requests."""
    ttft, itl = distribution_views([arm.label for arm in report.arms], rows)
    return ComparePlotsView(launch_plot_view(report), ttft, itl)


def run_value(run: RunRow, arm_idx: int) -> float | None:
    """What the trend plots for one arm of a run: the mean of its successful trial values (a bench: its one
    trial's output tok/s)."""
    values = run.values(arm_idx)
    return sum(values) / len(values) if values else None


def trend_view(run: RunRow, others: Iterable[RunRow]) -> TrendView:
    """Every config (arm flags) of `run` across the runs of its profile that measured the same flags, oldest
    first; `others` are the profile's runs with their arms and trials (run itself may be among them)."""
    by_id = {r.id: r for r in others if r.profile == run.profile}
    by_id[run.id] = run
    series = []
    for arm in run.arms:
        points = []
        for other in sorted(by_id.values(), key=lambda r: r.id):
            match = next((a for a in other.arms if a.flags == arm.flags), None)
            value = None if match is None else run_value(other, match.idx)
            if value is not None:
                points.append(TrendPoint(other.id, value))
        label = arm.overrides or ("the profile" if run.kind == "ab" else "running flags")
        series.append(TrendSeries(f"{arm.label}: {label}" if run.kind == "ab" else label, tuple(points)))
    count = len({p.run_id for s in series for p in s.points})
    return TrendView(f"tok/s of {run.profile}'s config{'s' if len(series) > 1 else ''} over {count} run(s)",
                     tuple(series), current=run.id)


class RunCache:
    """Stored runs by id, read once each (a finished run does not change; a running one is read again).

    Its reads are SQLite's: the screens call it from a thread worker, never on the event loop."""

    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        self._runs: dict[int, RunRow] = {}
        self._requests: dict[int, list[RequestRow]] = {}

    def get(self, run_id: int) -> RunRow | None:
        cached = self._runs.get(run_id)
        if cached is not None and cached.status != "running":
            return cached
        run = self.store.run(run_id)
        if run is not None:
            self._runs[run_id] = run
        return run

    def request_rows(self, run: RunRow) -> list[RequestRow]:
        """A run's per-request rows (the distributions), read once for a finished run."""
        if run.status == "running":
            return self.store.request_rows(run.id)
        if run.id not in self._requests:
            self._requests[run.id] = self.store.request_rows(run.id)
        return self._requests[run.id]

    def profile_runs(self, profile: str, listed: Iterable[RunRow]) -> list[RunRow]:
        """The listed runs of one profile (at most TREND_RUNS), with their arms and trials."""
        ids = [r.id for r in listed if r.profile == profile][:TREND_RUNS]
        return [run for run in (self.get(i) for i in ids) if run is not None]
