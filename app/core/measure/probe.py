"""The dashboard's probe: one lean continuous stream whose finished requests become decode tok/s points."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from app.core.data import ThroughputPoint
from app.core.measure.client import (
    LINE_TOO_LONG,
    MAX_SSE_LINE,
    READ_ERRORS,
    BadChunk,
    RequestResult,
    StreamFailed,
    check_status,
    chunk_text,
    read_chunk,
    synthetic_prompt,
)

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
            await check_status(response)
            done = False
            async for data in response.content.iter_any():
                lines = (buffer + data).split(b"\n")
                buffer = lines.pop()
                if len(buffer) > MAX_SSE_LINE:
                    raise BadChunk(LINE_TOO_LONG)
                for raw in lines:
                    if len(raw) > MAX_SSE_LINE:
                        raise BadChunk(LINE_TOO_LONG)
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    now = time.monotonic()  # per chunk, as the full client's readline loop stamps them
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    if b'"error"' in payload or b'"completion_tokens"' in payload or first_at is None:
                        chunk, tokens_so_far = read_chunk(payload)
                        if chunk is None:
                            continue
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
    except READ_ERRORS as exc:
        result.error = str(exc) or type(exc).__name__
        return result
    last_at = first_at
    for at, payload in reversed(tail):  # the newest chunk with text ends the decode window
        try:
            chunk, _ = read_chunk(payload)
            if chunk is not None and chunk_text(chunk):
                last_at = at
                break
        except StreamFailed as exc:
            result.error = str(exc)
            return result
        since_first -= 1
    if first_at is not None:
        result.ttft_s = first_at - started
    return result.settle(started, last_at, max(since_first, 0), usage_tokens)


PROBE_FAILING_AFTER = 3
"""Failed requests in a row after which the probe counts as failing (one failure is a blip, not news)."""

PROBE_BACKOFF_S = (1.0, 30.0)
"""The wait after a failed request: the first, doubled per failure in a row, up to the second."""


@dataclass(frozen=True)
class ProbeStatus:
    """Where the probe stands; probe_loop's `on_status` hears each change of `state`.

    running: its last request gave a reading (or none failed yet); failing: `failures` requests in a row failed
    (PROBE_FAILING_AFTER or more), the last with `error`, and the next try is in `retry_in_s`; stopped: the loop
    ended, `error` says why ("" when it was cancelled, i.e. asked to stop).
    """

    state: str  # "running" | "failing" | "stopped"
    failures: int = 0
    error: str = ""
    retry_in_s: float | None = None


async def probe_loop(
    base_url: str,
    model: str,
    on_point: Callable[[ThroughputPoint], None],
    on_error: Callable[[str], None] | None = None,
    *,
    max_tokens: int = 96,
    prompt_words: int = 64,
    seed: int = 0,
    min_decode_s: float = 0.5,
    max_growth: int = 8,
    on_status: Callable[[ProbeStatus], None] | None = None,
    stall_timeout_s: float = 30.0,
) -> None:
    """A continuous single stream; each finished request becomes a decode tok/s point. Runs until cancelled.

    Decode tok/s is measured after the first chunk: (tokens - 1) / (latency - TTFT). One stall of this client
    (a busy dashboard) or of the server's streaming before the first chunk is read squeezes that window, and
    the rest of the answer then arrives in a burst (docs/decisions.md#probe-minimum-window). So a request whose
    decode window is under `min_decode_s` is not plotted, and the next one asks twice the tokens, up to
    `max_growth` x `max_tokens`; from then on every request counts (a server that fast makes stalls matter little).

    A failed request (no answer, an HTTP error, a bad chunk, `stall_timeout_s` without a byte) goes to `on_error`
    (when given: a caller that only needs `on_status`, such as the dashboard, leaves it out) and the next one
    waits PROBE_BACKOFF_S, doubled per failure in a row; the loop never ends of a bad answer.
    `on_status` hears each change of ProbeStatus.state: failing after PROBE_FAILING_AFTER failures in a row,
    running again at the next reading, stopped when the loop ends.
    """
    prompt = synthetic_prompt(prompt_words, seed)
    timeout = aiohttp.ClientTimeout(total=120, sock_connect=3, sock_read=stall_timeout_s)
    tokens = max_tokens
    status = ProbeStatus("running")

    def report(new: ProbeStatus) -> None:
        nonlocal status
        changed = new.state != status.state
        status = new
        if changed and on_status is not None:
            on_status(new)

    stopped_by = ""
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    result = await probe_completion(session, base_url, model, prompt, tokens)
                except Exception as exc:  # no reader expects it: reported and retried, never a silent end
                    result = RequestResult(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])
                if result.ok and result.decode_tps is not None:
                    report(ProbeStatus("running"))
                    window = (result.latency_s or 0.0) - (result.ttft_s or 0.0)
                    if window < min_decode_s and tokens < max_tokens * max_growth:
                        tokens = min(tokens * 2, max_tokens * max_growth)
                        continue
                    on_point(ThroughputPoint(time.time(), result.decode_tps, "probe"))
                else:
                    error = result.error or "request failed"
                    failures = status.failures + 1
                    first, cap = PROBE_BACKOFF_S
                    wait = min(first * 2 ** min(failures - 1, 16), cap)
                    if on_error is not None:
                        on_error(error)
                    if failures >= PROBE_FAILING_AFTER:
                        report(ProbeStatus("failing", failures, error, wait))
                    else:
                        status = ProbeStatus(status.state, failures, error, wait)
                    await asyncio.sleep(wait)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        stopped_by = f"{type(exc).__name__}: {exc}"[:200]
        raise
    finally:
        report(ProbeStatus("stopped", status.failures, stopped_by))
