"""Streaming OpenAI-compatible load generation: one request's timings, and the probe (a continuous stream).

Tokens are counted from `usage.completion_tokens` (stream_options.include_usage), never from the
number of SSE chunks: speculative decoding sends several tokens per chunk. When a server sends no
usage, the count falls back to the number of content chunks and the result says so (`usage_missing`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from app.core.model import ThroughputPoint

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

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (tokens - 1): time per output token after the first."""
        if self.latency_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def decode_tps(self) -> float | None:
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
                if "error" in chunk:
                    result.error = str(chunk["error"])[:200]
                    return result
                usage = chunk.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    usage_tokens = int(usage["completion_tokens"])
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
    if usage_tokens is None:
        result.usage_missing = True
        result.output_tokens = chunks
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
) -> None:
    """A continuous single stream; each finished request becomes a decode tok/s point. Runs until cancelled."""
    prompt = synthetic_prompt(prompt_words, seed)
    timeout = aiohttp.ClientTimeout(total=120, sock_connect=3)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            result = await stream_completion(session, base_url, model, prompt, max_tokens)
            if result.ok and result.decode_tps is not None:
                on_point(ThroughputPoint(time.time(), result.decode_tps, "probe"))
            else:
                on_error(result.error or "request failed")
                await asyncio.sleep(1.0)
