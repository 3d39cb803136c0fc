"""The streaming OpenAI-compatible client: one timed request, its RequestResult, synthetic prompts.

The load generator's requests are built once before a run (completion_request) and sent on the kept connections of
a stream_http.StreamPool; CompletionReader reads the SSE lines as bytes in the callback that received them
(docs/decisions.md#benchmark-client). Chunks are parsed with orjson; the standard library's json reads what orjson
refuses and decides every error's kind, so both give one answer.

Tokens are counted from `usage.completion_tokens` (stream_options.include_usage), never from the
number of SSE chunks: speculative decoding sends several tokens per chunk. When a server sends no
usage, the count falls back to the number of content chunks and the result says so (`usage_missing`;
the summary warns). Per request: TTFT, inter-chunk latencies (ITL), TPOT = (latency - TTFT) /
(tokens - 1), end-to-end latency, errors (counted and kept, never dropped). Every chunk is checked where it is
read (read_chunk, chunk_text, meta_accept_len): a bad one ends its request as an error of its kind (BadChunk), a
stream silent for STALL_TIMEOUT_S as a timeout, never an exception out of a benchmark.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from app.core.errors import Reason, TunedashError
from app.core.measure.stream_http import HttpError, Origin, StreamPool

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

    def settle(
        self, started: float, last_text_at: float | None, chunks: int, usage_tokens: int | None
    ) -> RequestResult:
        """Finish a stream that ended without an error, the same for both readers (client and probe).

        Latency runs from `started` to the last chunk with text (to now when there was none); the tokens are the
        stream's usage count, else the `chunks` (marked usage_missing); ok when there is at least one token.
        """
        self.latency_s = (last_text_at or time.monotonic()) - started
        self.chunks = chunks
        if usage_tokens is None:
            self.usage_missing = True
            self.output_tokens = chunks
        else:
            self.output_tokens = usage_tokens
        self.ok = self.output_tokens > 0
        if not self.ok and not self.error:
            self.error = "no tokens in the answer"
        return self


class StreamFailed(TunedashError):
    """The server answered a streaming request with an error: a status other than 200, or an error chunk.

    The message is the text a RequestResult keeps as its `error`.
    """

    title = "Request failed"
    default_reason = Reason.NO_TOKENS


class BadChunk(StreamFailed):
    """An answer that breaks the streaming protocol (a chunk that is not a JSON object, a count that is not a
    number, a line that is not UTF-8 or is too long). The message names the kind and never quotes the chunk, so a
    benchmark's error kinds count each kind once."""


MAX_SSE_LINE = 128 * 1024
"""The longest SSE line either reader takes (bytes): a longer one is a bad answer, never held whole."""

LINE_TOO_LONG = f"bad answer: an SSE line over {MAX_SSE_LINE // 1024} KiB"
NOT_UTF8 = "bad answer: a chunk that is not UTF-8"

READ_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, StreamFailed, HttpError)
"""What ends a streamed request as an error result (the exception's text, else its type's name)."""

STALL_TIMEOUT_S = 120.0
"""A streamed request that receives no byte for this long (after its headers, too) ends as a timeout error."""


async def check_status(response: aiohttp.ClientResponse) -> None:
    """Raise StreamFailed for an answer other than 200, with the status and the start of its body."""
    if response.status != 200:
        start = b""
        while len(start) < 1024 and (more := await response.content.read(1024 - len(start))):
            start += more
        raise StreamFailed(f"HTTP {response.status}: {start.decode(errors='replace')[:200]}")


def completion_request(
    base_url: str, model: str, prompt: str, max_tokens: int, *, chat: bool = False, ignore_eos: bool = True
) -> bytes:
    """One streaming completion request (head and body), built once before a run and sent as is."""
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
    else:
        body["prompt"] = prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return Origin(base_url).post(path, orjson.dumps(body))


class CompletionReader:
    """Reads one streamed completion as its bytes arrive (a BodySink of stream_http): SSE lines split on bytes,
    each `data:` payload read by read_chunk, meta_accept_len and chunk_text; TTFT and ITL stamped with the clock
    reading of the receive that brought the chunk (chunks of one receive arrived together)."""

    __slots__ = ("_tail", "chunks", "last_text_at", "result", "started", "usage_tokens")

    def __init__(self, run_started: float | None) -> None:
        self.result = RequestResult(ok=False)
        self.started = time.monotonic()
        if run_started is not None:
            self.result.start_s = self.started - run_started
        self.last_text_at: float | None = None
        self.chunks = 0
        self.usage_tokens: int | None = None
        self._tail = b""

    def feed(self, data: bytes, now: float) -> bool:
        """Read the lines `data` completes; True once `data: [DONE]` came. Raises BadChunk or StreamFailed."""
        if self._tail:
            data = self._tail + data
        lines = data.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > MAX_SSE_LINE:
            raise BadChunk(LINE_TOO_LONG)
        result = self.result
        for line in lines:
            if len(line) > MAX_SSE_LINE:
                raise BadChunk(LINE_TOO_LONG)
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return True
            chunk, tokens_so_far = read_chunk(payload)
            if chunk is None:
                continue
            if tokens_so_far is not None:
                self.usage_tokens = tokens_so_far
            if chunk.get("meta_info") is not None:
                accept_len = meta_accept_len(chunk, self.usage_tokens)
                if accept_len is not None:
                    result.accept_len = accept_len
            choices = chunk.get("choices")
            if (type(choices) is list and len(choices) == 1 and type(choice := choices[0]) is dict
                    and type(piece := choice.get("text")) is str and piece):
                has_text = True  # one choice with text: what chunk_text finds, without its walk
            else:
                has_text = bool(chunk_text(chunk))
            if has_text:
                if result.ttft_s is None:
                    result.ttft_s = now - self.started
                elif self.last_text_at is not None:
                    result.itl_s.append(now - self.last_text_at)
                self.last_text_at = now
                self.chunks += 1
        return False


async def stream_completion(pool: StreamPool, request: bytes, *, run_started: float | None = None) -> RequestResult:
    """Send one prepared streaming request (completion_request) on a kept connection of `pool` and time it."""
    readers: list[CompletionReader] = []

    def reader() -> CompletionReader:
        readers.append(CompletionReader(run_started))
        return readers[-1]

    try:
        await pool.stream(request, reader)
    except READ_ERRORS as exc:
        result = readers[-1].result if readers else RequestResult(ok=False)
        result.error = str(exc) or type(exc).__name__
        return result
    done = readers[-1]
    return done.result.settle(done.started, done.last_text_at, done.chunks, done.usage_tokens)


MAX_TOKENS_COUNT = 10**9
"""More tokens than this in one answer is not a count but a broken server."""


def read_chunk(payload: str | bytes) -> tuple[dict[str, Any] | None, int | None]:
    """An SSE `data:` payload as (chunk, its usage.completion_tokens or None); (None, None) for an empty payload.

    The one reading of a chunk's error and usage for both readers (client and probe), so they cannot drift on
    what counts as a token or an error: an error chunk raises StreamFailed with the error's text; a payload that is
    not UTF-8, not JSON, not a JSON object, or whose usage is not a count raises BadChunk naming the kind.
    """
    if not payload:
        return None, None
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        chunk = _json_loads(payload)
    else:
        if isinstance(chunk, dict) and "error" in chunk:
            chunk = _json_loads(payload)  # the error's text as the standard library reads it (numbers past 64 bits)
    if not isinstance(chunk, dict):
        raise BadChunk("bad answer: a chunk that is not a JSON object")
    if "error" in chunk:
        error = str(chunk["error"])[:200]
        if error:
            raise StreamFailed(error)
        return chunk, None
    usage = chunk.get("usage")
    if usage is None:
        return chunk, None
    if not isinstance(usage, dict):
        raise BadChunk("bad answer: usage is not an object")
    tokens = usage.get("completion_tokens")
    if tokens is None:
        return chunk, None
    count = _count(tokens)
    if count is None:
        raise BadChunk("bad answer: usage.completion_tokens is not a token count")
    return chunk, count


def _json_loads(payload: str | bytes) -> Any:
    """The standard library's reading of a payload: the one that decides what orjson refuses (NaN, 1e400, lone
    surrogates, more than 1024 levels) and every error's kind."""
    if isinstance(payload, bytes):
        try:
            payload = payload.decode()
        except UnicodeDecodeError:
            raise BadChunk(NOT_UTF8) from None
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        raise BadChunk("bad answer: a chunk that is not JSON") from None


def _count(value: object) -> int | None:
    """A JSON number that is a whole count 0..MAX_TOKENS_COUNT (3 or 3.0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if 0 <= value <= MAX_TOKENS_COUNT else None


def meta_accept_len(chunk: dict[str, Any], usage_tokens: int | None) -> float | None:
    """SGLang's per-request acceptance length from meta_info (completion_tokens / spec_verify_ct), else None;
    counts that are not numbers are a BadChunk."""
    meta = chunk.get("meta_info")
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise BadChunk("bad answer: meta_info is not an object")
    verify = meta.get("spec_verify_ct")
    tokens = meta.get("completion_tokens")
    for value in (verify, tokens):
        if value is not None and _count(value) is None:
            raise BadChunk("bad answer: a meta_info count is not a count")
    if not verify:
        return None
    tokens = tokens or usage_tokens
    return float(tokens) / float(verify) if tokens else None


def chunk_text(chunk: dict[str, Any]) -> str:
    """The text an SSE chunk carries: its choices' `text` (completions) or `delta.content` (chat), joined.

    Choices that are not a list of objects, or a text that is not a string, raise BadChunk.
    """
    choices = chunk.get("choices")
    if choices is None:
        return ""
    if not isinstance(choices, list):
        raise BadChunk("bad answer: choices is not a list")
    text = ""
    for choice in choices:
        if not isinstance(choice, dict):
            raise BadChunk("bad answer: a choice that is not an object")
        piece = choice.get("text")
        if not piece:
            delta = choice.get("delta")
            if delta is not None and not isinstance(delta, dict):
                raise BadChunk("bad answer: a choice's delta is not an object")
            piece = piece if delta is None or not delta.get("content") else delta["content"]
        if piece is None:
            continue
        if not isinstance(piece, str):
            raise BadChunk("bad answer: a choice's text is not a string")
        text += piece
    return text

