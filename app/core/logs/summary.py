"""A summary of parsed log events (ready time, phase durations, tok/s over time, acceptance) and JSON forms.

- ``summarize(events, backend=None, first_timestamp=None) -> LogSummary``
- ``event_to_json(event) -> dict`` (a "type" key: phase, ready, decode, spec_decode, notice, fatal)
- ``summary_to_json(summary) -> dict``
- ``line_timestamp(text) -> str | None`` and ``TimestampClock`` (timestamp text -> seconds since the first)

Timestamps: SGLang prints ``YYYY-MM-DD HH:MM:SS[.mmm]`` (before ~0.4.0 ``HH:MM:SS`` only), vLLM
``MM-DD HH:MM:SS`` (no year). Both short forms are read as "the same day/year as before, or the next one
when the clock goes back by more than an hour", so a log crossing midnight (time only) or New Year
(vLLM) still measures forward. Ready seconds are measured from ``first_timestamp`` (the first line of the
log that had one; LogParser.first_timestamp) or, without it, from the first event that has one.

Phase durations: the backend's own figures (PhaseEvent.seconds on end events) win. Repeated end lines
of one phase and graph kind overlap (vLLM ``Loading weights took`` then ``Model loading took``), so the
largest counts; different graph kinds (SGLang decode, draft, draft extend) add up. Without a figure, the
duration is from the first begin line to the last end line of the phase by timestamps; WARMUP ends at
the ready line. Mean gen tok/s counts only lines with gen_tps > 0 (vLLM prints one 0.0 line after a burst).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from app.core.data import (
    DecodeStats,
    FatalEvent,
    LogEvent,
    Notice,
    Phase,
    PhaseEvent,
    ReadyEvent,
    SpecDecodeStats,
)
from app.core.logs import patterns as lp


@dataclass(frozen=True)
class PhaseTiming:
    """How long one startup phase took, and where the figure came from ("backend" | "timestamps")."""

    phase: Phase
    seconds: float | None
    source: str


@dataclass(frozen=True)
class ThroughputSample:
    """One periodic throughput line: its timestamp text, gen tok/s and acceptance length if known."""

    timestamp: str | None
    gen_tps: float
    accept_len: float | None


@dataclass(frozen=True)
class LogSummary:
    """What a user wants from a server log at a glance."""

    backend: str | None
    ready: bool
    ready_seconds: float | None  # first timestamp -> ready line; None when timestamps do not allow
    phases: tuple[PhaseTiming, ...]
    tps_series: tuple[ThroughputSample, ...]
    mean_gen_tps: float | None
    max_gen_tps: float | None
    mean_accept_len: float | None
    notices: tuple[Notice, ...]
    fatal: tuple[FatalEvent, ...]


def line_timestamp(text: str) -> str | None:
    """The log's own timestamp text in a line (vLLM, SGLang, or a leading ISO date), None if absent."""
    for pattern in (lp.VLLM_PREFIX, lp.SGLANG_PREFIX):
        match = pattern.search(text)
        if match:
            return match.group("ts")
    rest = lp.PROC.sub("", lp.JOURNALD.sub("", text, count=1), count=1)
    iso = lp.ISO_PREFIX.match(rest)
    return iso.group("ts") if iso else None


def _parse(text: str, year: int, day: int) -> tuple[datetime, str] | None:
    """(moment, form) where form is "full", "no_year" or "time_only"."""
    text = text.replace("T", " ")
    try:
        if len(text) >= 19 and text[4] == "-":
            return datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S"), "full"
        if len(text) >= 14 and text[2] == "-":
            month, rest = int(text[:2]), text[3:14]
            dom = int(rest[:2])
            if month == 2 and dom == 29 and year % 4:
                dom = 28
            clock = datetime.strptime(rest[3:11], "%H:%M:%S")
            return datetime(year, month, dom, clock.hour, clock.minute, clock.second), "no_year"
        clock = datetime.strptime(text[:8], "%H:%M:%S")
        base = datetime(2000, 1, 1) + timedelta(days=day)
        return base.replace(hour=clock.hour, minute=clock.minute, second=clock.second), "time_only"
    except (ValueError, IndexError):
        return None


class TimestampClock:
    """Turns a log's timestamp texts, in order, into seconds since the first one (None if unreadable)."""

    def __init__(self) -> None:
        self._first: datetime | None = None
        self._last: datetime | None = None
        self._year = 2000
        self._day = 0

    def seconds(self, text: str | None) -> float | None:
        """Seconds from the first timestamp read to this one."""
        if text is None:
            return None
        parsed = _parse(text, self._year, self._day)
        if parsed is None:
            return None
        moment, form = parsed
        if self._last is not None and moment < self._last - timedelta(hours=1) and form != "full":
            if form == "no_year":
                self._year += 1
            else:
                self._day += 1
            reparsed = _parse(text, self._year, self._day)
            if reparsed is not None:
                moment = reparsed[0]
        if self._first is None:
            self._first = moment
        self._last = moment
        return (moment - self._first).total_seconds()


def _event_timestamp(event: LogEvent) -> str | None:
    if isinstance(event, DecodeStats | SpecDecodeStats | ReadyEvent) and event.timestamp is not None:
        return event.timestamp
    return line_timestamp(event.line.text)


def _phase_timings(events: list[LogEvent], at: dict[int, float | None]) -> tuple[PhaseTiming, ...]:
    order: list[Phase] = []
    figures: dict[Phase, dict[str, float]] = {}
    begins: dict[Phase, float] = {}
    ends: dict[Phase, float] = {}
    ready_at: float | None = None
    for index, event in enumerate(events):
        moment = at.get(index)
        if isinstance(event, ReadyEvent) and ready_at is None:
            ready_at = moment
        if not isinstance(event, PhaseEvent):
            continue
        if event.phase not in order:
            order.append(event.phase)
        if event.begin:
            if moment is not None:
                begins.setdefault(event.phase, moment)
            continue
        if moment is not None:
            ends[event.phase] = moment
        if event.seconds is not None:
            per_graph = figures.setdefault(event.phase, {})
            graph = event.detail.get("graph", "")
            per_graph[graph] = max(per_graph.get(graph, 0.0), event.seconds)
    if ready_at is not None and Phase.WARMUP in order:
        ends[Phase.WARMUP] = ready_at
    timings: list[PhaseTiming] = []
    for phase in order:
        if phase in figures:
            timings.append(PhaseTiming(phase, round(sum(figures[phase].values()), 3), "backend"))
        elif phase in begins and phase in ends and ends[phase] >= begins[phase]:
            timings.append(PhaseTiming(phase, ends[phase] - begins[phase], "timestamps"))
        else:
            timings.append(PhaseTiming(phase, None, "timestamps"))
    return tuple(timings)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(events: Iterable[LogEvent], backend: str | None = None, first_timestamp: str | None = None) -> LogSummary:
    """Summarize parsed events (see the module docstring for the rules)."""
    items = list(events)
    clock = TimestampClock()
    clock.seconds(first_timestamp)
    at = {index: clock.seconds(_event_timestamp(event)) for index, event in enumerate(items)}
    ready_index = next((i for i, event in enumerate(items) if isinstance(event, ReadyEvent)), None)
    series: list[ThroughputSample] = []
    accept: list[float] = []
    for event in items:
        if isinstance(event, DecodeStats):
            series.append(ThroughputSample(event.timestamp, event.gen_tps, event.accept_len))
            if event.accept_len is not None:
                accept.append(event.accept_len)
        elif isinstance(event, SpecDecodeStats) and event.mean_accept_len is not None:
            accept.append(event.mean_accept_len)
            last = series[-1] if series else None
            if last is not None and last.accept_len is None and last.timestamp == event.timestamp:
                series[-1] = ThroughputSample(last.timestamp, last.gen_tps, event.mean_accept_len)
    busy = [sample.gen_tps for sample in series if sample.gen_tps > 0]
    return LogSummary(
        backend=backend,
        ready=ready_index is not None,
        ready_seconds=at.get(ready_index) if ready_index is not None else None,
        phases=_phase_timings(items, at),
        tps_series=tuple(series),
        mean_gen_tps=_mean(busy),
        max_gen_tps=max((sample.gen_tps for sample in series), default=None),
        mean_accept_len=_mean(accept),
        notices=tuple(event for event in items if isinstance(event, Notice)),
        fatal=tuple(event for event in items if isinstance(event, FatalEvent)),
    )


_TYPE_NAMES: dict[type, str] = {
    PhaseEvent: "phase",
    ReadyEvent: "ready",
    DecodeStats: "decode",
    SpecDecodeStats: "spec_decode",
    Notice: "notice",
    FatalEvent: "fatal",
}


def event_to_json(event: LogEvent) -> dict[str, Any]:
    """A JSON-ready dict of one event: "type", its fields, and "line" (number) + "text" for its LogLine."""
    out: dict[str, Any] = {"type": _TYPE_NAMES[type(event)], "line": event.line.number}
    if isinstance(event, PhaseEvent):
        out.update(phase=event.phase.value, begin=event.begin, seconds=event.seconds, detail=dict(event.detail))
    elif isinstance(event, DecodeStats):
        out.update(
            gen_tps=event.gen_tps,
            accept_len=event.accept_len,
            accept_rate=event.accept_rate,
            running=event.running,
            queued=event.queued,
            token_usage=event.token_usage,
            cuda_graph=event.cuda_graph,
            timestamp=event.timestamp,
        )
    elif isinstance(event, SpecDecodeStats):
        out.update(
            mean_accept_len=event.mean_accept_len,
            accepted=event.accepted,
            drafted=event.drafted,
            accept_rate=event.accept_rate,
            timestamp=event.timestamp,
        )
    elif isinstance(event, ReadyEvent):
        out.update(timestamp=event.timestamp)
    elif isinstance(event, Notice):
        out.update(kind=event.kind, message=event.text)
    elif isinstance(event, FatalEvent):
        out.update(kind=event.kind, message=event.text, context=list(event.context))
    out["text"] = event.line.text
    return out


def summary_to_json(summary: LogSummary) -> dict[str, Any]:
    """A JSON-ready dict of a summary."""
    return {
        "backend": summary.backend,
        "ready": summary.ready,
        "ready_seconds": summary.ready_seconds,
        "phases": [
            {"phase": timing.phase.value, "seconds": timing.seconds, "source": timing.source}
            for timing in summary.phases
        ],
        "tps_series": [
            {"timestamp": sample.timestamp, "gen_tps": sample.gen_tps, "accept_len": sample.accept_len}
            for sample in summary.tps_series
        ],
        "mean_gen_tps": summary.mean_gen_tps,
        "max_gen_tps": summary.max_gen_tps,
        "mean_accept_len": summary.mean_accept_len,
        "notices": [event_to_json(notice) for notice in summary.notices],
        "fatal": [event_to_json(fatal) for fatal in summary.fatal],
    }
