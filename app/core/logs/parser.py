"""Backend log lines -> typed events (phase, ready, throughput, capacity, notices, fatal) for SGLang and vLLM.

Over 450 lines on purpose: one job, one pass per line over one LogParser state (launch, ranks, open traceback),
and most of its length is this docstring; the figures' builders live in app/core/logs/stats.py.

Public API
----------
- ``LogParser(backend=None, context_lines=30, ready_regex=None)``: incremental parser. ``feed(line) -> list[LogEvent]``
  takes one line (a chunk holding several newline-separated lines is split); ``flush() -> list[LogEvent]``
  at end of stream returns a traceback still being collected; ``backend`` is "sglang", "vllm" or None until
  detected; ``lines`` counts the lines fed (LogLine.number is 1-based). Every line fed is accounted for: it
  gave an event, or it is one of ``traceback_lines`` (taken into a traceback's FatalEvent), or it is one of
  ``skipped`` (no event); ``unreadable`` counts the skipped lines shaped like a throughput line whose
  figures could not be read.
- ``detect_backend(lines) -> str | None``: the backend of the first line that carries a decisive marker.
- ``parse_lines(lines, backend=None) -> ParsedLog``: a whole log at once (flushes); ``ParsedLog`` has
  ``backend``, ``events``, ``lines``, ``first_timestamp``, ``skipped``, ``unreadable`` and ``summary() -> LogSummary``.
- ``LogParser.first_timestamp``: the timestamp text of the first line that had one.
- ``read_log_lines(path) -> Iterator[str]``: a log file's lines split on "\\n" only (keeps tqdm's "\\r").
- ``line_timestamp(text) -> str | None``: the log's own timestamp text of a line.
- ``summarize(events, backend=None) -> LogSummary``, ``event_to_json(event) -> dict``,
  ``summary_to_json(summary) -> dict`` (see app/core/logs/summary.py, re-exported here).

What a line goes through
------------------------
ANSI colour is stripped; a tqdm line rewritten with ``\\r`` keeps only its last state; a journald prefix
and a ``(Proc pid=N) `` prefix (vLLM subprocesses, Ray actors) are removed; then the backend prefix is
*searched* (SGLang ``[ts ranks] ``, vLLM ``LEVEL mm-dd HH:MM:SS [file:line] ``) so foreign prefixes in
front of it do not matter. The text after it is the message. Patterns live in app/core/logs/patterns.py,
the builders of the throughput figures in app/core/logs/stats.py.

What a message becomes: SGLang ``Decode batch`` -> DecodeStats, ``Prefill batch`` -> PrefillStats (any rank);
vLLM ``Avg prompt throughput`` -> DecodeStats, ``SpecDecoding metrics`` -> SpecDecodeStats; a startup milestone
-> PhaseEvent; SGLang's ``max_total_num_tokens=...`` summary -> ServerCapacity; the ready line -> ReadyEvent;
otherwise a notice-table line -> Notice (with ``feature`` when it says what it switched off), a fatal-table
line -> FatalEvent. Docs: docs/servers.md#sglang-log-lines and #vllm-log-lines.

Until the backend is known, both backends' patterns apply (they do not overlap) except the uvicorn
``Application startup complete.`` line, which then counts as WARMUP (the SGLang meaning).

Readiness rules
---------------
- SGLang: ``The server is fired up and ready to roll!`` only. The uvicorn lines (``Application startup
  complete.``, ``Uvicorn running on URL``) mean WARMUP began: the server still warms up after them.
- vLLM: uvicorn's ``Application startup complete.``. ``Starting vLLM server on URL`` / ``Starting vLLM API
  server [N] on URL`` only begins WARMUP: vLLM prints it before uvicorn listens (seen with the real 0.32.0
  CPU build: /health refused the connection right after it). One ReadyEvent per launch.
- ``Phase.READY`` is never emitted as a PhaseEvent: the ReadyEvent is the ready signal. Its ``timestamp`` is
  the line's own, or the last one seen before it (uvicorn lines carry none).
- A launch begins at SGLang ``server_args=ServerArgs(`` (0.5.19+: ``server_args={``) or vLLM ``vLLM [API ]server
  version`` (0.32.0: the
  banner's ``version X``): per-launch state (ready seen, once-only phases) resets, so a log holding several
  launches yields one ready each.

- ``ready_regex`` (a profile's, any backend): a line whose cleaned text it matches (``re.search``) is a
  ready line too. Backend "custom" (a server we do not know) has only that: no SGLang/vLLM phases, ready
  lines or throughput lines are read, while fatal lines, tracebacks and notices are detected as for any log.

Ranks
-----
Phase events, capacity and notices come only from the primary rank: SGLang lines without ranks or whose ranks
are all 0 (``TP0``, ``DP0 TP0``, 0.5.23 ``ATTN_CP0``), vLLM lines without a process prefix or from a process
whose index is 0 (``EngineCore_DP0``, ``Worker_TP0``; ``VllmWorkerProcess`` and Ray workers are secondary).
With TP=8 the per-rank copies of the same milestone would otherwise arrive eight times. Throughput stats and
fatal events come from every rank (with DP attention every DP rank prints its own Decode line).

Fatal events
------------
A line matching the fatal table (OOM, port in use, child failed or crashed, engine errors) gives a FatalEvent
at once, whose context is the last ``context_lines`` lines up to it. A ``Traceback (most recent call last):``
opens a block: the following frame lines, chained tracebacks and the exception line are collected, and
the event is emitted when the first line after the exception line that is not part of the traceback
arrives (or at ``flush()``). Its text is the final exception line; its kind is the fatal-table
kind of that line ("oom", "port_in_use", "error" for ``EngineDeadError``...), else the kind of the line that
opened the block ("error" for ``Scheduler hit an exception``), else "traceback". Its context is the lines
before the block plus the block (capped).
Unrelated lines interleaved inside an open block (other ranks) are parsed as usual.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from app.core.data import (
    LOG_LINE_CUT,
    LOG_LINE_MAX,
    DecodeStats,
    FatalEvent,
    LogEvent,
    LogLine,
    Notice,
    Phase,
    PhaseEvent,
    PrefillStats,
    ReadyEvent,
    SpecDecodeStats,
    cap_log_line,
)
from app.core.logs import patterns as lp
from app.core.logs import stats
from app.core.logs.summary import LogSummary, event_to_json, line_timestamp, summarize, summary_to_json

__all__ = [
    "LogParser",
    "LogSummary",
    "ParsedLog",
    "detect_backend",
    "event_to_json",
    "line_timestamp",
    "parse_lines",
    "read_log_lines",
    "summarize",
    "summary_to_json",
]

CUSTOM = "custom"  # a server we do not know: fatal detection and a profile's ready_regex only
MAX_TRACEBACK_LINES = 400
CONTEXT_LINES = 30


@dataclass(frozen=True)
class _Parts:
    """A cleaned line split into what the prefixes told and the message."""

    message: str
    timestamp: str | None
    primary: bool  # False for a secondary rank / worker process
    level: str | None  # vLLM's level, None for SGLang lines


@dataclass
class _Traceback:
    """A traceback being collected."""

    start: LogLine
    before: tuple[str, ...]
    start_kind: str | None
    lines: list[str] = field(default_factory=list)
    exception: str | None = None
    seen_frame: bool = False


def clean_line(raw: str) -> str:
    """Strip ANSI escapes and the line ending; keep the last state of a ``\\r``-rewritten tqdm line."""
    text = lp.ANSI.sub("", raw.rstrip("\r\n"))
    if "\r" in text:
        states = [part for part in text.split("\r") if part.strip()]
        text = states[-1] if states else ""
    return text


def _is_primary_proc(proc: str, rank: str | None) -> bool:
    if rank is not None:
        return int(rank) == 0
    if proc in ("VllmWorkerProcess", "RayWorkerWrapper"):
        return False
    return all(int(number) == 0 for number in lp.RANK_NUMBER.findall(proc))


def split_line(text: str) -> _Parts:
    """Find the backend prefix anywhere in a cleaned line; return the message after it."""
    rest = lp.JOURNALD.sub("", text, count=1)
    primary = True
    proc = lp.PROC.match(rest)
    if proc:
        primary = _is_primary_proc(proc.group("proc"), proc.group("rank"))
        rest = rest[proc.end() :]
    vllm = lp.VLLM_PREFIX.search(rest)
    if vllm:
        return _Parts(rest[vllm.end() :], vllm.group("ts"), primary, vllm.group("level"))
    sglang = lp.SGLANG_PREFIX.search(rest)
    if sglang:
        ranks = lp.RANK_NUMBER.findall(sglang.group("ranks"))
        primary = primary and all(int(number) == 0 for number in ranks)
        return _Parts(rest[sglang.end() :], sglang.group("ts"), primary, None)
    iso = lp.ISO_PREFIX.match(rest)
    return _Parts(rest, iso.group("ts") if iso else None, primary, None)


def detect_line(text: str) -> str | None:
    """The backend a single cleaned line belongs to, when it says so decisively."""
    for backend, marker in lp.DETECT:
        if marker.search(text):
            return backend
    return None


def detect_backend(lines: Iterable[str]) -> str | None:
    """The backend ("sglang" | "vllm") of the first line with a decisive marker; None if none has one."""
    for raw in lines:
        backend = detect_line(clean_line(raw))
        if backend:
            return backend
    return None


def _is_exception_line(body: str) -> bool:
    match = lp.EXCEPTION_LINE.match(body)
    if not match:
        return False
    return match.group("rest") is not None or match.group("name").endswith(lp.EXCEPTION_NAME_ENDINGS)


class LogParser:
    """Turns SGLang or vLLM log lines into LogEvents, one line at a time (see the module docstring)."""

    def __init__(
        self, backend: str | None = None, context_lines: int = CONTEXT_LINES, ready_regex: str | None = None
    ) -> None:
        if backend is not None and backend not in (*lp.BACKENDS, CUSTOM):
            raise ValueError(f"unknown backend {backend!r}: use one of {', '.join((*lp.BACKENDS, CUSTOM))}")
        self._backend = backend
        self._ready_regex = re.compile(ready_regex) if ready_regex else None
        self._number = 0
        self._ring: deque[str] = deque(maxlen=max(context_lines, 1))
        self._traceback: _Traceback | None = None
        self._ready = False
        self._once: set[Phase] = set()
        self._first_timestamp: str | None = None
        self._last_timestamp: str | None = None
        self._skipped = 0
        self._unreadable = 0
        self._traceback_lines = 0

    @property
    def backend(self) -> str | None:
        """The backend given or detected so far ("sglang" | "vllm"), None while unknown."""
        return self._backend

    @property
    def lines(self) -> int:
        """How many lines were fed."""
        return self._number

    @property
    def skipped(self) -> int:
        """Lines that gave no event and are not part of a traceback (plain info lines, unreadable lines)."""
        return self._skipped

    @property
    def unreadable(self) -> int:
        """Lines that looked like a throughput line (``Decode batch``...) whose figures could not be read."""
        return self._unreadable

    @property
    def traceback_lines(self) -> int:
        """Lines taken into a traceback after its first line (they are the FatalEvent's context)."""
        return self._traceback_lines

    @property
    def first_timestamp(self) -> str | None:
        """The timestamp text of the first line that had one (the start for LogSummary.ready_seconds)."""
        return self._first_timestamp

    def feed(self, line: str) -> list[LogEvent]:
        """Parse one line (or a chunk of newline-separated lines) and return the events it completes.

        A line longer than LOG_LINE_MAX is cut there (app.core.data.cap_log_line) before anything reads it."""
        events: list[LogEvent] = []
        pieces = line.split("\n")
        if len(pieces) > 1 and pieces[-1] == "":
            pieces.pop()
        for piece in pieces:
            events.extend(self._feed_one(cap_log_line(piece)))
        return events

    def flush(self) -> list[LogEvent]:
        """End of stream: emit a traceback still being collected."""
        if self._traceback is None:
            return []
        return [self._finish_traceback()]

    # --- one line ---------------------------------------------------------------------------------

    def _feed_one(self, raw: str) -> list[LogEvent]:
        text = clean_line(raw)
        self._number += 1
        where = LogLine(self._number, text)
        parts = split_line(text)
        if self._first_timestamp is None:
            self._first_timestamp = parts.timestamp
        if parts.timestamp is not None:
            self._last_timestamp = parts.timestamp
        events: list[LogEvent] = []
        if self._traceback is not None:
            consumed, done = self._traceback_step(parts.message)
            if done:
                events.append(self._finish_traceback())
            if consumed:
                self._traceback_lines += 1
                self._ring.append(text)
                return events
        if self._backend is None:
            self._backend = detect_line(text)
        own = self._classify(parts, where)
        if not own and (self._traceback is None or self._traceback.start is not where):
            self._skipped += 1
        events.extend(own)
        self._ring.append(text)
        return events

    def _classify(self, parts: _Parts, where: LogLine) -> list[LogEvent]:
        message = parts.message
        if lp.TRACEBACK_START in message:
            self._traceback = _Traceback(
                start=where,
                before=tuple(self._ring),
                start_kind=lp.FATALS.kind_of(message.split(lp.TRACEBACK_START, 1)[0]),
                lines=[where.text],
            )
            return []
        fatal = lp.FATALS.kind_of(message)
        if fatal is not None:
            context = (*self._ring, where.text)
            return [FatalEvent(fatal, message.strip(), where, context[-self._ring_size() :])]
        figures = self._stats(message, parts, where)
        if figures is not None:
            return [figures]
        events: list[LogEvent] = []
        phase = self._phase(message, parts, where)
        if phase is not None:
            events.append(phase)
        elif (
            parts.primary
            and self._backend not in (lp.VLLM, CUSTOM)
            and (capacity := lp.SGLANG_CAPACITY.search(message)) is not None
        ):
            events.append(stats.sglang_capacity(capacity, where))
        ready = self._readiness(message, where) if self._backend != CUSTOM else None
        if ready is None and self._ready_regex is not None and self._ready_regex.search(where.text):
            ready = self._ready_once(where)
        if ready is not None:
            events.append(ready)
        if events or not parts.primary:
            return events
        kind = lp.NOTICES.kind_of(message)
        if kind is None and parts.level == "WARNING":
            kind = lp.WARNING
        if kind is not None:
            events.append(Notice(kind, message.strip(), where, lp.NOTICE_FEATURES.kind_of(message)))
        return events

    def _ring_size(self) -> int:
        return self._ring.maxlen or CONTEXT_LINES

    # --- phases and readiness -----------------------------------------------------------------------

    def _phase(self, message: str, parts: _Parts, where: LogLine) -> PhaseEvent | None:
        for row in lp.PHASE_ROWS:
            if self._backend is not None and row.backend != self._backend:
                continue
            match = row.pattern.search(message)
            if match is None:
                continue
            if row.restart:
                self._ready = False
                self._once.clear()
            if not parts.primary or (row.once and row.phase in self._once):
                return None
            if row.once or row.restart:
                self._once.add(row.phase)
            if not row.begin:  # an end re-arms the once-only begin rows of its phase
                self._once.discard(row.phase)
            groups = {key: value for key, value in match.groupdict().items() if value is not None}
            seconds = stats.number(groups.pop("secs", None))
            if "tokens" in groups:
                groups["tokens"] = groups["tokens"].replace(",", "")
            detail = dict(row.detail)
            detail.update(groups)
            return PhaseEvent(row.phase, row.begin, where, seconds, detail)
        return None

    def _readiness(self, message: str, where: LogLine) -> ReadyEvent | None:
        if self._backend != lp.VLLM and lp.SGLANG_READY.search(message):
            return self._ready_once(where)
        if self._backend == lp.VLLM and lp.UVICORN_STARTUP.search(message):
            return self._ready_once(where)
        return None

    def _ready_once(self, where: LogLine) -> ReadyEvent | None:
        if self._ready:
            return None
        self._ready = True
        return ReadyEvent(where, self._last_timestamp)

    # --- throughput -----------------------------------------------------------------------------------

    def _stats(
        self, message: str, parts: _Parts, where: LogLine
    ) -> DecodeStats | PrefillStats | SpecDecodeStats | None:
        """The throughput figures of a line (any rank); a line of that shape whose figures are unreadable is counted."""
        if self._backend == CUSTOM:
            return None
        found: DecodeStats | PrefillStats | SpecDecodeStats | None = None
        matched = False
        if self._backend != lp.VLLM:
            if decode := lp.SGLANG_DECODE.search(message):
                matched, found = True, stats.sglang_decode(decode.group("fields"), where, parts.timestamp)
            elif prefill := lp.SGLANG_PREFILL.search(message):
                matched, found = True, stats.sglang_prefill(prefill.group("fields"), where, parts.timestamp)
        if not matched and self._backend != lp.SGLANG:
            if throughput := lp.VLLM_THROUGHPUT.search(message):
                matched, found = True, stats.vllm_throughput(throughput.group("fields"), where, parts.timestamp)
            elif spec := lp.VLLM_SPEC_V1.search(message):
                matched, found = True, stats.vllm_spec_v1(spec.group("fields"), where, parts.timestamp)
            elif spec_v0 := lp.VLLM_SPEC_V0.search(message):
                matched, found = True, stats.vllm_spec_v0(spec_v0, where, parts.timestamp)
        if matched and found is None:
            self._unreadable += 1
        return found

    # --- tracebacks -----------------------------------------------------------------------------------

    def _traceback_step(self, body: str) -> tuple[bool, bool]:
        """(consumed by the traceback, traceback complete) for the next line's message."""
        block = self._traceback
        assert block is not None
        if len(block.lines) >= MAX_TRACEBACK_LINES:
            return False, True
        stripped = body.strip()
        part_of_block = False
        if not stripped or lp.TRACEBACK_START in body or lp.TRACEBACK_CHAIN.match(stripped):
            part_of_block = True
            if lp.TRACEBACK_START in body:
                block.seen_frame = False
        elif body[:1].isspace():
            part_of_block = True
            if stripped.startswith("File "):
                block.seen_frame = True
        elif _is_exception_line(stripped) and (block.seen_frame or block.exception is None):
            part_of_block = True
            block.exception = stripped
            block.seen_frame = False
        if part_of_block:
            block.lines.append(body)
            return True, False
        return False, block.exception is not None

    def _finish_traceback(self) -> FatalEvent:
        block = self._traceback
        assert block is not None
        self._traceback = None
        while block.lines and not block.lines[-1].strip():
            block.lines.pop()
        text = block.exception or "Traceback without a final exception line"
        kind = lp.FATALS.kind_of(text) or block.start_kind or lp.TRACEBACK
        return FatalEvent(kind, text, block.start, (*block.before, *block.lines))


@dataclass(frozen=True)
class ParsedLog:
    """A whole log parsed at once."""

    backend: str | None
    events: tuple[LogEvent, ...]
    lines: int
    first_timestamp: str | None
    skipped: int = 0  # lines that gave no event (LogParser.skipped)
    unreadable: int = 0  # throughput-shaped lines whose figures could not be read (LogParser.unreadable)

    def summary(self) -> LogSummary:
        """The summary of these events (ready time measured from the log's first timestamp)."""
        return summarize(self.events, self.backend, self.first_timestamp)


def read_log_lines(path: str | os.PathLike[str]) -> Iterator[str]:
    """The lines of a log file split on "\\n" only, so a tqdm line's "\\r" updates stay on one line.

    (Text-mode ``open()`` would split on "\\r" as well.) Undecodable bytes become U+FFFD. A line longer than
    LOG_LINE_MAX bytes is cut there with LOG_LINE_CUT; the rest of it is skipped unread into memory.
    """
    with open(path, "rb") as handle:
        while raw := handle.readline(LOG_LINE_MAX + 1):
            if len(raw) <= LOG_LINE_MAX or raw.endswith(b"\n"):
                yield raw.decode("utf-8", errors="replace")
                continue
            while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield raw[:LOG_LINE_MAX].decode("utf-8", errors="replace") + LOG_LINE_CUT + "\n"


def parse_lines(lines: Iterable[str], backend: str | None = None) -> ParsedLog:
    """Parse a whole log (an open file, a list of lines), flushing at the end."""
    parser = LogParser(backend)
    events: list[LogEvent] = []
    for line in lines:
        events.extend(parser.feed(line))
    events.extend(parser.flush())
    return ParsedLog(
        parser.backend, tuple(events), parser.lines, parser.first_timestamp, parser.skipped, parser.unreadable
    )


def vllm_engine_config(lines: Iterable[str]) -> tuple[dict[str, str], LogLine | None]:
    """The fields of vLLM's last "Initializing a V1 LLM engine ... with config:" line (patterns.VLLM_ENGINE_FIELDS:
    enforce_eager, device, compilation_mode, cudagraph_mode, speculative_config, and version), with that line; ({},
    None) when the log has none. A field the line does not carry is absent, never guessed."""
    found: dict[str, str] = {}
    where: LogLine | None = None
    for number, raw in enumerate(lines, start=1):
        if "Initializing a V1 LLM engine" not in raw:
            continue
        text = clean_line(raw[:LOG_LINE_MAX])
        head = lp.VLLM_ENGINE_CONFIG.search(text)
        if head is None:
            continue
        found = {"version": head["version"]}
        for name, pattern in lp.VLLM_ENGINE_FIELDS:
            match = pattern.search(text, head.end())
            if match is not None:
                found[name] = match[1]
        where = LogLine(number, text)
    return found, where
