"""Provides the A/B plots drawn with textual-plotext: each arm's launch values with its interval, per-arm
distributions (TTFT, ITL), and a config's tok/s over time.

The widgets take their own plain `...View` values (built by app.tui.plots) and redraw only when given a new
view, a new size or a new theme; the screens that hold them are static result views, not live charts (why
plotext here: docs/decisions.md#compare-plots; the live chart keeps its own canvas: docs/decisions.md#chart-canvas).
A view with nothing to draw shows one line saying what is missing instead of empty axes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult, RenderResult
from textual.containers import Horizontal
from textual_plotext import PlotextPlot

ARM_COLOURS = ("cyan", "orange", "magenta", "green")
"""plotext colour names per arm (A, B, C, D), the same in every plot of a screen."""


@dataclass(frozen=True)
class ArmValuesView:
    """One arm: its label, the values one dot each (launch means, or trial values of an older run), its mean
    and its 95% interval (None: not computable, e.g. fewer than two values)."""

    label: str
    values: tuple[float, ...]
    mean: float | None
    interval: tuple[float, float] | None


@dataclass(frozen=True)
class LaunchPlotView:
    """Every arm's values and interval; `unit` says what one dot is ("launch" or "trial")."""

    arms: tuple[ArmValuesView, ...]
    unit: str = "launch"
    metric: str = "output tok/s"


@dataclass(frozen=True)
class DistributionView:
    """One distribution per arm (label, values), e.g. TTFT in ms of every finished request of the arm."""

    title: str
    arms: tuple[tuple[str, tuple[float, ...]], ...]


@dataclass(frozen=True)
class TrendPoint:
    run_id: int
    value: float


@dataclass(frozen=True)
class TrendSeries:
    """One config's values, oldest run first."""

    label: str
    points: tuple[TrendPoint, ...]


@dataclass(frozen=True)
class TrendView:
    title: str
    series: tuple[TrendSeries, ...]
    current: int | None = None
    """The run the screen highlights (its dots are marked)."""


@dataclass(frozen=True)
class ComparePlotsView:
    launches: LaunchPlotView
    ttft: DistributionView
    itl: DistributionView


EMPTY_COMPARE = ComparePlotsView(LaunchPlotView(()), DistributionView("TTFT ms", ()), DistributionView("ITL ms", ()))


def _colour(i: int) -> str:
    return ARM_COLOURS[i % len(ARM_COLOURS)]


class _ViewPlot(PlotextPlot):
    """A PlotextPlot that draws a view on each render, or one line of text when the view has nothing to draw."""

    DEFAULT_CSS = """
    _ViewPlot { width: 1fr; height: 1fr; min-width: 20; }
    """

    def draw(self) -> str | None:
        """Fill self.plt from the view; return a message instead when there is nothing to draw."""
        raise NotImplementedError

    def fit_title(self, *titles: str) -> None:
        """The first title that fits the plot's width (plotext drops one that does not)."""
        fitting = [t for t in titles if len(t) <= self.size.width - 2]
        self.plt.title(fitting[0] if fitting else "")

    def render(self) -> RenderResult:
        self.plt.clear_figure()
        message = self.draw()
        if message is not None:
            return Text(message, style="italic", justify="center")
        return super().render()


class LaunchPlot(_ViewPlot):
    """Each arm's values as dots, with its mean (x) and 95% interval (a vertical bar) beside them."""

    def __init__(self, view: LaunchPlotView | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = view or LaunchPlotView(())

    def show(self, view: LaunchPlotView) -> None:
        if view != self.view:
            self.view = view
            self.refresh()

    def draw(self) -> str | None:
        arms = [a for a in self.view.arms if a.values or a.mean is not None]
        if not arms:
            return f"no {self.view.unit} values yet"
        plt = self.plt
        lows: list[float] = []
        for i, arm in enumerate(arms, start=1):
            colour = _colour(i - 1)
            if arm.values:
                n = len(arm.values)
                # spread the dots a little so equal values stay countable
                xs = [i - 0.15 + 0.3 * k / max(1, n - 1) if n > 1 else float(i) for k in range(n)]
                plt.scatter(xs, list(arm.values), marker="dot", color=colour)
                lows += arm.values
            if arm.interval is not None:
                lo, hi = arm.interval
                plt.plot([i + 0.3, i + 0.3], [lo, hi], color=colour, marker="hd")
                lows += [lo, hi]
            if arm.mean is not None:
                plt.scatter([i + 0.3], [arm.mean], marker="x", color=colour)
                lows.append(arm.mean)
        plt.xticks(list(range(1, len(arms) + 1)), [a.label for a in arms])
        plt.xlim(0.5, len(arms) + 0.8)
        low, high = min(lows), max(lows)
        pad = (high - low) * 0.1 or max(abs(high) * 0.02, 1.0)
        plt.ylim(low - pad, high + pad)
        unit = self.view.unit
        self.fit_title(f"{self.view.metric} per {unit} (x mean, bar 95% CI)", f"tok/s per {unit} (x mean, bar CI)",
                       f"tok/s per {unit}")
        return None


class DistributionPlot(_ViewPlot):
    """Box plots, one per arm, horizontal (arms down the side, the value along the bottom)."""

    def __init__(self, view: DistributionView | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = view or DistributionView("", ())

    def show(self, view: DistributionView) -> None:
        if view != self.view:
            self.view = view
            self.refresh()

    def draw(self) -> str | None:
        arms = [(label, values) for label, values in self.view.arms if values]
        if not arms:
            return f"{self.view.title}: no finished requests"
        plt = self.plt
        for i, (_label, values) in enumerate(arms):
            # one box per call for a colour per arm (box() colours all its boxes alike); plotext 5.3 has box(),
            # textual-plotext 1.0.1's type stub of the figure does not list it
            plt.box([i + 1], [list(values)], orientation="horizontal",  # type: ignore[attr-defined]
                    colors=[_colour(i), "default"], reset_ticks=False)
        plt.yticks(list(range(1, len(arms) + 1)), [label for label, _ in arms])
        plt.ylim(0.4, len(arms) + 0.6)
        counts = " / ".join(f"{label} n={len(v)}" for label, v in arms)
        self.fit_title(f"{self.view.title} ({counts})", self.view.title)
        return None


class TrendPlot(_ViewPlot):
    """Each series' values across runs (x: the runs, oldest left, ticked by run id)."""

    def __init__(self, view: TrendView | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = view or TrendView("", ())

    def show(self, view: TrendView) -> None:
        if view != self.view:
            self.view = view
            self.refresh()

    def draw(self) -> str | None:
        series = [s for s in self.view.series if s.points]
        if not series:
            return "no finished run of this config yet"
        ids = sorted({p.run_id for s in series for p in s.points})
        x_of = {run_id: i for i, run_id in enumerate(ids, start=1)}
        plt = self.plt
        # plotext leaves out the whole legend when a label is wider than the plot: cut them to fit
        room = max(4, self.size.width - 14)
        for i, s in enumerate(series):
            xs = [x_of[p.run_id] for p in s.points]
            ys = [p.value for p in s.points]
            label = s.label if len(s.label) <= room else s.label[: room - 1] + "…"
            plt.plot(xs, ys, marker="dot", color=_colour(i), label=label)
            marked = [(x, y) for x, y, p in zip(xs, ys, s.points, strict=True) if p.run_id == self.view.current]
            if marked:
                plt.scatter([x for x, _ in marked], [y for _, y in marked], marker="x", color=_colour(i))
        values = [p.value for s in series for p in s.points]
        low, high = min(values), max(values)
        pad = (high - low) * 0.1 or max(abs(high) * 0.02, 1.0)
        # headroom above the highest value for the legend (top left), so it covers no point
        plt.ylim(low - pad, high + pad + (high - low + pad) * 0.1 * (len(series) + 1))
        step = max(1, len(ids) // 6)
        shown = ids[::step]
        plt.xticks([x_of[r] for r in shown], [f"#{r}" for r in shown])
        plt.xlim(0.5, len(ids) + 0.5)
        self.fit_title(self.view.title, "tok/s over runs")
        return None


class ComparePlots(Horizontal):
    """The three plots of a compare view side by side: launch values with intervals, TTFT, ITL."""

    DEFAULT_CSS = """
    ComparePlots { height: 14; }
    """

    def __init__(self, view: ComparePlotsView = EMPTY_COMPARE, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = view

    def compose(self) -> ComposeResult:
        yield LaunchPlot(self.view.launches, id="launch-plot")
        yield DistributionPlot(self.view.ttft, id="ttft-plot")
        yield DistributionPlot(self.view.itl, id="itl-plot")

    def show(self, view: ComparePlotsView) -> None:
        self.view = view
        self.query_one(LaunchPlot).show(view.launches)
        self.query_one("#ttft-plot", DistributionPlot).show(view.ttft)
        self.query_one("#itl-plot", DistributionPlot).show(view.itl)
