"""Provides LogViewScreen: the server log with follow mode, search with / and n/N; lines pushed in."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import ClassVar

from rich.segment import Segment
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.events import Key
from textual.geometry import Size
from textual.reactive import reactive
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input, Static


class LogLines(ScrollView, can_focus=True):
    """A virtual view of many log lines; only visible lines are rendered (Line API)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"log-lines--match", "log-lines--current"}

    DEFAULT_CSS = """
    LogLines {
        height: 1fr;
        background: $surface;
        & > .log-lines--match { background: $warning 30%; }
        & > .log-lines--current { background: $accent 40%; text-style: bold; }
    }
    """

    def __init__(self, max_lines: int = 20000, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines: deque[str] = deque(maxlen=max_lines)
        self.query_text = ""
        self.current_line: int | None = None
        self._width = 0

    def add_lines(self, lines: Iterable[str]) -> None:
        """Append lines (oldest are dropped past max_lines)."""
        for line in lines:
            self.lines.append(line)
            self._width = max(self._width, len(line))
        self.virtual_size = Size(self._width, len(self.lines))
        self.refresh()

    def render_line(self, y: int) -> Strip:
        """Render one visible row, highlighting matches of the search."""
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if index >= len(self.lines):
            return Strip.blank(width, self.rich_style)
        text = Text(self.lines[index], style=self.rich_style, no_wrap=True)
        if self.query_text:
            text.highlight_words(
                [self.query_text], self.get_component_rich_style("log-lines--match", partial=True), case_sensitive=False
            )
        if index == self.current_line:
            text.stylize(self.get_component_rich_style("log-lines--current", partial=True))
        segments = [Segment(s.text, s.style) for s in text.render(self.app.console) if s.text != "\n"]
        return Strip(segments).crop_extend(scroll_x, scroll_x + width, self.rich_style)


class LogViewScreen(Screen[None]):
    """The server log. The caller pushes lines with `add_lines(lines)`.

    Keys: f toggles follow mode (stay at the end as lines arrive; scrolling up turns it off),
    / opens the search, enter runs it, n / N go to the next / previous match, escape closes the
    search or the screen. `follow`, `matches` and `current_match` are readable for tests.
    """

    DEFAULT_CSS = """
    LogViewScreen {
        & > .log-status { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
        & > .log-status.-follow { color: $success; }
        & > Input { display: none; dock: bottom; }
        & > Input.-open { display: block; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "toggle_follow", "Follow", tooltip="Follow the end of the log"),
        Binding("slash", "open_search", "Search", tooltip="Search the log"),
        Binding("n", "next_match", "Next", tooltip="Next match"),
        Binding("N", "previous_match", "Previous", tooltip="Previous match"),
        Binding("escape", "close", "Close", tooltip="Close search or the log"),
    ]

    follow: reactive[bool] = reactive(True)
    """Keep the view at the newest line."""

    def __init__(self, lines: Iterable[str] = (), title: str = "server log", max_lines: int = 20000) -> None:
        super().__init__()
        self.title_text = title
        self._initial = list(lines)
        self._max_lines = max_lines
        self.matches: list[int] = []
        """Line indexes matching the search."""
        self.current_match: int | None = None
        """Index into `matches` of the match shown."""

    def compose(self) -> ComposeResult:
        """Status line, lines, and the (hidden) search input."""
        yield Static(classes="log-status")
        view = LogLines(self._max_lines, id="log-lines")
        view.add_lines(self._initial)
        yield view
        yield Input(placeholder="search (enter: find, escape: cancel)", id="log-search")

    def on_mount(self) -> None:
        """Start at the end, following."""
        self.query_one(LogLines).focus()
        self._scroll_end()
        self._update_status()

    @property
    def view(self) -> LogLines:
        """The lines widget."""
        return self.query_one(LogLines)

    def add_lines(self, lines: Iterable[str]) -> None:
        """Append lines; in follow mode the view stays at the end."""
        self.view.add_lines(lines)
        if self.follow:
            self._scroll_end()
        self._update_status()

    def _scroll_end(self) -> None:
        """Go to the last line once the new virtual size is laid out."""
        view = self.view
        view.call_after_refresh(view.scroll_end, animate=False, immediate=True, x_axis=False)

    def watch_follow(self, follow: bool) -> None:
        """Jump to the end when follow turns on."""
        if follow and self.is_mounted:
            self._scroll_end()
        self._update_status()

    def on_mouse_scroll_up(self) -> None:
        """Scrolling up stops following."""
        self.follow = False

    def on_key(self, event: Key) -> None:
        """Moving up with the keyboard stops following too (the scrolling itself is LogLines')."""
        if event.key in ("up", "pageup", "home") and self.focused is self.view:
            self.follow = False

    def action_toggle_follow(self) -> None:
        """Follow on/off."""
        self.follow = not self.follow

    def action_open_search(self) -> None:
        """Show the search input."""
        search = self.query_one("#log-search", Input)
        search.add_class("-open")
        search.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Run the search and go to the first match at or after the view."""
        event.stop()
        self.search(event.value)
        event.input.remove_class("-open")
        self.view.focus()

    def search(self, text: str) -> None:
        """Find every line containing `text` (case-insensitive) and show the first one."""
        view = self.view
        view.query_text = text
        needle = text.lower()
        self.matches = [i for i, line in enumerate(view.lines) if needle and needle in line.lower()]
        self.current_match = None
        if self.matches:
            self.follow = False
            self._go(0)
        else:
            view.current_line = None
            view.refresh()
            self._update_status()

    def action_next_match(self) -> None:
        """Go to the next match (wraps)."""
        if self.matches:
            self._go(0 if self.current_match is None else (self.current_match + 1) % len(self.matches))

    def action_previous_match(self) -> None:
        """Go to the previous match (wraps)."""
        if self.matches:
            self._go(
                len(self.matches) - 1 if self.current_match is None else (self.current_match - 1) % len(self.matches)
            )

    def _go(self, match: int) -> None:
        self.follow = False
        self.current_match = match
        view = self.view
        view.current_line = self.matches[match]
        view.scroll_to(y=max(0, view.current_line - view.size.height // 2), animate=False, immediate=True)
        view.refresh()
        self._update_status()

    def action_close(self) -> None:
        """Close the search input if open, else the screen."""
        search = self.query_one("#log-search", Input)
        if search.has_class("-open"):
            search.remove_class("-open")
            self.view.focus()
        else:
            self.dismiss(None)

    def _update_status(self) -> None:
        if not self.is_mounted:
            return
        status = self.query_one(".log-status", Static)
        parts = [self.title_text, f"{len(self.view.lines)} lines", "follow on" if self.follow else "follow off (f)"]
        if self.view.query_text:
            if self.matches and self.current_match is not None:
                line = self.matches[self.current_match] + 1
                parts.append(f"'{self.view.query_text}' {self.current_match + 1}/{len(self.matches)} (line {line})")
            else:
                parts.append(f"'{self.view.query_text}' not found")
        status.update(" · ".join(parts))
        status.set_class(self.follow, "-follow")
