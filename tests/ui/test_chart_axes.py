"""The live chart's axes as a user reads them: the x range fits the data until the data fills the window (a fresh
chart is not squeezed into its right edge), then it scrolls; tick labels on both axes are round numbers."""

from __future__ import annotations

import itertools
import math
import os
import re

import pytest
from textual.app import App, ComposeResult

from app.core.data import RelaunchMarker, ThroughputPoint
from widgets import ThroughputChart

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

NOW = 10_000.0
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
BRAILLE = re.compile("[\u2801-\u28ff]")


class One(App[None]):
    def __init__(self, chart: ThroughputChart) -> None:
        super().__init__()
        self.chart = chart

    def compose(self) -> ComposeResult:
        yield self.chart


async def drawn_rows(points: list[ThroughputPoint], size: tuple[int, int] = (72, 16),
                     markers: list[RelaunchMarker] | None = None) -> list[str]:
    chart = ThroughputChart(window_s=300.0)
    async with One(chart).run_test(size=size) as pilot:
        chart.update(points, NOW, markers)
        chart.replot()
        await pilot.pause()
        return chart.text().splitlines()


def one_per_second(seconds: float, tok_s: float = 100.0, accept: float | None = None) -> list[ThroughputPoint]:
    """A point a second over the last `seconds` seconds up to NOW."""
    return [ThroughputPoint(NOW - seconds + i, tok_s, "log", accept) for i in range(int(seconds) + 1)]


def frame_rows(rows: list[str]) -> tuple[int, int]:
    """The rows of the frame's top and bottom lines."""
    top = next(i for i, row in enumerate(rows) if "┌" in row)
    bottom = next(i for i, row in enumerate(rows) if "└" in row)
    return top, bottom


def x_labels(rows: list[str]) -> list[float]:
    """The numbers under the x axis (seconds before now), left to right."""
    _, bottom = frame_rows(rows)
    return [float(n) for n in NUMBER.findall(rows[bottom + 1])]


def y_labels(rows: list[str], side: str) -> list[float]:
    """The numbers beside the left (tokens/s) or right (acceptance) axis, bottom to top."""
    top, bottom = frame_rows(rows)
    left, right = rows[top].index("┌"), rows[top].index("┐")
    found = []
    for row in rows[top:bottom + 1]:
        text = row[:left] if side == "left" else row[right + 1:]
        found += [float(n) for n in NUMBER.findall(text)]
    return sorted(found)


def is_nice_step(step: float) -> bool:
    """1, 2, 2.5 or 5 times a power of ten."""
    mantissa = step / 10 ** math.floor(math.log10(step))
    return any(math.isclose(mantissa, m) for m in (1.0, 2.0, 2.5, 5.0))


def assert_round_ticks(values: list[float], zero_at: str) -> None:
    """Evenly spaced multiples of a round step, one of them 0 (the left end of a y axis, the right of the x)."""
    assert len(values) >= 2, values
    values = sorted(values)
    steps = {round(b - a, 9) for a, b in itertools.pairwise(values)}
    assert len(steps) == 1, f"ticks not evenly spaced: {values}"
    step = steps.pop()
    assert is_nice_step(step), f"tick step {step} is not 1, 2, 2.5 or 5 x 10^k: {values}"
    assert all(math.isclose(v / step, round(v / step), abs_tol=1e-9) for v in values), values
    assert (values[0] if zero_at == "bottom" else values[-1]) == 0, values


async def test_twenty_seconds_of_data_span_the_axis_not_the_window() -> None:
    rows = await drawn_rows(one_per_second(20))
    labels = x_labels(rows)
    # the axis reads about the 20 s there are (a 30 s floor), where it read -300 ... 0 with the data in a sliver
    assert labels[-1] == 0
    assert -30 <= labels[0] <= -20, labels
    assert_round_ticks(labels, zero_at="right")
    top, bottom = frame_rows(rows)
    left, right = rows[top].index("┌"), rows[top].index("┐")
    first_half = "".join(row[left + 1:(left + right) // 2] for row in rows[top + 1:bottom])
    assert BRAILLE.search(first_half), "the data should reach the chart's left half"


@pytest.mark.parametrize("seconds", [3, 20, 47, 90, 150, 240, 300])
async def test_the_x_axis_covers_the_data_and_not_much_more(seconds: int) -> None:
    labels = x_labels(await drawn_rows(one_per_second(seconds)))
    span = -labels[0]
    assert_round_ticks(labels, zero_at="right")
    # every second of data is on the axis (its left end is at the last label or a little beyond it) ...
    assert span >= min(seconds, 300) * 0.75, labels
    # ... and the axis is not the whole window before the data fills it
    assert span <= max(2 * seconds, 30), labels


async def test_a_full_window_scrolls_with_round_ticks() -> None:
    rows = await drawn_rows(one_per_second(900), markers=[RelaunchMarker(NOW - 600, "old"),
                                                          RelaunchMarker(NOW - 100, "steps 1 -> 3")])
    labels = x_labels(rows)
    assert labels[0] == -300 and labels[-1] == 0  # the window, no more: older data scrolled out
    assert_round_ticks(labels, zero_at="right")  # -300 -200 -100 0, not -225 and -75
    text = "\n".join(rows)
    assert "steps 1 -> 3" in text and "old" not in text


@pytest.mark.parametrize("accept", [1.4, 2.3, 3.1, 4.6])
@pytest.mark.parametrize("size", [(72, 16), (72, 10), (72, 24)])
async def test_acceptance_and_tokens_ticks_are_round_numbers(accept: float, size: tuple[int, int]) -> None:
    rows = await drawn_rows(one_per_second(60, tok_s=1234.0, accept=accept), size=size)
    right, left = y_labels(rows, "right"), y_labels(rows, "left")
    assert_round_ticks(right, zero_at="bottom")  # 0 1 2 3, where it read 0 0.625 1.25 1.875 2.5
    assert_round_ticks(left, zero_at="bottom")
    assert right[-1] >= accept and left[-1] >= 1234.0  # the top tick is above the data


async def test_a_marker_on_a_fresh_chart_is_on_its_data() -> None:
    # a relaunch 10 s ago on a chart with 20 s of data: its line sits in the right half, not at the edge
    rows = await drawn_rows(one_per_second(20), markers=[RelaunchMarker(NOW - 10, "steps 1 -> 3")])
    top, bottom = frame_rows(rows)
    left, right = rows[top].index("┌"), rows[top].index("┐")
    marker_col = rows[bottom].index("┴")
    fraction = (marker_col - left) / (right - left)
    assert 0.5 <= fraction <= 0.8, fraction
