"""Turns history rows and experiment results into the plain views of widgets.arm_plot.

`compare_plots_view` takes an experiment's JSON (app.core.measure.report.run_json of a stored run, or a live
ExperimentResult.to_json()) and the run's per-request rows (HistoryStore.request_rows); `trend_view` takes the
runs of the store. Values that are missing, not numbers or not finite are left out here, so a widget only sees
floats; an older run without launch values is plotted by its trial values (the plot says which).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from app.core.measure.store import HistoryStore, RunRow
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


def _number(value: object) -> float | None:
    """A finite float, or None for anything else (bools, strings, NaN, None)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _numbers(values: object) -> tuple[float, ...]:
    if not isinstance(values, list | tuple):
        return ()
    return tuple(x for x in (_number(v) for v in values) if x is not None)


def _interval(value: object) -> tuple[float, float] | None:
    pair = _numbers(value)
    return (min(pair), max(pair)) if len(pair) == 2 else None


def launch_plot_view(data: Mapping[str, Any]) -> LaunchPlotView:
    """Each arm's launch values (`launch_values`) with its mean and 95% interval; an older result that has no
    launch values shows its trial values instead (unit "trial")."""
    arms_json = [a for a in data.get("arms") or [] if isinstance(a, Mapping)]
    by_launch = all("launch_values" in a for a in arms_json) and bool(arms_json)
    arms = tuple(
        ArmValuesView(label=str(a.get("label", "?")),
                      values=_numbers(a.get("launch_values") if by_launch else a.get("trials")),
                      mean=_number(a.get("mean")), interval=_interval(a.get("ci95")))
        for a in arms_json)
    return LaunchPlotView(arms, unit="launch" if by_launch else "trial")


def _labels(data: Mapping[str, Any]) -> list[str]:
    return [str(a.get("label", "?")) for a in data.get("arms") or [] if isinstance(a, Mapping)]


def distribution_views(labels: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> tuple[DistributionView,
                                                                                           DistributionView]:
    """TTFT and ITL (the request's mean time per output token after the first) in ms, per arm, from the
    finished requests' rows; a row of an arm the labels do not name, or a failed request, is left out."""
    ttft: list[list[float]] = [[] for _ in labels]
    itl: list[list[float]] = [[] for _ in labels]
    for row in rows:
        arm = row.get("arm_idx")
        if not isinstance(arm, int) or not 0 <= arm < len(labels) or not row.get("ok"):
            continue
        for key, into in (("ttft_s", ttft), ("tpot_s", itl)):
            value = _number(row.get(key))
            if value is not None and value >= 0:
                into[arm].append(value * 1000.0)
    return (DistributionView("TTFT ms", tuple((label, tuple(v)) for label, v in zip(labels, ttft, strict=True))),
            DistributionView("ITL ms", tuple((label, tuple(v)) for label, v in zip(labels, itl, strict=True))))


def compare_plots_view(data: Mapping[str, Any], rows: Iterable[Mapping[str, Any]] = ()) -> ComparePlotsView:
    """The compare view's three plots from an experiment's JSON and the run's request rows."""
    ttft, itl = distribution_views(_labels(data), rows)
    return ComparePlotsView(launch_plot_view(data), ttft, itl)


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
    """Stored runs by id, read once each (a finished run does not change; a running one is read again)."""

    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        self._runs: dict[int, RunRow] = {}
        self._requests: dict[int, list[dict[str, Any]]] = {}

    def get(self, run_id: int) -> RunRow | None:
        cached = self._runs.get(run_id)
        if cached is not None and cached.status != "running":
            return cached
        run = self.store.run(run_id)
        if run is not None:
            self._runs[run_id] = run
        return run

    def request_rows(self, run: RunRow) -> list[dict[str, Any]]:
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
