"""The dashboard's probe: one lean continuous stream whose finished requests become decode tok/s points."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import aiohttp

from app.core.data import ThroughputPoint
from app.core.measure.client import RequestResult, chunk_text, error_and_usage, synthetic_prompt

_PROBE_TAIL = 4
"""How many of a probe answer's last chunks are kept unparsed, to find the last one with text at the end."""


async def probe_completion(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt: str, max_tokens: int
) -> RequestResult:
    """One streaming completion timed for the probe, parsing only the chunks it needs (docs/decisions.md#probe-reader).

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
                        error, tokens_so_far = error_and_usage(chunk)
                        if error:
                            result.error = error
                            return result
                        if tokens_so_far is not None:
                            usage_tokens = tokens_so_far
                            if not chunk_text(chunk):
                                continue
                        if first_at is None:
                            if not chunk_text(chunk):
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
            if chunk_text(json.loads(payload)):
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
    the rest of the answer then arrives in a burst (docs/decisions.md#probe-minimum-window). So a request whose
    decode window is under `min_decode_s` is not plotted, and the next one asks twice the tokens, up to
    `max_growth` x `max_tokens`; from then on every request counts (a server that fast makes stalls matter little).
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

