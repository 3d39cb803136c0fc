"""Provides BrailleCanvas: a grid of terminal cells with braille-dot lines and text, turned into Textual strips.

Each cell holds 2 x 4 dots (the Unicode braille block), so a W x H cell area plots 2W x 4H pixels. Three layers,
the upper one winning per cell: frame characters (axes, marker lines), dots, text (labels, legend). A cell's dots
take the style of the last line drawn through it. Pure Python, no terminal (why: docs/decisions.md#chart-canvas).
"""

from __future__ import annotations

from collections.abc import Callable

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

_DOT_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
"""The braille bit of the dot at (row 0-3, column 0-1) of a cell (U+2800 + the bits)."""


class BrailleCanvas:
    """`width` x `height` cells; dot coordinates are pixels: x in [0, 2 * width), y in [0, 4 * height), y down."""

    def __init__(self, width: int, height: int) -> None:
        self.width = max(0, width)
        self.height = max(0, height)
        cells = self.width * self.height
        self._dots = [0] * cells
        self._dot_style: list[Style | None] = [None] * cells
        self._frame: list[tuple[str, Style | None] | None] = [None] * cells
        self._text: list[tuple[str, Style | None] | None] = [None] * cells

    def dot(self, x: int, y: int, style: Style | None) -> None:
        """Set one dot (ignored outside the canvas)."""
        if 0 <= x < 2 * self.width and 0 <= y < 4 * self.height:
            cell = (y >> 2) * self.width + (x >> 1)
            self._dots[cell] |= _DOT_BITS[y & 3][x & 1]
            self._dot_style[cell] = style

    def line(self, x0: int, y0: int, x1: int, y1: int, style: Style | None,
             mask: Callable[[int], bool] | None = None) -> None:
        """A straight line of dots from (x0, y0) to (x1, y1), both ends included (Bresenham); with `mask`, only
        the dots whose x it accepts (a dashed or dotted line)."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            if mask is None or mask(x0):
                self.dot(x0, y0, style)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def frame(self, col: int, row: int, char: str, style: Style | None = None) -> None:
        """A character under the dots (axes, frame, marker lines)."""
        if 0 <= col < self.width and 0 <= row < self.height:
            self._frame[row * self.width + col] = (char, style)

    def text(self, col: int, row: int, text: str, style: Style | None = None) -> None:
        """Text over everything, from cell (col, row) rightwards, clipped to the canvas."""
        if not 0 <= row < self.height:
            return
        base = row * self.width
        for offset, char in enumerate(text):
            if 0 <= col + offset < self.width:
                self._text[base + col + offset] = (char, style)

    def cell(self, col: int, row: int) -> tuple[str, Style | None]:
        """What one cell shows: text, else dots, else a frame character, else a space."""
        index = row * self.width + col
        over = self._text[index]
        if over is not None:
            return over
        if self._dots[index]:
            return chr(0x2800 + self._dots[index]), self._dot_style[index]
        under = self._frame[index]
        return under if under is not None else (" ", None)

    def row_text(self, row: int) -> str:
        """One row as plain text (tests and logs)."""
        return "".join(self.cell(col, row)[0] for col in range(self.width))

    def strips(self, base: Style) -> list[Strip]:
        """Every row as a Strip: runs of cells of one style make one segment, each combined over `base`."""
        combined: dict[Style | None, Style] = {None: base}
        strips: list[Strip] = []
        for row in range(self.height):
            segments: list[Segment] = []
            run: list[str] = []
            run_style: Style | None = None
            for col in range(self.width):
                char, style = self.cell(col, row)
                if style is not run_style and run:
                    segments.append(Segment("".join(run), _combine(combined, base, run_style)))
                    run = []
                run_style = style
                run.append(char)
            if run:
                segments.append(Segment("".join(run), _combine(combined, base, run_style)))
            strips.append(Strip(segments, self.width))
        return strips


def _combine(cache: dict[Style | None, Style], base: Style, style: Style | None) -> Style:
    found = cache.get(style)
    if found is None:
        found = cache[style] = base + style
    return found
