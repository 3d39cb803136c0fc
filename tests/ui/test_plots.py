"""The compare plots (widgets.arm_plot) in a running app: what they draw, how they degrade, the history screen's
plots and compare screen, and the SVG of `tunedash export ID --format svg`."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Static

from app.core.measure.client import RequestResult
from app.core.measure.report import run_report
from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from app.tui.bench import HistoryScreen
from app.tui.compare import CompareScreen, compare_svg, svg_size
from tests.helpers import pilot_until
from widgets.arm_plot import (
    ArmValuesView,
    ComparePlots,
    ComparePlotsView,
    DistributionPlot,
    DistributionView,
    LaunchPlot,
    LaunchPlotView,
    TrendPlot,
    TrendPoint,
    TrendSeries,
    TrendView,
)

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")


def _text(plot: LaunchPlot | DistributionPlot | TrendPlot) -> str:
    rendered = plot.render()
    return str(getattr(rendered, "plain", rendered))


class PlotsApp(App[None]):
    def __init__(self, view: ComparePlotsView, trend: TrendView | None = None) -> None:
        super().__init__()
        self.view = view
        self.trend = trend or TrendView("", ())

    def compose(self) -> ComposeResult:
        yield ComparePlots(self.view)
        yield TrendPlot(self.trend)


TWO_ARMS = ComparePlotsView(
    LaunchPlotView((ArmValuesView("A", (100.0, 103.0), 101.5, (90.0, 113.0)),
                    ArmValuesView("B", (130.0, 128.0), 129.0, (120.0, 138.0)))),
    DistributionView("TTFT ms", (("A", (50.0, 55.0, 61.0, 70.0)), ("B", (40.0, 42.0, 47.0)))),
    DistributionView("ITL ms", (("A", (10.0, 11.0)), ("B", (7.0, 7.5)))),
)


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_two_arms_draw_their_labels_titles_and_axes(size: tuple[int, int]) -> None:
    app = PlotsApp(TWO_ARMS, TrendView("tok/s over 3 run(s)", (TrendSeries("A: the profile", (
        TrendPoint(3, 100.0), TrendPoint(5, 104.0), TrendPoint(9, 101.0))),), current=5))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        launch = _text(app.query_one(LaunchPlot))
        assert "A" in launch and "B" in launch and "tok/s per launch" in launch
        assert "┤" in launch  # a y axis with ticks: a plot, not the empty message
        ttft = _text(app.query_one("#ttft-plot", DistributionPlot))
        assert "TTFT ms" in ttft and "A┤" in ttft and "B┤" in ttft
        if size[0] >= 120:
            assert "A n=4 / B n=3" in ttft
        trend = _text(app.query_one(TrendPlot))
        assert "#3" in trend and "#9" in trend


async def test_nothing_to_draw_says_what_is_missing() -> None:
    empty = ComparePlotsView(LaunchPlotView((ArmValuesView("A", (), None, None),), unit="launch"),
                             DistributionView("TTFT ms", (("A", ()),)), DistributionView("ITL ms", ()))
    app = PlotsApp(empty)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert _text(app.query_one(LaunchPlot)) == "no launch values yet"
        assert _text(app.query_one("#ttft-plot", DistributionPlot)) == "TTFT ms: no finished requests"
        assert _text(app.query_one("#itl-plot", DistributionPlot)) == "ITL ms: no finished requests"
        assert _text(app.query_one(TrendPlot)) == "no finished run of this config yet"


async def test_one_arm_one_value_and_no_interval_still_plot() -> None:
    one = ComparePlotsView(LaunchPlotView((ArmValuesView("running", (42.0,), 42.0, None),), unit="trial"),
                           DistributionView("TTFT ms", (("running", (5.0,)),)),
                           DistributionView("ITL ms", (("running", (1.0, 1.0)),)))
    app = PlotsApp(one)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        launch = _text(app.query_one(LaunchPlot))
        assert "running" in launch and "tok/s per trial" in launch and "42" in launch
        assert "running┤" in _text(app.query_one("#ttft-plot", DistributionPlot))
        assert "running┤" in _text(app.query_one("#itl-plot", DistributionPlot))


async def test_show_replaces_the_view() -> None:
    app = PlotsApp(ComparePlotsView(LaunchPlotView(()), DistributionView("TTFT ms", ()),
                                    DistributionView("ITL ms", ())))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert _text(app.query_one(LaunchPlot)).startswith("no launch values")
        app.query_one(ComparePlots).show(TWO_ARMS)
        await pilot.pause()
        assert "tok/s per launch" in _text(app.query_one(LaunchPlot))
        assert "TTFT ms" in _text(app.query_one("#ttft-plot", DistributionPlot))


def _requests(ttft: float, tpot: float, n: int) -> list[RequestResult]:
    return [RequestResult(ok=True, output_tokens=11, ttft_s=ttft + i * 0.001, latency_s=ttft + 10 * tpot)
            for i in range(n)]


def _ab_store(path: Path) -> tuple[HistoryStore, int, int]:
    """A bench of the profile's flags, then an A/B of them against steps=3, two launches of two trials each."""
    store = HistoryStore(path)
    bench = store.start_run("bench", profile="demo", host="sim", backend="sglang", model="m",
                            params={"bench": {"requests": 4}, "trials": 1}, arms=[("running", "", {"steps": 1})])
    store.add_trial(bench, 0, 0, value=98.0, summary={"output_tok_s": 98.0, "requests": 4, "completed": 4},
                    accept_len=None, accept_source="", requests=_requests(0.05, 0.01, 4))
    store.finish_run(bench, "done")
    ab = store.start_run("ab", profile="demo", host="sim", backend="sglang", model="m",
                         params={"bench": {"requests": 4, "concurrency": 2}, "trials": 2},
                         arms=[("A", "", {"steps": 1}), ("B", "steps=3", {"steps": 3})])
    for arm, values in ((0, (100.0, 101.0, 104.0, 105.0)), (1, (131.0, 132.0, 127.0, 128.0))):
        for k, value in enumerate(values):
            store.add_trial(ab, arm, k % 2, value=value, summary={"requests": 4, "errors": 0, "output_tokens": 40},
                            accept_len=None, accept_source="", requests=_requests(0.06 - 0.01 * arm, 0.01, 4),
                            launch_idx=k // 2)
    store.finish_run(ab, "done")
    return store, bench, ab


class HistoryApp(App[None]):
    def __init__(self, store: HistoryStore) -> None:
        super().__init__()
        self.store = store

    def on_mount(self) -> None:
        self.push_screen(HistoryScreen(self.store))


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_history_plots_the_highlighted_run_and_opens_its_compare_screen(tmp_path: Path,
                                                                             size: tuple[int, int]) -> None:
    store, bench, ab = _ab_store(tmp_path / "h.sqlite3")
    app = HistoryApp(store)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        # the store is read in a thread worker: the newest run, highlighted, shows once it has been read
        await pilot_until(pilot, lambda: screen.shown_run is not None, what="the newest run's detail")
        assert screen.shown_run is not None and screen.shown_run.id == ab
        plots = screen.query_one(ComparePlots).view
        assert [a.values for a in plots.launches.arms] == [(100.5, 104.5), (131.5, 127.5)]
        assert plots.launches.unit == "launch"
        assert [len(v) for _, v in plots.ttft.arms] == [16, 16]
        trend = screen.query_one(TrendPlot).view
        assert [[p.run_id for p in s.points] for s in trend.series] == [[bench, ab], [ab]]
        assert screen.query_one(TrendPlot).region.height > 0 and screen.query_one(LaunchPlot).region.width > 0
        await pilot.press("down")  # the bench: one arm, its one trial
        await pilot_until(pilot, lambda: screen.shown_run is not None and screen.shown_run.id == bench,
                          what="the bench's detail")
        bench_view = screen.query_one(ComparePlots).view
        assert [a.label for a in bench_view.launches.arms] == ["running"]
        await pilot.press("up", "enter")  # enter before the detail of the run above has been read: still that run
        await pilot_until(pilot, lambda: isinstance(app.screen, CompareScreen), what="the compare screen")
        compare = app.screen
        assert isinstance(compare, CompareScreen) and compare.report.run.id == ab
        assert compare.query_one(DataTable).row_count == 2
        assert "faster" in str(compare.query_one("#verdict", Static).render())
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen


async def test_svg_of_a_run_from_before_launches(tmp_path: Path) -> None:
    """An A/B stored before launch_idx existed reads as one launch per arm: it still renders, by trials."""
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        ab = store.start_run("ab", profile="demo", host="sim", backend="sglang", model="m", params={},
                             arms=[("A", "", {}), ("B", "x=1", {"x": 1})])
        store.add_trial(ab, 0, 0, value=10.0, summary={}, accept_len=None, accept_source="", requests=[])
        store.finish_run(ab, "cancelled")
        run = store.run(ab)
        assert run is not None
        svg = await compare_svg(run, store.request_rows(ab))
    text = _svg_text(svg)
    assert "ab #" in text and "no finished requests" in text


def _svg_text(svg: str) -> str:
    root = ET.fromstring(svg)
    lines = ["".join(e.itertext()) for e in root.iter() if e.tag.endswith("text")]
    return "".join(lines).replace("\xa0", " ")


def test_export_svg_writes_the_compare_screen(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    store, _bench, ab = _ab_store(data / "history.sqlite3")
    run = store.run(ab)
    store.close()
    assert run is not None
    out = tmp_path / "run.svg"
    env = {**os.environ, DATA_DIR_ENV: str(data)}
    done = subprocess.run([sys.executable, "-m", "app", "export", str(ab), "--format", "svg", "-o", str(out)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    svg = out.read_text(encoding="utf-8")
    text = _svg_text(svg)  # parses as XML
    verdict = run_report(run).verdict
    assert verdict and verdict[:40] in text
    assert "TTFT ms" in text and "ITL ms" in text and "tok/s per launch" in text
    missing = subprocess.run([sys.executable, "-m", "app", "export", "999", "--format", "svg"],
                             env=env, capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode != 0 and "no run #999" in missing.stderr


def test_svg_is_widened_to_show_the_whole_table() -> None:
    assert svg_size([["arm", "x" * 10]]) == (120, 40)
    assert svg_size([["a" * 150]]) == (154, 40)  # the text, a cell's padding, the screen's edge
    assert svg_size([["a" * 500]]) == (200, 40)
