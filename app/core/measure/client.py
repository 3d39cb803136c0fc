"""The streaming OpenAI-compatible client: one timed request, its RequestResult, synthetic prompts.

Tokens are counted from `usage.completion_tokens` (stream_options.include_usage), never from the
number of SSE chunks: speculative decoding sends several tokens per chunk. When a server sends no
usage, the count falls back to the number of content chunks and the result says so (`usage_missing`;
the summary warns). Per request: TTFT, inter-chunk latencies (ITL), TPOT = (latency - TTFT) /
(tokens - 1), end-to-end latency, errors (counted and kept, never dropped).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

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
                error, tokens_so_far = error_and_usage(chunk)
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
                if chunk_text(chunk):
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


def error_and_usage(chunk: dict[str, Any]) -> tuple[str, int | None]:
    """An SSE chunk's error text ("" when none) and its usage.completion_tokens (None when absent)."""
    if "error" in chunk:
        return str(chunk["error"])[:200], None
    usage = chunk.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        return "", int(usage["completion_tokens"])
    return "", None


def chunk_text(chunk: dict[str, Any]) -> str:
    """The text an SSE chunk carries: its choices' `text` (completions) or `delta.content` (chat), joined."""
    text = ""
    for choice in chunk.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text

