"""Streaming OpenAI-compatible load generation: timed requests, benchmark runs (N at concurrency C), the probe.

Tokens are counted from `usage.completion_tokens` (stream_options.include_usage), never from the
number of SSE chunks: speculative decoding sends several tokens per chunk. When a server sends no
usage, the count falls back to the number of content chunks and the result says so (`usage_missing`;
the summary warns). Per request: TTFT, inter-chunk latencies (ITL), TPOT = (latency - TTFT) /
(tokens - 1), end-to-end latency, errors (counted and kept, never dropped). A benchmark run sends its
warm-up requests first and leaves them out of the results; the request set is deterministic (seeded
synthetic prompts, or the lines of a prompt file). One ClientSession (one connection pool sized to the
concurrency) serves a whole run: `concurrency` workers take the next request index, so a run costs no
per-request session or task set-up.

Acceptance length (AcceptanceMeter): SGLang from the decode log lines seen during the run (mean of
their "accept len") or per-request `meta_info` (completion_tokens / spec_verify_ct) when the server
sends it; vLLM from the spec-decode counters of /metrics differenced over the run
(1 + accepted / drafts), never a cumulative since-start value.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from app.core.data import DecodeStats, SpecDecodeStats, ThroughputPoint
from app.core.measure.http_probes import scrape_metrics
from app.core.measure.metrics import spec_decode_totals
from app.core.profiles.types import BenchSettings

WORDS = [
    "tune",
    "measure",
    "kernel",
    "graph",
    "batch",
    "token",
    "stream",
    "cache",
    "memory",
    "speculative",
    "draft",
    "accept",
    "verify",
    "decode",
    "prefill",
    "schedule",
    "overlap",
    "tensor",
    "parallel",
    "rank",
    "launch",
    "ready",
    "relaunch",
    "baseline",
    "compare",
    "verdict",
]


def synthetic_prompt(words: int, seed: int) -> str:
    """A deterministic prompt of about `words` words."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class RequestResult:
    """One streamed request, timed with the client's monotonic clock."""

    ok: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    usage_missing: bool = False
    error: str = ""
    start_s: float = 0.0  # when it was sent, seconds after the run started
    accept_len: float | None = None  # from the server's per-request meta_info, when it sends one
    chunks: int = 0  # content chunks received (several tokens each under speculative decoding)

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (tokens - 1): time per output token after the first."""
        if self.latency_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def decode_tps(self) -> float | None:
        """This stream's decode tokens/s (1 / TPOT)."""
        tpot = self.tpot_s
        return None if not tpot else 1.0 / tpot


async def stream_completion(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    chat: bool = False,
    ignore_eos: bool = True,
    run_started: float | None = None,
) -> RequestResult:
    """Send one streaming request and time it."""
    body: dict[str, object] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        url = f"{base_url}/v1/chat/completions"
    else:
        body["prompt"] = prompt
        url = f"{base_url}/v1/completions"
    result = RequestResult(ok=False)
    started = time.monotonic()
    if run_started is not None:
        result.start_s = started - run_started
    last = None
    chunks = 0
    usage_tokens = None
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return result
            async for raw in response.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    continue
                error, tokens_so_far = _error_and_usage(chunk)
                if error:
                    result.error = error
                    return result
                if tokens_so_far is not None:
                    usage_tokens = tokens_so_far
                meta = chunk.get("meta_info")
                if isinstance(meta, dict) and meta.get("spec_verify_ct"):
                    tokens = meta.get("completion_tokens") or usage_tokens
                    if tokens:
                        result.accept_len = float(tokens) / float(meta["spec_verify_ct"])
                text = ""
                for choice in chunk.get("choices") or []:
                    text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if text:
                    now = time.monotonic()
                    if result.ttft_s is None:
                        result.ttft_s = now - started
                    elif last is not None:
                        result.itl_s.append(now - last)
                    last = now
                    chunks += 1
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        result.error = str(exc) or type(exc).__name__
        return result
    result.latency_s = (last or time.monotonic()) - started
    result.chunks = chunks
    if usage_tokens is None:
        result.usage_missing = True
        result.output_tokens = chunks
    else:
        result.output_tokens = usage_tokens
    result.ok = result.output_tokens > 0
    if not result.ok and not result.error:
        result.error = "no tokens in the answer"
    return result


_PROBE_TAIL = 4
"""How many of a probe answer's last chunks are kept unparsed, to find the last one with text at the end."""


def _error_and_usage(chunk: dict[str, Any]) -> tuple[str, int | None]:
    """An SSE chunk's error text ("" when none) and its usage.completion_tokens (None when absent)."""
    if "error" in chunk:
        return str(chunk["error"])[:200], None
    usage = chunk.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        return "", int(usage["completion_tokens"])
    return "", None


def _chunk_text(chunk: dict[str, Any]) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


async def probe_completion(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt: str, max_tokens: int
) -> RequestResult:
    """One streaming completion timed for the probe, parsing only the chunks it needs.

    The same figures as stream_completion's for decode tok/s (TTFT, latency to the last chunk with text,
    tokens from usage.completion_tokens, errors) at a fraction of the cost: the stream is read as it arrives
    (not line by line) and a chunk is parsed as JSON only until the first text (TTFT), when it carries usage or
    an error, and at the end, from the newest back to the last one with text (latency). No ITL list, no
    acceptance from meta_info (the probe plots neither). Without usage, `chunks` (the fallback count) counts the
    chunks from the first with text to the last with text, all taken as text.
    """
    body: dict[str, object] = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.0, "ignore_eos": True,
    }
    result = RequestResult(ok=False)
    started = time.monotonic()
    first_at: float | None = None
    since_first = 0  # data chunks (not usage, not errors) from the first one with text on
    tail: list[tuple[float, bytes]] = []  # the newest such chunks, unparsed
    usage_tokens: int | None = None
    buffer = b""
    try:
        async with session.post(f"{base_url}/v1/completions", json=body) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return result
            done = False
            async for data in response.content.iter_any():
                lines = (buffer + data).split(b"\n")
                buffer = lines.pop()
                for raw in lines:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    now = time.monotonic()  # per chunk, as the full client's readline loop stamps them
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    if b'"error"' in payload or b'"completion_tokens"' in payload or first_at is None:
                        try:
                            chunk = json.loads(payload)
                        except ValueError:
                            continue
                        error, tokens_so_far = _error_and_usage(chunk)
                        if error:
                            result.error = error
                            return result
                        if tokens_so_far is not None:
                            usage_tokens = tokens_so_far
                            if not _chunk_text(chunk):
                                continue
                        if first_at is None:
                            if not _chunk_text(chunk):
                                continue
                            first_at = now
                    since_first += 1
                    tail.append((now, payload))
                    del tail[:-_PROBE_TAIL]
                if done:
                    break
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        result.error = str(exc) or type(exc).__name__
        return result
    last_at = first_at
    for at, payload in reversed(tail):  # the newest chunk with text ends the decode window
        try:
            if _chunk_text(json.loads(payload)):
                last_at = at
                break
        except ValueError:
            pass
        since_first -= 1
    if first_at is not None:
        result.ttft_s = first_at - started
    result.latency_s = (last_at or time.monotonic()) - started
    result.chunks = max(since_first, 0)
    if usage_tokens is None:
        result.usage_missing = True
        result.output_tokens = result.chunks
    else:
        result.output_tokens = usage_tokens
    result.ok = result.output_tokens > 0
    if not result.ok and not result.error:
        result.error = "no tokens in the answer"
    return result


async def probe_loop(
    base_url: str,
    model: str,
    on_point: Callable[[ThroughputPoint], None],
    on_error: Callable[[str], None],
    *,
    max_tokens: int = 96,
    prompt_words: int = 64,
    seed: int = 0,
    min_decode_s: float = 0.5,
    max_growth: int = 8,
) -> None:
    """A continuous single stream; each finished request becomes a decode tok/s point. Runs until cancelled.

    Decode tok/s is measured after the first chunk: (tokens - 1) / (latency - TTFT). One stall of this client
    (a busy dashboard) or of the server's streaming before the first chunk is read squeezes that window, and
    the rest of the answer then arrives in a burst: real vLLM on CPU answers 96 tokens in ~0.3 s, and the
    dashboard read "165,000 tok/s". So a request whose decode window is under `min_decode_s` is not plotted,
    and the next one asks twice the tokens, up to `max_growth` x `max_tokens`; from then on every request
    counts (a server that fast makes stalls matter little).
    """
    prompt = synthetic_prompt(prompt_words, seed)
    timeout = aiohttp.ClientTimeout(total=120, sock_connect=3)
    tokens = max_tokens
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            result = await probe_completion(session, base_url, model, prompt, tokens)
            if result.ok and result.decode_tps is not None:
                window = (result.latency_s or 0.0) - (result.ttft_s or 0.0)
                if window < min_decode_s and tokens < max_tokens * max_growth:
                    tokens = min(tokens * 2, max_tokens * max_growth)
                    continue
                on_point(ThroughputPoint(time.time(), result.decode_tps, "probe"))
            else:
                on_error(result.error or "request failed")
                await asyncio.sleep(1.0)


# ---- benchmark runs ------------------------------------------------------------------------------
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
) -> BenchResult:
    """Warm up (excluded), then send spec.requests requests at spec.concurrency; returns every result."""
    prompts = build_prompts(spec, spec.requests, offset=spec.warmup)
    connector = aiohttp.TCPConnector(limit=max(spec.concurrency, 1), force_close=False)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s, sock_connect=5)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if spec.warmup > 0:
            warm = replace(spec, requests=spec.warmup)
            await _send_all(session, base_url, model, warm, build_prompts(spec, spec.warmup), None)
        if on_warmup_done is not None:
            on_warmup_done()
        results, wall = await _send_all(session, base_url, model, spec, prompts, on_result)
    return BenchResult(spec, results, wall, summarize(results, wall))


# ---- acceptance length ---------------------------------------------------------------------------
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
