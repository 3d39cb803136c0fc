"""Snapshot of the compare plots (widgets.arm_plot) with fixed views at 80x24 and 120x40."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from textual.app import App, ComposeResult

from widgets.arm_plot import (
    ArmValuesView,
    ComparePlots,
    ComparePlotsView,
    DistributionView,
    LaunchPlotView,
    TrendPlot,
    TrendPoint,
    TrendSeries,
    TrendView,
)

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

VIEW = ComparePlotsView(
    LaunchPlotView((ArmValuesView("A", (123.2, 124.3), 123.7, (118.8, 128.7)),
                    ArmValuesView("B", (176.8, 162.6), 169.7, (150.0, 189.4)))),
    DistributionView("TTFT ms", (("A", (70.0, 80.0, 85.0, 90.0, 99.0, 120.0)), ("B", (60.0, 62.0, 70.0, 75.0)))),
    DistributionView("ITL ms", (("A", (28.0, 29.0, 30.5, 31.0)), ("B", (17.0, 18.5, 19.0, 21.0)))),
)
TREND = TrendView("tok/s of demo's configs over 4 run(s)", (
    TrendSeries("A: the profile", (TrendPoint(1, 121.0), TrendPoint(2, 124.0), TrendPoint(4, 123.7))),
    TrendSeries("B: steps=3", (TrendPoint(3, 171.0), TrendPoint(4, 169.7))),
), current=4)


class PlotsApp(App[None]):
    CSS = "TrendPlot { height: 1fr; }"

    def compose(self) -> ComposeResult:
        yield ComparePlots(VIEW)
        yield TrendPlot(TREND)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_compare_plots(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    assert snap_compare(PlotsApp(), terminal_size=size)
