"""AcceptanceWatch: the live form of the advisor's accept-length rule, an alarm when speculation stops paying.

The dashboard feeds it every acceptance reading as it arrives (an SGLang decode line's `accept len`, a vLLM
SpecDecoding line's mean acceptance length, a /metrics window's). When the median of the readings of the last
`window_s` seconds stays at or below `rules.LOW_ACCEPT_LEN` (the advisor's threshold, the same constant) for
another `window_s`, an episode begins: `add` returns it once, with the figures of the low stretch (the readings
from the window that first went low to now), and `alarm`
holds it (the header shows it). The episode ends when the window's median is above the threshold again: `add`
returns the recovery once. The log's lines are preferred; /metrics windows count only while the log gives no
acceptance in the window (a server whose log prints none, or a vLLM without SpecDecoding lines).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Literal

from app.core.advisor.rules import LOW_ACCEPT_LEN

ReadingSource = Literal["log", "metrics"]
WINDOW_S = 30.0
"""How long the acceptance must stay low before the alarm (and the span of the window the median is taken over)."""
EPISODE_READINGS = 1000
"""An episode's median is over its last this many readings (an episode can last hours: bounded memory and work)."""
MIN_READINGS = 3
"""A window's median counts only with at least this many readings in it."""


@dataclass(frozen=True)
class AcceptanceReading:
    """One acceptance length, when it arrived (time.time()) and where it came from."""

    at: float
    accept_len: float
    source: ReadingSource


@dataclass(frozen=True)
class AcceptanceAlarm:
    """A sustained low acceptance, or its end: the median over `span_s` seconds of `count` readings."""

    kind: Literal["low", "recovered"]
    median: float
    span_s: float
    count: int
    source: ReadingSource

    @property
    def units(self) -> str:
        return ("line" if self.source == "log" else "/metrics window") + ("" if self.count == 1 else "s")

    def text(self) -> str:
        """The event log's line."""
        figures = f"{self.median:.2f} over the last {self.span_s:.0f} s ({self.count} {self.units})"
        if self.kind == "low":
            return (f"acceptance {figures}; speculation is not paying (at or below {LOW_ACCEPT_LEN:g}): fewer "
                    "speculative steps, another draft, or none; v advises, a A/Bs")
        return f"acceptance recovered: {figures}"

    def header(self) -> str:
        """The header's short form, while the episode lasts."""
        return f"ACCEPTANCE LOW {self.median:.2f} ({self.span_s:.0f} s, {self.count} {self.units})"


class AcceptanceWatch:
    """Readings in, an alarm out once per episode; `reset()` when another launch starts."""

    def __init__(self, window_s: float = WINDOW_S, threshold: float = LOW_ACCEPT_LEN,
                 min_readings: int = MIN_READINGS) -> None:
        self.window_s = window_s
        self.threshold = threshold
        self.min_readings = min_readings
        self._readings: deque[AcceptanceReading] = deque()
        self._low_since: float | None = None  # when the window's median first went (and stayed) low
        # the episode's last EPISODE_READINGS readings (its median), its first reading's time and its count
        self._low: deque[AcceptanceReading] = deque(maxlen=EPISODE_READINGS)
        self._low_first_at = 0.0
        self._low_count = 0
        self.alarm: AcceptanceAlarm | None = None
        """The episode in progress (kind "low"), or None."""

    def reset(self) -> None:
        """Forget every reading and the episode (a relaunch: another configuration)."""
        self._readings.clear()
        self._low_since = None
        self._low.clear()
        self.alarm = None

    def add(self, at: float, accept_len: float, source: ReadingSource = "log") -> AcceptanceAlarm | None:
        """Take one reading; returns the alarm when an episode begins, the recovery when it ends, else None."""
        if not (math.isfinite(accept_len) and accept_len >= 1.0):  # not a length (a bad line got this far)
            return None
        reading = AcceptanceReading(at, accept_len, source)
        self._readings.append(reading)
        while self._readings and self._readings[0].at < at - self.window_s:
            self._readings.popleft()
        window = self._window()
        if window is None or reading.source != window[0].source:
            return None  # not enough readings yet, or a /metrics reading while the log speaks
        median = statistics.median(r.accept_len for r in window)
        if median <= self.threshold:
            if self._low_since is None:
                self._low_since, self._low_first_at, self._low_count = at, window[0].at, len(window)
                self._low.clear()
                self._low.extend(window)
            else:
                self._low.append(reading)
                self._low_count += 1
            span = at - self._low_first_at
            if self.alarm is None and at - self._low_since >= self.window_s:
                low_median = statistics.median(r.accept_len for r in self._low)
                self.alarm = AcceptanceAlarm("low", low_median, span, self._low_count, reading.source)
                return self.alarm
            if self.alarm is not None:  # the header follows the episode's figures
                self.alarm = AcceptanceAlarm("low", statistics.median(r.accept_len for r in self._low), span,
                                             self._low_count, reading.source)
            return None
        self._low_since = None
        self._low.clear()
        if self.alarm is not None:
            self.alarm = None
            return AcceptanceAlarm("recovered", median, at - window[0].at, len(window), reading.source)
        return None

    def _window(self) -> list[AcceptanceReading] | None:
        """The readings the median is taken over: the log's in the window, else the /metrics ones."""
        for source in ("log", "metrics"):
            picked = [r for r in self._readings if r.source == source]
            if picked:
                return picked if len(picked) >= self.min_readings else None
        return None
