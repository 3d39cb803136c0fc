"""Provides ThroughputChart: tokens/s per source over the last minutes, acceptance length, relaunch markers.

A PlotextPlot subclass that draws on its own figure (never the global plotext module). New data only
marks the chart dirty; a timer replots at most every `min_interval_s` (0.5 s) and only when something
changed and the chart is on screen. Points are averaged into about one bucket per plot column.

Drawing is cached: PlotextPlot.render rebuilds the whole figure and re-parses its ANSI text on every
refresh (about 30 ms for a 60x20 chart), and Textual refreshes a widget for reasons other than new data
(a border title set, a layout pass). `render()` returns the Text built at the last replot unless the size or
the theme changed since, and `render_line()` keeps the lines made from it (turning plotext's thousands of
styled spans into strips costs as much again), so only a replot pays; a new border subtitle (the app's
latest figures, once a second) only redraws the border.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from rich.text import Text
from textual.app import RenderResult
from textual.color import Color
from textual.strip import Strip
from textual_plotext import PlotextPlot

from app.core.model import ThroughputPoint


@dataclass(frozen=True)
class RelaunchMarker:
    """A relaunch at wall-clock time `at`, labelled with what changed ("steps 1 -> 3")."""

    at: float
    label: str


SOURCE_COLOURS = {"log": "primary", "metrics": "success", "probe": "accent"}
"""Theme variable per throughput source; unknown sources use "secondary"."""
ACCEPT_COLOUR = "warning"
MARKER_COLOUR = "error"


def downsample(
    points: Iterable[tuple[float, float]], start: float, end: float, buckets: int
) -> list[tuple[float, float]]:
    """Average (x, y) points into at most `buckets` equal x-intervals of [start, end].

    Each non-empty bucket yields (mean x, mean y); points outside the range are dropped.
    """
    if buckets <= 0 or end <= start:
        return []
    width = (end - start) / buckets
    sums: dict[int, list[float]] = {}
    for x, y in points:
        if x < start or x > end:
            continue
        b = min(buckets - 1, int((x - start) / width))
        acc = sums.setdefault(b, [0.0, 0.0, 0.0])
        acc[0] += x
        acc[1] += y
        acc[2] += 1
    return [(acc[0] / acc[2], acc[1] / acc[2]) for _, acc in sorted(sums.items())]


def nice_ceiling(value: float) -> float:
    """The next "round" number at or above value: 1, 2, 2.5, 5 times a power of ten."""
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * exp >= value:
            return step * exp
    return 10.0 * exp


def _ticks(top: float, count: int = 5) -> tuple[list[float], list[str]]:
    """`count` evenly spaced ticks from 0 to top, labelled without trailing zeros.

    Few enough ticks that plotext never has to thin them out (its thinning is not stable).
    """
    values = [top * i / (count - 1) for i in range(count)]
    return values, [f"{v:g}" for v in values]


MARKER_LABEL_CHARS = 28
"""Relaunch labels longer than this are cut with an ellipsis."""
LABEL_ROWS = (0.8, 0.68, 0.56)
"""Heights (fractions of the y axis) that successive markers' labels cycle through, so neighbours do not overlap;
below the legend (top left, three rows), which a label at the top covered."""


def marker_label_places(
    markers: Sequence[RelaunchMarker], start: float, end: float, column_s: float
) -> list[tuple[float, float, Literal["left", "right"]]]:
    """Where each marker's label goes: (x in seconds before `end`, height as a fraction of the y axis, alignment).

    A label sits beside its line, one column away: left of it when it fits there (a fresh relaunch is at the
    right edge, where a centred label was cut off), else right of it when it fits there, else on the side
    with more room. `column_s` is the width of one plot column in seconds.
    """
    places: list[tuple[float, float, Literal["left", "right"]]] = []
    for index, marker in enumerate(markers):
        row = LABEL_ROWS[index % len(LABEL_ROWS)]
        width_s = (len(short_label(marker.label)) + 1) * column_s
        room_left, room_right = marker.at - start, end - marker.at
        if room_left >= width_s or (room_right < width_s and room_left >= room_right):
            places.append((marker.at - end - column_s, row, "right"))
        else:
            places.append((marker.at - end + column_s, row, "left"))
    return places


def short_label(label: str, limit: int = MARKER_LABEL_CHARS) -> str:
    """The label, cut with an ellipsis past `limit` characters."""
    return label if len(label) <= limit else label[: limit - 1] + "…"


class ThroughputChart(PlotextPlot):
    """Tokens/s (left axis) by source and acceptance length (right axis) over `window_s` seconds.

    Feed it with `update(points, now, markers)`; `now` is wall-clock (time.time(), the clock of
    ThroughputPoint.at) and is the right edge of the x axis, which reads seconds before now.
    The tokens/s axis is fixed from 0 to a round ceiling that only grows (call `reset_scale()` after
    a change of model); acceptance length is fixed from 0 to a round ceiling too.
    """

    DEFAULT_CSS = """
    ThroughputChart {
        height: 1fr;
        min-height: 8;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
    }
    """

    def __init__(
        self,
        window_s: float = 300.0,
        min_interval_s: float = 0.5,
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.border_title = "tokens/s"
        self.window_s = window_s
        self.min_interval_s = min_interval_s
        self._points: tuple[ThroughputPoint, ...] = ()
        self._markers: tuple[RelaunchMarker, ...] = ()
        self._now = 0.0
        self._dirty = False
        self._y_top = 0.0
        self._accept_top = 0.0
        self.replot_count = 0
        """How many times the figure was rebuilt (tests use it to check throttling)."""
        self._version: object = None
        self._drawn: tuple[tuple[object, ...], Text] | None = None  # (size, themes, replot) -> text
        self._lines_key: tuple[object, ...] | None = None
        self._lines: dict[int, Strip] = {}

    def on_mount(self) -> None:
        """Configure the figure once and start the throttling timer."""
        self.plt.xlabel("seconds ago")
        self.set_interval(self.min_interval_s, self._flush)

    def update(
        self,
        points: Sequence[ThroughputPoint],
        now: float,
        markers: Sequence[RelaunchMarker] | None = None,
        *,
        version: object = None,
    ) -> None:
        """Store the newest data; the chart replots on the next tick only if it changed.

        `version`, when given, is a cheap key of the caller's data (the app passes the length and newest
        point of its series and the marker count): an update with the same key returns at once, without
        copying or comparing the points. Without it the points are compared.
        """
        if version is not None:
            if version == self._version:
                return
            self._version = version
        new_points = tuple(points)
        new_markers = self._markers if markers is None else tuple(markers)
        if new_points == self._points and new_markers == self._markers:
            return
        self._points = new_points
        self._markers = new_markers
        self._now = now
        self._dirty = True

    def add_marker(self, marker: RelaunchMarker) -> None:
        """Add one relaunch marker."""
        self._markers = (*self._markers, marker)
        self._dirty = True

    def reset_scale(self) -> None:
        """Let the y axes shrink again on the next replot."""
        self._y_top = 0.0
        self._accept_top = 0.0
        self._dirty = True

    @property
    def dirty(self) -> bool:
        """True when data arrived that is not drawn yet."""
        return self._dirty

    def on_resize(self) -> None:
        """A drawn chart replots at once at its new size (buckets and ticks follow the size; resizes are rare)."""
        if self.replot_count and (self._points or self._markers):
            self._dirty = True
            self._flush()

    def _flush(self) -> None:
        if self._dirty and self.shown:
            self.replot()

    @property
    def shown(self) -> bool:
        """Whether the chart is displayed on the top screen (no replot while hidden or under a modal)."""
        return self.display and self.is_on_screen and self.app.screen is self.screen

    def _colour(self, variable: str) -> tuple[int, int, int]:
        value = self.app.theme_variables.get(variable) or self.app.theme_variables.get("foreground", "white")
        return Color.parse(value).rgb

    def render(self) -> RenderResult:
        """The figure drawn at the last replot (rebuilt here only after a replot, a resize or a theme change)."""
        key: tuple[object, ...] = (self.size.width, self.size.height, self.app.theme, self.theme, self.replot_count)
        if self._drawn is None or self._drawn[0] != key:
            rendered = super().render()
            assert isinstance(rendered, Text)
            self._drawn = (key, rendered)
        return self._drawn[1]

    def render_line(self, y: int) -> Strip:
        """Line y of the figure, kept until a replot, a resize, a theme or a style change."""
        key: tuple[object, ...] = (self.size, self.app.theme, self.theme, self.replot_count, self.visual_style)
        if key != self._lines_key:
            self._lines_key = key
            self._lines = {}
        line = self._lines.get(y)
        if line is None:
            line = self._lines[y] = super().render_line(y)
        return line

    def replot(self) -> None:
        """Rebuild the figure from the stored data now (the timer calls this; tests may too)."""
        self._dirty = False
        self.replot_count += 1
        plt = self.plt
        plt.clear_data()
        start, end = self._now - self.window_s, self._now
        buckets = max(10, self.size.width - 12)
        ticks = 5 if self.size.height >= 16 else 3 if self.size.height >= 8 else 2
        by_source: dict[str, list[tuple[float, float]]] = {}
        accept: list[tuple[float, float]] = []
        for p in self._points:
            by_source.setdefault(p.source, []).append((p.at, p.tokens_per_s))
            if p.accept_len is not None:
                accept.append((p.at, p.accept_len))
        peak = max((p.tokens_per_s for p in self._points if start <= p.at <= end), default=0.0)
        self._y_top = max(self._y_top, nice_ceiling(peak * 1.1))
        plt.ylim(0, self._y_top, yside="left")  # type: ignore[arg-type]
        plt.yticks(*_ticks(self._y_top, ticks), yside="left")  # type: ignore[arg-type]
        plt.xlim(-self.window_s, 0)
        for source, series in sorted(by_source.items()):
            xy = downsample(series, start, end, buckets)
            if not xy:
                continue
            plt.plot(
                [x - end for x, _ in xy],
                [y for _, y in xy],
                marker="braille",
                color=self._colour(SOURCE_COLOURS.get(source, "secondary")),
                label=f"{source} tok/s",
            )
        accept_xy = downsample(accept, start, end, buckets)
        if accept_xy:
            self._accept_top = max(self._accept_top, nice_ceiling(max(y for _, y in accept_xy) * 1.1))
            plt.ylim(0, self._accept_top, yside="right")  # type: ignore[arg-type]
            plt.yticks(*_ticks(self._accept_top, ticks), yside="right")  # type: ignore[arg-type]
            plt.plot(
                [x - end for x, _ in accept_xy],
                [y for _, y in accept_xy],
                marker="braille",
                color=self._colour(ACCEPT_COLOUR),
                yside="right",
                label="accept len",
            )
        marker_colour = self._colour(MARKER_COLOUR)
        visible = [m for m in self._markers if start <= m.at <= end]
        column_s = self.window_s / buckets
        for marker, (x, row, align) in zip(visible, marker_label_places(visible, start, end, column_s), strict=True):
            plt.vline(marker.at - end, marker_colour)
            plt.text(short_label(marker.label), x, self._y_top * row, color=marker_colour, alignment=align)
        self.refresh()
