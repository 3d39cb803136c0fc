"""Provides the tune screen's Pareto plot (textual-plotext): every (candidate, shape) point and the front through
the points no other beats on both axes, as `vllm bench sweep plot_pareto` draws them.

The widget takes a ParetoView (built by app.tui.tune from a tune's results JSON) and redraws only on a new view;
a view with no point shows one line saying so.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot


@dataclass(frozen=True)
class ParetoView:
    """The points (x, y) of every candidate at every shape, and the front's points in x order."""

    title: str
    x_label: str
    y_label: str
    points: tuple[tuple[float, float], ...] = ()
    front: tuple[tuple[float, float], ...] = ()


class ParetoPlot(PlotextPlot):
    """All points as dots, the front as a line with its points marked."""

    DEFAULT_CSS = """
    ParetoPlot { width: 1fr; height: 1fr; min-width: 20; }
    """

    def __init__(self, view: ParetoView | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = view or ParetoView("", "", "")

    def show(self, view: ParetoView) -> None:
        if view != self.view:
            self.view = view
            self.refresh()

    def render(self) -> RenderResult:
        plt = self.plt
        plt.clear_figure()
        if not self.view.points:
            return Text(f"{self.view.title}: no points yet", style="italic", justify="center")
        xs, ys = zip(*self.view.points, strict=True)
        plt.scatter(list(xs), list(ys), marker="dot", color="cyan")
        if self.view.front:
            fx, fy = zip(*self.view.front, strict=True)
            plt.plot(list(fx), list(fy), marker="x", color="orange")
        plt.xlabel(self.view.x_label)
        plt.ylabel(self.view.y_label)
        title = self.view.title if len(self.view.title) <= self.size.width - 2 else ""
        plt.title(title)
        return super().render()
