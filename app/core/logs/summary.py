"""A summary of parsed log events (ready time, phase durations, tok/s over time, acceptance) and JSON forms.

- ``summarize(events, backend=None, first_timestamp=None) -> LogSummary``
- ``event_to_json(event) -> dict`` (a "type" key: phase, ready, decode, prefill, spec_decode, capacity, notice,
  fatal)
- ``summary_to_json(summary) -> dict`` (``tunedash log --json``; the readable table is app/core/logs/summary_table.py)
- ``line_timestamp(text) -> str | None`` and ``TimestampClock`` (timestamp text -> seconds since the first)

Timestamps: SGLang prints ``YYYY-MM-DD HH:MM:SS[.mmm]`` (before ~0.4.0 ``HH:MM:SS`` only), vLLM
``MM-DD HH:MM:SS`` (no year). Both short forms are read as "the same day/year as before, or the next one
when the clock goes back by more than an hour", so a log crossing midnight (time only) or New Year
(vLLM) still measures forward. Ready seconds are measured from ``first_timestamp`` (the first line of the
log that had one; LogParser.first_timestamp) or, without it, from the first event that has one.

Phase rows: one per phase, and one per capture for SGLang 0.5.14+ graph captures (PhaseEvent detail
``capture``: "target verify", "target prefill", "draft decode", "draft extend"...), in the order they first
appear; 0.5.10-0.5.12 graph lines (no ``capture``) share one CUDA_GRAPH row as before.

Phase durations: the backend's own figures (PhaseEvent.seconds on end events) win. vLLM's figures overlap
(``Loading weights took`` is inside ``Model loading took``), so per graph kind the largest counts; SGLang's
figures are each of a different thing (the target's and the draft's weights, decode, draft and draft-extend
graphs, each draft-extend step) and add up. Without a figure, the duration is from the first begin line to
the last end line of the row by timestamps; WARMUP ends at the ready line. A row's GiB is the memory the
backend says the phase took, added up the same way: ``mem usage=`` of SGLang's weights, init and graph lines,
the sizes of its KV and Mamba caches for the memory pool; vLLM's ``Model loading took F GiB``, ``Available KV
cache memory`` and ``took F GiB`` of the graph capture (SGLang prints GiB as "GB": it divides by 2**30).
Mean gen tok/s counts only lines with gen_tps > 0 (vLLM prints one 0.0 line after a burst).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from app.core.data import (
    DecodeStats,
    FatalEvent,
    LogEvent,
    Notice,
    Phase,
    PhaseEvent,
    PrefillStats,
    ReadyEvent,
    ServerCapacity,
    SpecDecodeStats,
)
from app.core.logs import patterns as lp


@dataclass(frozen=True)
class PhaseTiming:
    """How long one startup phase (or one graph capture) took, where the figure came from ("backend" |
    "timestamps"), and the memory it took when the backend says (GiB)."""

    phase: Phase
    seconds: float | None
    source: str
    capture: str | None = None  # SGLang 0.5.14+: which capture ("target verify"); None: the whole phase
    gib: float | None = None


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
    kv_cache_tokens: int | None = None  # tokens the KV cache holds: the capacity line's, else the first KV line's
    capacity: ServerCapacity | None = None  # SGLang's "max_total_num_tokens=..." line (the last one)


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
    if isinstance(event, DecodeStats | PrefillStats | SpecDecodeStats | ReadyEvent) and event.timestamp is not None:
        return event.timestamp
    return line_timestamp(event.line.text)


# PhaseEvent detail keys that hold memory a phase took, in GiB (SGLang's "GB" is GiB; vLLM prints "GiB").
_GIB_KEYS = (
    "mem_usage_gb",  # SGLang weights, init, graph captures
    "k_size_gb",  # SGLang KV cache
    "v_size_gb",
    "kv_size_gb",
    "conv_state_gb",  # SGLang Mamba cache
    "ssm_state_gb",
    "intermediate_ssm_gb",
    "intermediate_conv_gb",
    "mem_gib",  # vLLM model loading, graph capture
    "kv_mem_gib",  # vLLM available KV cache memory
)


def _event_gib(event: PhaseEvent) -> float | None:
    """The memory one phase line says its phase took (the sum of its size fields), None when it says none."""
    sizes: list[float] = []
    for key in _GIB_KEYS:
        if key in event.detail:
            try:
                sizes.append(float(event.detail[key]))
            except ValueError:
                continue
    return sum(sizes) if sizes else None


_Row = tuple[Phase, str | None]  # (phase, capture)


class _Figures:
    """The backend's figures of one row: added up (SGLang) or the largest per graph kind (vLLM, overlapping)."""

    def __init__(self, adds_up: bool) -> None:
        self._adds_up = adds_up
        self._per_key: dict[object, float] = {}

    def add(self, event: PhaseEvent, value: float) -> None:
        key: object = len(self._per_key) if self._adds_up else event.detail.get("graph", "")
        self._per_key[key] = max(self._per_key.get(key, 0.0), value)

    def total(self) -> float | None:
        return round(sum(self._per_key.values()), 3) if self._per_key else None


def _phase_timings(events: list[LogEvent], at: dict[int, float | None], backend: str | None) -> tuple[PhaseTiming, ...]:
    adds_up = backend == lp.SGLANG
    order: list[_Row] = []
    seconds: dict[_Row, _Figures] = {}
    gib: dict[_Row, _Figures] = {}
    begins: dict[_Row, float] = {}
    ends: dict[_Row, float] = {}
    ready_at: float | None = None
    for index, event in enumerate(events):
        moment = at.get(index)
        if isinstance(event, ReadyEvent) and ready_at is None:
            ready_at = moment
        if not isinstance(event, PhaseEvent):
            continue
        row = (event.phase, event.detail.get("capture"))
        if row not in order:
            order.append(row)
        size = _event_gib(event)
        if size is not None:
            gib.setdefault(row, _Figures(adds_up)).add(event, size)
        if event.begin:
            if moment is not None:
                begins.setdefault(row, moment)
            continue
        if moment is not None:
            ends[row] = moment
        if event.seconds is not None:
            seconds.setdefault(row, _Figures(adds_up)).add(event, event.seconds)
    warmup = (Phase.WARMUP, None)
    if ready_at is not None and warmup in order:
        ends[warmup] = ready_at
    timings: list[PhaseTiming] = []
    for row in order:
        phase, capture = row
        row_gib = gib[row].total() if row in gib else None
        figure = seconds[row].total() if row in seconds else None
        if figure is not None:
            timings.append(PhaseTiming(phase, figure, "backend", capture, row_gib))
        elif row in begins and row in ends and ends[row] >= begins[row]:
            timings.append(PhaseTiming(phase, ends[row] - begins[row], "timestamps", capture, row_gib))
        else:
            timings.append(PhaseTiming(phase, None, "timestamps", capture, row_gib))
    return tuple(timings)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _kv_cache_tokens(events: list[LogEvent], capacity: ServerCapacity | None) -> int | None:
    if capacity is not None:
        return capacity.max_total_tokens
    for event in events:
        if isinstance(event, PhaseEvent) and event.phase == Phase.KV_CACHE and "tokens" in event.detail:
            try:
                return int(event.detail["tokens"].replace(",", ""))
            except ValueError:
                continue
    return None


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
    capacity = next((event for event in reversed(items) if isinstance(event, ServerCapacity)), None)
    return LogSummary(
        backend=backend,
        ready=ready_index is not None,
        ready_seconds=at.get(ready_index) if ready_index is not None else None,
        phases=_phase_timings(items, at, backend),
        tps_series=tuple(series),
        mean_gen_tps=_mean(busy),
        max_gen_tps=max((sample.gen_tps for sample in series), default=None),
        mean_accept_len=_mean(accept),
        notices=tuple(event for event in items if isinstance(event, Notice)),
        fatal=tuple(event for event in items if isinstance(event, FatalEvent)),
        kv_cache_tokens=_kv_cache_tokens(items, capacity),
        capacity=capacity,
    )


_TYPE_NAMES: dict[type, str] = {
    PhaseEvent: "phase",
    ReadyEvent: "ready",
    DecodeStats: "decode",
    PrefillStats: "prefill",
    SpecDecodeStats: "spec_decode",
    ServerCapacity: "capacity",
    Notice: "notice",
    FatalEvent: "fatal",
}


def event_to_json(event: LogEvent) -> dict[str, Any]:
    """A JSON-ready dict of one event: "type", its fields, and "line" (number) + "text" for its LogLine."""
    out: dict[str, Any] = {"type": _TYPE_NAMES[type(event)], "line": event.line.number}
    if isinstance(event, PhaseEvent):
        out.update(phase=event.phase.value, begin=event.begin, seconds=event.seconds, detail=dict(event.detail))
    elif isinstance(event, (DecodeStats, PrefillStats, ServerCapacity, SpecDecodeStats)):
        out.update({f.name: getattr(event, f.name) for f in fields(event) if f.name != "line"})  # figures as read
    elif isinstance(event, ReadyEvent):
        out.update(timestamp=event.timestamp)
    elif isinstance(event, Notice):
        out.update(kind=event.kind, message=event.text)
        if event.feature is not None:
            out["feature"] = event.feature
    elif isinstance(event, FatalEvent):
        out.update(kind=event.kind, message=event.text, context=list(event.context))
    out["text"] = event.line.text
    return out


def _timing_to_json(timing: PhaseTiming) -> dict[str, Any]:
    """One phase row: phase, seconds, source; "capture" and "gib" only when known."""
    row: dict[str, Any] = {"phase": timing.phase.value}
    if timing.capture is not None:
        row["capture"] = timing.capture
    row.update(seconds=timing.seconds, source=timing.source)
    if timing.gib is not None:
        row["gib"] = round(timing.gib, 3)
    return row


def summary_to_json(summary: LogSummary) -> dict[str, Any]:
    """A JSON-ready dict of a summary."""
    return {
        "backend": summary.backend,
        "ready": summary.ready,
        "ready_seconds": summary.ready_seconds,
        "phases": [_timing_to_json(timing) for timing in summary.phases],
        "tps_series": [
            {"timestamp": sample.timestamp, "gen_tps": sample.gen_tps, "accept_len": sample.accept_len}
            for sample in summary.tps_series
        ],
        "mean_gen_tps": summary.mean_gen_tps,
        "max_gen_tps": summary.max_gen_tps,
        "mean_accept_len": summary.mean_accept_len,
        "kv_cache_tokens": summary.kv_cache_tokens,
        "capacity": event_to_json(summary.capacity) if summary.capacity is not None else None,
        "notices": [event_to_json(notice) for notice in summary.notices],
        "fatal": [event_to_json(fatal) for fatal in summary.fatal],
    }
