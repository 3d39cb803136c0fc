"""Benchmark runs: a fixed request set sent N at concurrency C, its percentiles and summary.

A benchmark run sends its warm-up requests first and leaves them out of the results; the request set is
deterministic (seeded synthetic prompts, or the lines of a prompt file). One ClientSession (one connection
pool sized to the concurrency) serves a whole run: `concurrency` workers take the next request index, so a
run costs no per-request session or task set-up.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from app.core.measure.client import STALL_TIMEOUT_S, RequestResult, stream_completion, synthetic_prompt
from app.core.profiles.types import BenchSettings

WORDS_PER_TOKEN = 0.75  # synthetic prompts: about 4 tokens per 3 words


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class BenchSpec:
    """The fixed request set of one benchmark run (or one A/B trial)."""

    requests: int = 32
    concurrency: int = 4
    input_len: int = 512  # prompt length in tokens (synthetic prompts; about 0.75 words per token)
    max_tokens: int = 256
    warmup: int = 2  # requests sent first and left out of the results
    endpoint: str = "completions"  # "completions" | "chat"
    seed: int = 0
    ignore_eos: bool = True
    prompt_file: Path | None = None
    timeout_s: float = 600.0  # per request

    @classmethod
    def from_settings(cls, bench: BenchSettings, **overrides: Any) -> BenchSpec:
        """The profile's [bench] table, with the non-None overrides on top."""
        base: dict[str, Any] = {
            "requests": bench.requests, "concurrency": bench.concurrency, "input_len": bench.input_len,
            "max_tokens": bench.output_len, "warmup": bench.warmup, "endpoint": bench.endpoint, "seed": bench.seed,
        }
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def to_json(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["prompt_file"] = str(self.prompt_file) if self.prompt_file else None
        return data


def build_prompts(spec: BenchSpec, count: int, offset: int = 0) -> list[str]:
    """`count` prompts: lines of the prompt file (cycled), else seeded synthetic prompts of input_len tokens."""
    if spec.prompt_file is not None:
        try:
            lines = [ln for ln in spec.prompt_file.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except OSError as exc:
            raise PromptFileError(f"{spec.prompt_file}: cannot read the prompt file ({exc.strerror or exc})") from None
        if not lines:
            raise PromptFileError(f"{spec.prompt_file}: the prompt file has no non-empty line; one prompt per line")
        return [lines[(offset + i) % len(lines)] for i in range(count)]
    words = max(1, round(spec.input_len * WORDS_PER_TOKEN))
    return [synthetic_prompt(words, spec.seed * 1_000_003 + offset + i) for i in range(count)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between order statistics; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class BenchSummary:
    """Aggregates of one run. Values that could not be measured are None (e.g. no successful request)."""

    requests: int
    completed: int
    errors: int
    error_kinds: dict[str, int]
    usage_missing: int
    output_tokens: int
    wall_s: float
    output_tok_s: float | None  # all completed requests' tokens / the run's wall time
    request_rate: float | None
    stream_decode_tok_s: float | None  # mean over requests of 1 / TPOT
    ttft_ms: dict[str, float | None]  # p50, p90, p99, mean
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    accept_len: float | None = None
    accept_source: str = ""  # "log", "meta", "metrics", or why there is none

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @property
    def warnings(self) -> list[str]:
        notes = []
        if self.usage_missing:
            notes.append(f"{self.usage_missing} answers had no usage: tokens counted from chunks (too low "
                         "under speculative decoding); does the server support stream_options.include_usage?")
        if self.errors:
            kinds = "; ".join(f"{n} x {text}" for text, n in self.error_kinds.items())
            notes.append(f"{self.errors} of {self.requests} requests failed: {kinds}")
        return notes


def _dist_ms(values: Sequence[float]) -> dict[str, float | None]:
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 3)

    return {"p50": ms(percentile(values, 50)), "p90": ms(percentile(values, 90)), "p99": ms(percentile(values, 99)),
            "mean": ms(statistics.fmean(values)) if values else None}


def summarize(results: Sequence[RequestResult], wall_s: float) -> BenchSummary:
    ok = [r for r in results if r.ok]
    errors = Counter((r.error or "failed")[:120] for r in results if not r.ok)
    tokens = sum(r.output_tokens for r in ok)
    decode = [d for r in ok if (d := r.decode_tps) is not None]
    metas = [r.accept_len for r in ok if r.accept_len is not None]
    return BenchSummary(
        requests=len(results),
        completed=len(ok),
        errors=len(results) - len(ok),
        error_kinds=dict(errors.most_common(5)),
        usage_missing=sum(1 for r in ok if r.usage_missing),
        output_tokens=tokens,
        wall_s=round(wall_s, 4),
        output_tok_s=tokens / wall_s if ok and wall_s > 0 else None,
        request_rate=len(ok) / wall_s if ok and wall_s > 0 else None,
        stream_decode_tok_s=statistics.fmean(decode) if decode else None,
        ttft_ms=_dist_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_ms=_dist_ms([t for r in ok if (t := r.tpot_s) is not None]),
        itl_ms=_dist_ms([x for r in ok for x in r.itl_s]),
        e2e_ms=_dist_ms([r.latency_s for r in ok if r.latency_s is not None]),
        accept_len=statistics.fmean(metas) if metas else None,
        accept_source="meta" if metas else "",
    )


@dataclass
class BenchResult:
    """One run's requests (warm-up excluded) and its summary."""

    spec: BenchSpec
    results: list[RequestResult]
    wall_s: float
    summary: BenchSummary


async def _send_all(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    spec: BenchSpec,
    prompts: list[str],
    on_result: Callable[[int, RequestResult], None] | None,
) -> tuple[list[RequestResult], float]:
    results: list[RequestResult | None] = [None] * len(prompts)
    next_index = 0
    started = time.monotonic()
    chat = spec.endpoint == "chat"

    async def worker() -> None:
        nonlocal next_index
        while next_index < len(prompts):
            i = next_index
            next_index += 1
            result = await stream_completion(session, base_url, model, prompts[i], spec.max_tokens, chat=chat,
                                             ignore_eos=spec.ignore_eos, run_started=started)
            results[i] = result
            if on_result is not None:
                on_result(i, result)

    workers = [asyncio.create_task(worker()) for _ in range(max(1, min(spec.concurrency, len(prompts))))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
    wall = time.monotonic() - started
    return [r for r in results if r is not None], wall


async def run_bench(
    base_url: str,
    model: str,
    spec: BenchSpec,
    *,
    on_result: Callable[[int, RequestResult], None] | None = None,
    on_warmup_done: Callable[[], None] | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> BenchResult:
    """Warm up (excluded), then send spec.requests requests at spec.concurrency; returns every result.

    A bad answer (an HTTP error, a broken chunk, a stream silent for `stall_timeout_s`) is an error result of its
    kind (BenchSummary.error_kinds), never an exception out of the run.
    """
    prompts = build_prompts(spec, spec.requests, offset=spec.warmup)
    connector = aiohttp.TCPConnector(limit=max(spec.concurrency, 1), force_close=False)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s, sock_connect=5, sock_read=stall_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if spec.warmup > 0:
            warm = replace(spec, requests=spec.warmup)
            await _send_all(session, base_url, model, warm, build_prompts(spec, spec.warmup), None)
        if on_warmup_done is not None:
            on_warmup_done()
        results, wall = await _send_all(session, base_url, model, spec, prompts, on_result)
    return BenchResult(spec, results, wall, summarize(results, wall))
