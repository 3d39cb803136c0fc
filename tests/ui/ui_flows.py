"""What the dashboard's Pilot tests share: the terminal size, the screen as text, waiting for words or READY."""

from __future__ import annotations

import html
import os
import re

from textual.pilot import Pilot

from app.core.data import ServerState
from app.tui.app import TunedashApp
from tests.helpers import pilot_until as until
from widgets import FlagsPanel

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")  # what the importers of test_app_flows got from it

__all__ = ["SIZE", "event_texts", "pending_of", "ready", "screen_text", "shows", "state_of", "until"]

SIZE = (120, 40)


CELL_PX = 12.2  # the width of one terminal cell in Textual's SVG screenshots


def screen_text(app: TunedashApp) -> str:
    """What the terminal shows, as text (one line per row, columns kept), read from the app's own screenshot."""
    svg = app.export_screenshot()
    rows: dict[float, dict[int, str]] = {}
    for x, y, text in re.findall(r'<text[^>]*\bx="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg):
        row = rows.setdefault(float(y), {})
        for offset, char in enumerate(html.unescape(text).replace("\xa0", " ")):
            row[round(float(x) / CELL_PX) + offset] = char
    return "\n".join(
        "".join(cells.get(col, " ") for col in range(max(cells) + 1)).rstrip() if cells else ""
        for _, cells in sorted(rows.items())
    )


async def shows(pilot: Pilot[None], app: TunedashApp, *words: str, timeout: float = 5.0) -> str:
    """Wait until the screen shows every one of `words` (the UI redraws at 4 Hz); returns the screen text."""
    def missing() -> list[str]:
        text = screen_text(app)
        return [w for w in words if w not in text]

    await until(pilot, lambda: not missing(), timeout, f"{list(words)} on screen",
                lambda: f"{missing()} not on screen:\n{screen_text(app)}")
    return screen_text(app)


def state_of(app: TunedashApp) -> ServerState:
    return app.session.lifecycle.state


async def ready(pilot: Pilot[None], app: TunedashApp) -> None:
    await until(pilot, lambda: state_of(app) == ServerState.READY and app.session.busy is None, what="READY")


def pending_of(app: TunedashApp, key: str) -> tuple[str | None, str | None]:
    row = next(r for r in app.query_one(FlagsPanel).rows if r.key == key)
    return row.running, row.pending


def event_texts(app: TunedashApp) -> list[str]:
    return [e.text for e in app.session.events]
