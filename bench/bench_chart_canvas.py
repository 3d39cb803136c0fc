"""The live chart's own braille canvas against a textual-plotext PlotextPlot drawing the same data: CPU per replot.

Run: .venv/bin/python bench/bench_chart_canvas.py [--rounds 5] [--frames 30] [--size 120x40]

Both run headless (App.run_test) at the same terminal size, each with one chart filling the screen above a
one-line header (the dashboard's chart is about 2/3 of the width; here it is the full width, which favours
neither). Each frame adds one second of data (three sources at 1 Hz, acceptance length on the probe's points,
a relaunch marker every 60 s, a 300 s window), asks the widget to redraw, and waits until the frame is painted
(the widget's lines rendered by the compositor). CPU is this process's user+sys time (time.process_time) per
frame; a frame that only changes the header's text (no chart redraw) is measured the same way and subtracted,
so the figure is the chart's own cost. The two widgets alternate round by round; medians over the rounds and
the ratio plotext / canvas are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from textual.app import App, ComposeResult
from textual.widgets import Static
from textual_plotext import PlotextPlot

from app.core.data import RelaunchMarker, ThroughputPoint
from widgets.throughput_chart import ThroughputChart, downsample

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

WINDOW_S = 300.0
SOURCES = ("log", "metrics", "probe")


def make_points(now: float, seconds: int) -> tuple[list[ThroughputPoint], list[RelaunchMarker]]:
    points = []
    markers = []
    for s in range(seconds):
        at = now - seconds + s
        for k, source in enumerate(SOURCES):
            value = 900 + 120 * k + 60 * ((s * 7 + k * 13) % 11) / 11
            points.append(ThroughputPoint(at, value, source, accept_len=2.4 + (s % 5) / 10 if k == 2 else None))
        if s % 60 == 30:
            markers.append(RelaunchMarker(at, f"steps {1 + s // 60} -> {2 + s // 60}"))
    return points, markers


class PlotextChart(PlotextPlot):
    """The same figure through textual-plotext: a line per source, acceptance on the right, marker lines."""

    def __init__(self) -> None:
        super().__init__()
        self.points: list[ThroughputPoint] = []
        self.markers: list[RelaunchMarker] = []
        self.now = 0.0
        self.drawn = 0

    def render(self):  # type: ignore[no-untyped-def]
        self.drawn += 1
        plt = self.plt
        plt.clear_figure()
        start = self.now - WINDOW_S
        buckets = max(1, 2 * self.size.width)
        for source in SOURCES:
            series = downsample(((p.at, p.tokens_per_s) for p in self.points if p.source == source),
                                start, self.now, buckets)
            if series:
                plt.plot([x - self.now for x, _ in series], [y for _, y in series], label=source)
        accept = downsample(((p.at, p.accept_len) for p in self.points if p.accept_len is not None),
                            start, self.now, buckets)
        if accept:
            plt.plot([x - self.now for x, _ in accept], [y for _, y in accept], yside="right", label="accept")
        for m in self.markers:
            if m.at >= start:
                plt.vline(m.at - self.now)
        plt.xlabel("seconds ago")
        return super().render()


class CountedCanvasChart(ThroughputChart):
    """The dashboard's chart, counting the figures it draws (to check that every frame painted one)."""

    drawn = 0

    def draw(self, width: int, height: int):  # type: ignore[no-untyped-def]
        self.drawn += 1
        return super().draw(width, height)


class ChartApp(App[None]):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def compose(self) -> ComposeResult:
        yield Static("header", id="header")
        yield (CountedCanvasChart(window_s=WINDOW_S, own_timer=False) if self.kind == "canvas" else PlotextChart())


async def frames(kind: str, count: int, size: tuple[int, int], redraw: bool) -> float:
    """CPU seconds per frame over `count` frames (the chart redrawn in each when `redraw`)."""
    app = ChartApp(kind)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        chart: CountedCanvasChart | PlotextChart = (
            app.query_one(CountedCanvasChart) if kind == "canvas" else app.query_one(PlotextChart))
        header = app.query_one("#header", Static)
        now = time.time()
        points, markers = make_points(now, int(WINDOW_S))
        await pilot.pause()
        drawn_before = chart.drawn
        cpu = 0.0
        for i in range(count):
            now += 1.0
            new, _ = make_points(now, 1)
            points = [p for p in points if p.at >= now - WINDOW_S] + new
            t0 = time.process_time()
            header.update(f"frame {i}")
            if redraw and isinstance(chart, ThroughputChart):
                chart.update(points, now, markers)
                chart.replot()
            elif redraw and isinstance(chart, PlotextChart):
                chart.points, chart.markers, chart.now = points, markers, now
                chart.refresh()
            await pilot.pause()
            cpu += time.process_time() - t0
        painted = chart.drawn - drawn_before
        if painted != (count if redraw else 0):
            raise SystemExit(f"{kind}: {painted} figures drawn in {count} frames; the measurement is off")
    return cpu / count


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--size", default="120x40", help="terminal columns x rows")
    args = parser.parse_args()
    cols, rows = (int(v) for v in args.size.split("x"))
    results: dict[str, list[float]] = {"canvas": [], "plotext": [], "header only": []}
    for _ in range(args.rounds):
        results["header only"].append(await frames("canvas", args.frames, (cols, rows), redraw=False))
        for kind in ("canvas", "plotext"):
            results[kind].append(await frames(kind, args.frames, (cols, rows), redraw=True))
    base = statistics.median(results["header only"])
    print(f"{args.rounds} rounds x {args.frames} frames at {cols}x{rows} (CPU ms per frame, median; "
          f"header-only frame {base * 1000:.2f} ms subtracted)")
    own = {k: statistics.median(v) - base for k, v in results.items() if k != "header only"}
    for kind, value in own.items():
        spread = ", ".join(f"{(v - base) * 1000:.1f}" for v in results[kind])
        print(f"  {kind:8s} {value * 1000:7.2f} ms  (rounds: {spread})")
    if own["canvas"] > 0:
        print(f"  plotext / canvas = {own['plotext'] / own['canvas']:.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
