"""Speculative acceptance length over one window (a benchmark run or an A/B trial).

SGLang from the decode log lines seen during the run (mean of their "accept len") or per-request
`meta_info` (completion_tokens / spec_verify_ct) when the server sends it; vLLM from the spec-decode
counters of /metrics differenced over the run (1 + accepted / drafts), never a cumulative since-start value.
"""

from __future__ import annotations

import statistics

from app.core.data import DecodeStats, SpecDecodeStats
from app.core.measure.http_probes import scrape_metrics
from app.core.measure.metrics import spec_decode_totals


class AcceptanceMeter:
    """Acceptance length over one window (a run or a trial): feed() log events between start() and stop()."""

    def __init__(self, backend: str, base_url: str) -> None:
        self.backend = backend
        self.base_url = base_url
        self._lens: list[float] = []
        self._vllm_lens: list[float] = []
        self._before: dict[str, float] | None = None
        self._open = False

    async def start(self) -> None:
        self._lens.clear()
        self._vllm_lens.clear()
        self._open = True
        if self.backend == "vllm":
            self._before = await scrape_metrics(self.base_url)

    def feed(self, event: object) -> None:
        if not self._open:
            return
        if isinstance(event, DecodeStats) and event.accept_len is not None:
            self._lens.append(event.accept_len)
        elif isinstance(event, SpecDecodeStats) and event.mean_accept_len is not None:
            self._vllm_lens.append(event.mean_accept_len)

    async def stop(self, meta: float | None = None) -> tuple[float | None, str]:
        """(acceptance length, source) or (None, why not)."""
        self._open = False
        if self.backend == "vllm":
            after = await scrape_metrics(self.base_url)
            totals = spec_decode_totals(self._before, after, "vllm") if after and self._before else None
            if totals is not None and totals.accept_len is not None:
                return totals.accept_len, "metrics"
            if self._vllm_lens:
                return statistics.fmean(self._vllm_lens), "log"
            return None, "no spec-decode counters in /metrics over the run"
        if meta is not None:
            return meta, "meta"
        if self._lens:
            return statistics.fmean(self._lens), "log"
        return None, "no decode log line with an accept len during the run"
