"""MetricsPoller: a server's /metrics counters -> generation tokens/s and speculative acceptance over time.

The server's counters are cumulative (Prometheus counters), so a rate needs two scrapes: tokens/s over a
window = delta(generation tokens) / delta(client monotonic time). Speculative decoding is read the way
vLLM's own log line computes it: mean acceptance length = 1 + accepted tokens / drafts, acceptance rate =
accepted tokens / draft tokens, both over the same window, and only when drafts happened in it.

A counter that went down (the server was relaunched) or is missing gives no rate for that window; a
window with no new tokens is a real 0 tok/s reading (the server is idle), not "unknown". Polls never
overlap: the next one starts `period_s` after the previous one ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from app.core.data import ThroughputPoint
from app.core.measure.http_probes import scrape_metrics


@dataclass(frozen=True)
class MetricNames:
    """The counter names of one backend (bare names: the parser sums the labelled series under them)."""

    generation: str
    generation_label: str | None = None  # only the series carrying this label text, e.g. 'mode="decode"'
    fallback_generation: str | None = None  # used when the server has no `generation` counter (older versions)
    accepted: str | None = None  # spec decode: accepted draft tokens
    drafts: str | None = None  # spec decode: number of draft proposals (verify steps)
    draft_tokens: str | None = None  # spec decode: proposed draft tokens
    running: str | None = None  # requests running now (a gauge)


COUNTERS = {
    "vllm": MetricNames(
        generation="vllm:generation_tokens_total",
        accepted="vllm:spec_decode_num_accepted_tokens_total",
        drafts="vllm:spec_decode_num_drafts_total",
        draft_tokens="vllm:spec_decode_num_draft_tokens_total",
        running="vllm:num_requests_running",
    ),
    # SGLang 0.5.9+: realtime_tokens_total{mode="decode"} grows every decode step (accepted draft tokens
    # included); generation_tokens_total grows only when a request finishes, so a 2 s window of a long
    # request reads 0 tok/s. Older servers only have the latter (docs/decisions.md#sglang-metrics-counter).
    "sglang": MetricNames(
        generation="sglang:realtime_tokens_total",
        generation_label='mode="decode"',
        fallback_generation="sglang:generation_tokens_total",
        running="sglang:num_running_reqs",
    ),
}


@dataclass(frozen=True)
class MetricsReading:
    """One scrape: the parsed values and when it finished (client monotonic and wall clock)."""

    values: Mapping[str, float]
    monotonic: float
    wall: float


@dataclass(frozen=True)
class MetricsRate:
    """What happened between two scrapes."""

    at: float  # wall-clock time of the later scrape
    window_s: float
    tokens: float  # generation tokens in the window
    tokens_per_s: float
    accept_len: float | None = None  # 1 + accepted / drafts; None without drafts in the window
    accept_rate: float | None = None  # accepted / draft tokens (0..1)
    running: float | None = None

    def point(self) -> ThroughputPoint:
        return ThroughputPoint(self.at, self.tokens_per_s, "metrics", self.accept_len)


@dataclass(frozen=True)
class SpecDecodeTotals:
    """Speculative-decoding counters between two readings (a run's before/after)."""

    accepted: float
    drafts: float
    draft_tokens: float

    @property
    def accept_len(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def accept_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None


def _delta(before: Mapping[str, float], after: Mapping[str, float], name: str | None) -> float | None:
    if name is None or name not in after:
        return None
    delta = after[name] - before.get(name, 0.0)
    return delta if delta >= 0 else None


def _has_label(label_set: str, label: str) -> bool:
    """Whether `{a="x",b="y"}` holds `label` (`b="y"`) as a whole label, not as the tail of another's name."""
    return any(f"{before}{label}{after}" in label_set for before in "{," for after in ",}")


def _series(values: Mapping[str, float], name: str, label: str | None) -> float | None:
    """A counter's value: the bare name (all series summed), or the sum of the series carrying `label` as one of
    its labels (keys are `name{a="x",b="y"}` with values escaped, so a label value cannot fake one)."""
    if label is None:
        return values.get(name)
    prefix = name + "{"
    picked = [v for key, v in values.items() if key.startswith(prefix) and _has_label(key[len(prefix) - 1:], label)]
    return sum(picked) if picked else None


def _generation_delta(before: Mapping[str, float], after: Mapping[str, float], names: MetricNames) -> float | None:
    """Generated tokens between two readings, from the first counter both readings have; None on a reset."""
    candidates = [(names.generation, names.generation_label)]
    if names.fallback_generation:
        candidates.append((names.fallback_generation, None))
    for name, label in candidates:
        old, new = _series(before, name, label), _series(after, name, label)
        if old is not None and new is not None:
            return new - old if new >= old else None
    return None


def spec_decode_totals(
    before: Mapping[str, float], after: Mapping[str, float], backend: str
) -> SpecDecodeTotals | None:
    """The spec-decode counters' growth from `before` to `after`; None when the server has none (spec off)."""
    names = COUNTERS.get(backend)
    if names is None:
        return None
    accepted = _delta(before, after, names.accepted)
    drafts = _delta(before, after, names.drafts)
    draft_tokens = _delta(before, after, names.draft_tokens)
    if accepted is None or drafts is None or draft_tokens is None:
        return None
    return SpecDecodeTotals(accepted, drafts, draft_tokens)


def rate_between(before: MetricsReading, after: MetricsReading, backend: str) -> MetricsRate | None:
    """Tokens/s and acceptance between two scrapes; None on a reset or missing counter (module docstring)."""
    names = COUNTERS.get(backend)
    window = after.monotonic - before.monotonic
    if names is None or window <= 0:
        return None
    tokens = _generation_delta(before.values, after.values, names)
    if tokens is None:
        return None
    spec = spec_decode_totals(before.values, after.values, backend)
    running = after.values.get(names.running) if names.running else None
    return MetricsRate(
        at=after.wall,
        window_s=window,
        tokens=tokens,
        tokens_per_s=tokens / window,
        accept_len=spec.accept_len if spec else None,
        accept_rate=spec.accept_rate if spec else None,
        running=running,
    )


Scrape = Callable[[str], Awaitable[Mapping[str, float] | None]]


class MetricsPoller:
    """Scrapes `base_url`/metrics every `period_s` and reports a MetricsRate per window."""

    def __init__(self, base_url: str, backend: str, *, period_s: float = 2.0, scrape: Scrape | None = None) -> None:
        self.base_url = base_url
        self.backend = backend
        self.period_s = period_s
        self._scrape: Scrape = scrape or scrape_metrics
        self.last: MetricsReading | None = None
        self.first: MetricsReading | None = None

    async def read(self) -> MetricsReading | None:
        """One scrape now (also remembered as the latest reading)."""
        values = await self._scrape(self.base_url)
        if values is None:
            return None
        reading = MetricsReading(dict(values), time.monotonic(), time.time())
        if self.first is None:
            self.first = reading
        return reading

    async def run(self, on_rate: Callable[[MetricsRate], None], on_error: Callable[[str], None] | None = None) -> None:
        """Poll until cancelled. `on_error` hears when the endpoint stops answering (once, until it answers)."""
        failing = False
        while True:
            reading = await self.read()
            if reading is None:
                if not failing and on_error is not None:
                    on_error(f"{self.base_url}/metrics did not answer")
                failing = True
                self.last = None  # a gap: the next window starts at the next good scrape
            else:
                failing = False
                if self.last is not None:
                    rate = rate_between(self.last, reading, self.backend)
                    if rate is not None:
                        on_rate(rate)
                self.last = reading
            await asyncio.sleep(self.period_s)
