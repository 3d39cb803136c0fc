"""Provides ThroughputChart: tokens/s per source over the last minutes, acceptance length, relaunch markers.

New data only marks the chart dirty; a timer (or the owner's tick, through flush()) replots at most every
`min_interval_s` and only when something changed and the chart is on screen. Points are averaged into one
bucket per plot column.

The chart draws its braille plot, frame, ticks, legend (on the frame's top line, over no data) and marker labels
itself on a BrailleCanvas and keeps
the strips until the next replot, resize or theme change (why not plotext: docs/decisions.md#chart-canvas).
The owner sets `figures` (a reactive: the line under the chart) as often as it likes; the chart writes it to
its border subtitle with its next replot or timer tick, only when it changed, which redraws only the border.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from rich.color import Color as RichColor
from rich.style import Style
from textual.color import Color
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from app.core.data import RelaunchMarker, ThroughputPoint
from widgets.braille_canvas import BrailleCanvas

SOURCE_COLOURS = {"log": "primary", "metrics": "success", "probe": "accent"}
"""Theme variable per throughput source; unknown sources use "secondary"."""
ACCEPT_COLOUR = "warning"
MARKER_COLOUR = "error"
LineMask = Callable[[int], bool] | None
MONOCHROME_LINES: dict[str, tuple[str, LineMask]] = {
    "log": ("━", None),
    "metrics": ("╍", lambda x: x // 4 % 2 == 0),  # dashes of two cells
    "probe": ("┈", lambda x: x % 4 == 0),  # a dot every other cell
    "accept": ("╌", lambda x: x // 2 % 3 == 0),  # a cell on, two off
}
"""Under NO_COLOR (Textual draws in greys) the series differ by line, not colour: the legend's mark and the dots a
line keeps; an unknown source is solid. With colours every line is solid and the legend's mark is "⣿"."""
COLOUR_MARK = "⣿"


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


NICE_STEPS = (1.0, 2.0, 2.5, 5.0)
"""Tick steps are one of these times a power of ten."""


def nice_axis(value: float, intervals: int) -> tuple[float, float]:
    """(top, step) of an axis from 0 that reaches `value` in at most `intervals` steps of 1, 2, 2.5 or 5 x 10^k:
    the smallest such step, and the first multiple of it at or above value (2.53 in 4 steps: top 3, step 1)."""
    value = value if value > 0 else 1.0
    intervals = max(1, intervals)
    exp = 10.0 ** math.floor(math.log10(value / intervals))
    while True:
        for mantissa in NICE_STEPS:
            step = mantissa * exp
            count = math.ceil(value / step - 1e-9)
            if count <= intervals:
                return count * step, step
        exp *= 10


def _ticks(top: float, step: float) -> tuple[list[float], list[str]]:
    """Ticks at every multiple of `step` from 0 to top, labelled without trailing zeros."""
    values = [round(i * step, 9) for i in range(math.floor(top / step + 1e-9) + 1)]
    return values, [f"{v:g}" for v in values]


MIN_SPAN_S = 30.0
"""The shortest x range: a chart with less data than this spans this many seconds."""


def x_span(data_s: float, window_s: float, intervals: int) -> tuple[float, float]:
    """(span, tick step) of the x axis, in seconds before now: the data's age (at least MIN_SPAN_S) rounded up to
    a round step in at most `intervals` steps, until that reaches the window; then the window (it scrolls)."""
    span, step = nice_axis(max(data_s, MIN_SPAN_S), intervals)
    if span >= window_s:
        return window_s, nice_axis(window_s, intervals)[1]
    return span, step


MARKER_LABEL_CHARS = 28
"""Relaunch labels longer than this are cut with an ellipsis."""
LABEL_ROWS = (0.8, 0.68, 0.56)
"""Heights (fractions of the y axis) that successive markers' labels cycle through, so neighbours do not overlap."""


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
        width_s = (len(short_label(marker.text)) + 1) * column_s
        room_left, room_right = marker.at - start, end - marker.at
        if room_left >= width_s or (room_right < width_s and room_left >= room_right):
            places.append((marker.at - end - column_s, row, "right"))
        else:
            places.append((marker.at - end + column_s, row, "left"))
    return places


def short_label(label: str, limit: int = MARKER_LABEL_CHARS) -> str:
    """The label, cut with an ellipsis past `limit` characters."""
    return label if len(label) <= limit else label[: limit - 1] + "…"


LEGEND_SHORT = {" tok/s": "", "accept len (right)": "accept →"}
"""How legend labels shorten when the full ones do not fit on the frame's top line."""


def legend_text(legend: Sequence[tuple[str, Style, str]], room: int) -> list[tuple[str, Style | None]]:
    """The legend, (label, style, mark) per series, as (text, style) runs that fit in `room` cells: "⣿ log tok/s ─
    ⣿ probe tok/s", else the short labels ("⣿ log ─ ⣿ accept →"), else as many short entries as fit."""
    def runs(labels: list[tuple[str, Style, str]]) -> list[tuple[str, Style | None]]:
        out: list[tuple[str, Style | None]] = []
        for index, (label, style, mark) in enumerate(labels):
            if index:
                out.append((" ─ ", None))
            out += [(mark, style), (f" {label}", None)]
        return out

    def short(label: str) -> str:
        for long, replacement in LEGEND_SHORT.items():
            label = label.replace(long, replacement)
        return label

    full = runs(list(legend))
    if sum(len(text) for text, _ in full) <= room:
        return full
    shortened = [(short(label), style, mark) for label, style, mark in legend]
    for count in range(len(shortened), 0, -1):
        fitted = runs(shortened[:count])
        if sum(len(text) for text, _ in fitted) <= room:
            return fitted
    return []


def draw_legend(canvas: BrailleCanvas, legend: Sequence[tuple[str, Style, str]], x0: int, x1: int) -> None:
    """The legend on the frame's top line, between its corners ("┌─ ⣿ log tok/s ─ ⣿ accept len (right) ─┐"):
    outside the plot, so it covers no data (inside the top left it hid the first minute of a fresh chart)."""
    col = x0 + 2
    runs = legend_text(legend, x1 - col - 2)
    if not runs:
        return
    canvas.text(col, 0, " ")
    col += 1
    for text, style in runs:
        canvas.text(col, 0, text, style)
        col += len(text)
    canvas.text(col, 0, " ")


class ThroughputChart(Widget):
    """Tokens/s (left axis) by source and acceptance length (right axis) over `window_s` seconds.

    Feed it with `update(points, now, markers)`; `now` is wall-clock (time.time(), the clock of
    ThroughputPoint.at) and is the right edge of the x axis, which reads seconds before now. The x axis spans the
    data (at least MIN_SPAN_S, rounded up to a round tick step) until the data is `window_s` old; from then on it
    spans the window and scrolls (docs/decisions.md#chart-axes).
    The tokens/s axis runs from 0 to a round ceiling that only grows; acceptance length from 0 to a round
    ceiling too. Ticks on both axes are multiples of 1, 2, 2.5 or 5
    times a power of ten, as many as the chart's height has room for.
    """

    DEFAULT_CSS = """
    ThroughputChart {
        height: 1fr;
        min-height: 8;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
    }
    """

    XLABEL = "seconds ago"

    figures: reactive[str] = reactive("", layout=False, repaint=False, init=False)
    """The latest figures, for the border subtitle: drawn with the next replot or timer tick (not at once, so
    a line recomputed every half second redraws the border at most every `min_interval_s`)."""

    def __init__(
        self,
        window_s: float = 300.0,
        min_interval_s: float = 0.5,
        *,
        own_timer: bool = True,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.border_title = "tokens/s"
        self.window_s = window_s
        self.min_interval_s = min_interval_s
        self.own_timer = own_timer
        """False: the owner calls flush() from its own UI tick (replots then land in the same screen update as
        the rest of the tick's changes, not in one of their own)."""
        self._last_replot = -math.inf  # time.monotonic() of the last replot
        self._points: tuple[ThroughputPoint, ...] = ()
        self._markers: tuple[RelaunchMarker, ...] = ()
        self._now = 0.0
        self._dirty = False
        self._y_peak = 0.0  # the highest value each axis has shown (with headroom): the ticks follow it
        self._accept_peak: float | None = None
        self.replot_count = 0
        """How many times the figure was rebuilt (tests use it to check throttling)."""
        self._version: object = None
        self._lines_key: tuple[object, ...] | None = None
        self._lines: list[Strip] = []
        self._canvas: BrailleCanvas | None = None
        self._style_generation = 0
        self._subtitle = ""  # the figures last written to the border

    def on_mount(self) -> None:
        """Start the throttling timer (unless the owner flushes)."""
        if self.own_timer:
            self.set_interval(self.min_interval_s, self._flush)

    def flush(self, now: float | None = None) -> bool:
        """Replot now if data arrived, the chart is shown and the last replot is `min_interval_s` old (`now`:
        time.monotonic()); for an owner that drives the chart from its own tick. True when it replotted."""
        now = time.monotonic() if now is None else now
        # 5% slack: an owner ticking every min_interval_s / n would otherwise miss by its timer's jitter
        if self._dirty and now - self._last_replot >= 0.95 * self.min_interval_s and self.shown:
            self.replot()
            return True
        return False

    def follow(self, points: Sequence[ThroughputPoint], now: float, markers: Sequence[RelaunchMarker]) -> None:
        """The caller's live series (a deque it keeps appending to) and markers: stored only when the length, the
        newest point or the markers changed, so nothing of a 4000-point series is copied while it did not."""
        key = (len(points), points[-1] if points else None, len(markers), markers[-1] if markers else None)
        if key != self._version:
            self.update(list(points), now, list(markers), version=key)

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

    @property
    def dirty(self) -> bool:
        """True when data arrived that is not drawn yet."""
        return self._dirty

    def _flush(self) -> None:
        if self.shown:
            if self._dirty:
                self.replot()
            else:
                self._write_figures()

    def _write_figures(self) -> None:
        if self.figures != self._subtitle:  # setting a border title refreshes the widget, even to the same text
            self._subtitle = self.figures
            self.border_subtitle = self.figures

    @property
    def shown(self) -> bool:
        """Whether the chart is displayed on the top screen (no replot while hidden or under a modal)."""
        return self.display and self.is_on_screen and self.app.screen is self.screen

    def _colour(self, variable: str) -> Style:
        value = self.app.theme_variables.get(variable) or self.app.theme_variables.get("foreground", "white")
        return Style(color=RichColor.from_rgb(*Color.parse(value).rgb))

    def replot(self) -> None:
        """Take the stored data into the figure now (the timer calls this; tests may too): the y scales
        follow the data in the window, and the next frame draws it."""
        self._dirty = False
        self._write_figures()
        self.replot_count += 1
        self._last_replot = time.monotonic()
        start, end = self._now - self.window_s, self._now
        peak = max((p.tokens_per_s for p in self._points if start <= p.at <= end), default=0.0)
        self._y_peak = max(self._y_peak, peak * 1.1)
        accept_peak = max((p.accept_len for p in self._points
                           if p.accept_len is not None and start <= p.at <= end), default=None)
        if accept_peak is not None:
            self._accept_peak = max(self._accept_peak or 0.0, accept_peak * 1.1)
        self.refresh()

    def notify_style_update(self) -> None:
        """Styles changed (a theme, a class, the CSS): draw again at the next frame."""
        super().notify_style_update()
        self._style_generation += 1

    def render_line(self, y: int) -> Strip:
        """Line y of the figure, drawn at the first line asked for after a replot, a resize, a theme or a style
        change, and kept until the next. (The key leaves out rich_style: computing it walks the ancestors, and
        any change of it comes with a style update.)"""
        key: tuple[object, ...] = (self.size, self.app.theme, self.replot_count, self._style_generation)
        if key != self._lines_key:
            self._lines_key = key
            self._canvas = self.draw(self.size.width, self.size.height)
            self._lines = self._canvas.strips(self.rich_style)
        if 0 <= y < len(self._lines):
            return self._lines[y]
        return Strip.blank(self.size.width, self.rich_style)

    def text(self) -> str:
        """The figure as plain text, one line per row (tests)."""
        canvas = self.draw(self.size.width, self.size.height)
        return "\n".join(canvas.row_text(row) for row in range(canvas.height))

    def draw(self, width: int, height: int) -> BrailleCanvas:
        """The figure on a canvas of `width` x `height` cells: a frame with y ticks (tokens/s left, acceptance
        length right), a braille line per source, relaunch markers with their labels, x ticks in seconds
        before now, the axis label and a legend on the frame's top line. Before the first replot: the empty frame."""
        canvas = BrailleCanvas(width, height)
        drawn = self.replot_count > 0 and bool(self._points or self._markers)
        has_xlabel = height >= 6
        # frame top, frame bottom, x tick labels (once there is data), the x label (unless the chart is tiny)
        plot_rows = height - 2 - (1 if drawn else 0) - (1 if has_xlabel else 0)
        if plot_rows < 1 or width < 8:
            return canvas
        y_intervals = 4 if height >= 16 else 2 if height >= 8 else 1
        window_start = self._now - self.window_s
        by_source: dict[str, list[tuple[float, float]]] = {}
        accept: list[tuple[float, float]] = []
        if drawn:
            for p in self._points:
                by_source.setdefault(p.source, []).append((p.at, p.tokens_per_s))
                if p.accept_len is not None:
                    accept.append((p.at, p.accept_len))
        y_top, y_step = nice_axis(self._y_peak, y_intervals)
        accept_top, accept_step = nice_axis(self._accept_peak or 0.0, y_intervals)
        left_ticks = _ticks(y_top, y_step) if drawn else ([], [])
        right_ticks = _ticks(accept_top, accept_step) if accept and self._accept_peak is not None else ([], [])
        left_w = max((len(label) for label in left_ticks[1]), default=0)
        right_w = max((len(label) for label in right_ticks[1]), default=0)
        plot_w = width - left_w - 2 - right_w
        if plot_w < 4:
            return canvas
        x0, x1 = left_w, left_w + plot_w + 1  # the frame's columns; the plot is between them, rows 1..plot_rows
        bottom = plot_rows + 1
        canvas.frame(x0, 0, "┌")
        canvas.frame(x1, 0, "┐")
        canvas.frame(x0, bottom, "└")
        canvas.frame(x1, bottom, "┘")
        for col in range(x0 + 1, x1):
            canvas.frame(col, 0, "─")
            canvas.frame(col, bottom, "─")
        for row in range(1, bottom):
            canvas.frame(x0, row, "│")
            canvas.frame(x1, row, "│")
        if has_xlabel:
            canvas.text(x0 + 1 + (plot_w - len(self.XLABEL)) // 2, height - 1, self.XLABEL)
        if not drawn:
            return canvas

        def tick_row(fraction: float) -> int:
            return 1 + round((1 - fraction) * (plot_rows - 1))

        for (value, label) in zip(*left_ticks, strict=True):
            row = tick_row(value / y_top)
            canvas.frame(x0, row, "┤")
            canvas.text(left_w - len(label), row, label)
        for (value, label) in zip(*right_ticks, strict=True):
            row = tick_row(value / accept_top)
            canvas.frame(x1, row, "├")
            canvas.text(x1 + 1, row, label)
        x_intervals = 4 if plot_w >= 28 else 2 if plot_w >= 14 else 1
        span, x_step = x_span(self._now - self._oldest(window_start), self.window_s, x_intervals)
        start, end = self._now - span, self._now

        def column(at: float) -> int:
            return x0 + 1 + round((at - start) / span * (plot_w - 1))

        last_end = -1
        for ago in reversed(_ticks(span, x_step)[0]):  # left to right: -span (or the last step inside it) ... 0
            col = column(end - ago)
            canvas.frame(col, bottom, "┬")
            label = f"{-ago:g}" if ago else "0"
            at = min(max(col - len(label) // 2, 0), width - len(label))
            if at > last_end:
                canvas.text(at, bottom + 1, label)
                last_end = at + len(label)

        def pixel(at: float, value: float, top: float) -> tuple[int, int]:
            # on the same scale as the tick cells (a value at a tick lands in the tick's row), dots centred in cells
            x = 2 * (x0 + 1) + round((at - start) / span * (plot_w - 1) * 2 + 0.5)
            y = 4 + round((1 - min(max(value / top, 0.0), 1.0)) * (plot_rows - 1) * 4 + 1.5)
            return x, y

        def plot(series: list[tuple[float, float]], top: float, style: Style, mask: LineMask) -> None:
            previous: tuple[int, int] | None = None
            for at, value in downsample(series, start, end, plot_w):  # a point per column, lines between
                point = pixel(at, value, top)
                if previous is None:
                    canvas.dot(*point, style)
                else:
                    canvas.line(*previous, *point, style, mask)
                previous = point

        monochrome = self.app.no_color

        def line_of(name: str) -> tuple[str, LineMask]:
            return MONOCHROME_LINES.get(name, ("━", None)) if monochrome else (COLOUR_MARK, None)

        legend: list[tuple[str, Style, str]] = []
        for source, series in sorted(by_source.items()):
            style = self._colour(SOURCE_COLOURS.get(source, "secondary"))
            mark, mask = line_of(source)
            plot(series, y_top, style, mask)
            legend.append((f"{source} tok/s", style, mark))
        if right_ticks[0]:
            style = self._colour(ACCEPT_COLOUR)
            mark, mask = line_of("accept")
            plot(accept, accept_top, style, mask)
            legend.append(("accept len (right)", style, mark))

        marker_style = self._colour(MARKER_COLOUR)
        visible = [m for m in self._markers if start <= m.at <= end]
        column_s = span / plot_w
        for marker, (x, height_frac, align) in zip(visible, marker_label_places(visible, start, end, column_s),
                                                   strict=True):
            col = column(marker.at)
            canvas.frame(col, 0, "┬", marker_style)
            canvas.frame(col, bottom, "┴", marker_style)
            for row in range(1, bottom):
                canvas.frame(col, row, "│", marker_style)
            label = short_label(marker.text)
            label_col = column(end + x)
            if align == "right":
                label_col -= len(label) - 1
            label_col = min(max(label_col, x0 + 1), x1 - len(label))
            canvas.text(label_col, tick_row(height_frac), label, marker_style)
        draw_legend(canvas, legend, x0, x1)
        return canvas

    def _oldest(self, since: float) -> float:
        """The time of the oldest point or marker at or after `since` (now when there is none)."""
        times = [p.at for p in self._points] + [m.at for m in self._markers]
        return min((at for at in times if at >= since), default=self._now)

    def on_resize(self) -> None:
        """A drawn chart replots at once at its new size (buckets and ticks follow the size; resizes are rare)."""
        if self.replot_count and (self._points or self._markers):
            self._dirty = True
            self._flush()
