"""The load generator's HTTP/1.1 (app/core/measure/stream_http.py) and its SSE reader (client.CompletionReader):
the same answer however the bytes are split, every framing (chunked, Content-Length, until close), the errors a
broken answer ends with, the stall and total timeouts, kept connections reused, a kept connection the server
closed retried once, and orjson's reading of a chunk agreeing with the standard library's on fuzzed payloads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.measure import client, stream_http
from app.core.measure.client import (
    LINE_TOO_LONG,
    CompletionReader,
    StreamFailed,
    chunk_text,
    completion_request,
    meta_accept_len,
    read_chunk,
    stream_completion,
)
from app.core.measure.stream_http import STALL_MESSAGE, HttpError, StreamConnection, StreamPool


def event(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}\n\n".encode()


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


TEXT = [event({"choices": [{"index": 0, "text": " a b c"}], "usage": None}) for _ in range(3)]
USAGE = event({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 9}})
META = event({"choices": [{"text": ""}], "meta_info": {"spec_verify_ct": 3, "completion_tokens": 9}})
SSE = b"".join([*TEXT, META, USAGE, event("[DONE]")])
HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
ANSWER = HEAD_CHUNKED + chunked(*TEXT, META, USAGE, event("[DONE]"))


class FakeTransport(asyncio.Transport):
    """What the protocol writes to, and whether it was aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = b""
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent += bytes(data)

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


async def answer_in_pieces(pieces: list[bytes], *, lost: bool = False, stall_s: float = 5.0,
                           total_s: float = 30.0) -> tuple[CompletionReader, StreamConnection, BaseException | None]:
    """Feed `pieces` to a StreamConnection as separate receives; the reader, the connection and any error."""
    conn = StreamConnection()
    transport = FakeTransport()
    conn.connection_made(transport)
    reader = CompletionReader(None)
    task = asyncio.create_task(conn.request(b"POST / HTTP/1.1\r\n\r\n", reader, stall_s=stall_s, total_s=total_s))
    await asyncio.sleep(0)
    for piece in pieces:
        conn.data_received(piece)
    if lost:
        conn.connection_lost(None)
    error = None
    try:
        await asyncio.wait_for(task, 5)
    except Exception as exc:
        error = exc
    return reader, conn, error


def settle(reader: CompletionReader) -> client.RequestResult:
    return reader.result.settle(reader.started, reader.last_text_at, reader.chunks, reader.usage_tokens)


async def test_the_answer_is_the_same_at_every_split_of_its_bytes() -> None:
    splits = [[ANSWER[:i], ANSWER[i:]] for i in range(1, len(ANSWER))]
    splits.append([bytes([b]) for b in ANSWER])  # one byte per receive
    for pieces in splits:
        reader, conn, error = await answer_in_pieces(pieces)
        result = settle(reader)
        assert error is None, pieces[0][-20:]
        assert result.ok and result.output_tokens == 9 and result.chunks == 3 and not result.usage_missing
        assert result.accept_len == 3.0 and len(result.itl_s) == 2 and result.ttft_s is not None
        assert conn.idle  # the body ended cleanly: the connection carries the next request


async def test_content_length_and_until_close_bodies() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(SSE)
    reader, conn, error = await answer_in_pieces([head + SSE[:50], SSE[50:]])
    assert error is None and settle(reader).output_tokens == 9 and conn.idle
    no_done = b"".join([*TEXT, USAGE])  # no [DONE]: the body's end ends the answer
    reader, conn, error = await answer_in_pieces([b"HTTP/1.1 200 OK\r\n\r\n" + no_done], lost=True)
    assert error is None and settle(reader).output_tokens == 9 and not conn.idle  # until close: not kept
    reader, conn, error = await answer_in_pieces([b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(SSE) + SSE])
    assert error is None and not conn.idle  # HTTP/1.0 without keep-alive closes


async def test_an_interim_100_answer_is_skipped() -> None:
    reader, _, error = await answer_in_pieces([b"HTTP/1.1 100 Continue\r\n\r\n" + ANSWER])
    assert error is None and settle(reader).output_tokens == 9


@pytest.mark.parametrize(("answer", "message"), [
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 20\r\n\r\n{\"message\": \"busy\"}\n",
     'HTTP 503: {"message": "busy"}\n'),
    (b"HTTP/1.1 500 Oops\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000, "HTTP 500: " + "x" * 200),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "bad answer: not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n", "bad answer: a broken HTTP header line"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * (70 * 1024), "bad answer: HTTP headers over 64 KiB"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
     "bad answer: a compressed body (Content-Encoding), which the client did not ask for"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n", "bad answer: a Content-Length that is not a number"),
    (HEAD_CHUNKED + b"zz\r\n" + SSE, "bad answer: a broken chunked body"),
    (HEAD_CHUNKED + b"5\r\nabcdeXY", "bad answer: a broken chunked body"),  # no CRLF after the data
    (HEAD_CHUNKED + b"5" * 2000, "bad answer: a broken chunked body"),
])
async def test_a_broken_answer_is_an_http_error_naming_what_was_wrong(answer: bytes, message: str) -> None:
    _, conn, error = await answer_in_pieces([answer])
    assert isinstance(error, HttpError) and str(error) == message
    assert conn.lost and not conn.idle


async def test_bad_chunks_end_the_request_with_their_kind_and_close_the_connection() -> None:
    for body, kind in [(event("5"), "bad answer: a chunk that is not a JSON object"),
                       (b"data: " + b"x" * (200 * 1024) + b"\n\n", LINE_TOO_LONG),
                       (b"data: " + b"x" * (200 * 1024), LINE_TOO_LONG),  # no newline yet: never held whole
                       (event({"error": {"message": "engine died"}}), "{'message': 'engine died'}")]:
        _, conn, error = await answer_in_pieces([HEAD_CHUNKED + chunked(TEXT[0], body)])
        assert isinstance(error, StreamFailed) and str(error) == kind
        assert conn.lost
    _, conn, error = await answer_in_pieces([HEAD_CHUNKED + b"%x\r\n%s" % (len(TEXT[0]) * 2, TEXT[0])], lost=True)
    assert isinstance(error, ConnectionResetError) and str(error) == "Server disconnected"


async def test_silence_is_a_stall_timeout_and_a_slow_answer_a_total_timeout() -> None:
    _, conn, error = await answer_in_pieces([HEAD_CHUNKED], stall_s=0.05)
    assert isinstance(error, TimeoutError) and str(error) == STALL_MESSAGE and conn.lost
    conn = StreamConnection()
    conn.connection_made(FakeTransport())
    task = asyncio.create_task(conn.request(b"x", CompletionReader(None), stall_s=0.2, total_s=0.3))
    conn.data_received(HEAD_CHUNKED)
    for _ in range(8):  # a byte every 0.05 s: never silent for 0.2 s, but longer than 0.3 s in all
        await asyncio.sleep(0.05)
        if task.done():
            break
        conn.data_received(b"1\r\n:\r\n")
    with pytest.raises(TimeoutError, match=r"no whole answer within 0\.3 s"):
        await task


async def test_a_kept_connection_times_each_request_by_its_own_limits() -> None:
    conn = StreamConnection()
    conn.connection_made(FakeTransport())
    first = asyncio.create_task(conn.request(b"x", CompletionReader(None), stall_s=0.1, total_s=0.3))
    await asyncio.sleep(0)
    conn.data_received(HEAD_CHUNKED)
    await asyncio.sleep(0.06)
    conn.data_received(chunked(TEXT[0])[:-5])
    await asyncio.sleep(0.06)  # its check ran at 0.1 s and was set again
    conn.data_received(b"0\r\n\r\n")
    await first
    reader = CompletionReader(None)
    second = asyncio.create_task(conn.request(b"x", reader, stall_s=0.1, total_s=10))
    await asyncio.sleep(0)
    conn.data_received(HEAD_CHUNKED)
    for _ in range(8):  # past the first request's 0.3 s
        await asyncio.sleep(0.05)
        conn.data_received(b"%x\r\n%s\r\n" % (len(TEXT[0]), TEXT[0]))
    conn.data_received(b"%x\r\n%s\r\n0\r\n\r\n" % (len(USAGE), USAGE))
    await second
    assert settle(reader).output_tokens == 9 and conn.idle


async def test_a_done_answer_returns_at_once_and_its_connection_drains_the_tail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At [DONE] the reader has its answer: the request returns then (the next one need not wait for this one's
    tail), and the connection becomes idle, and is offered back, only when the body's end has come."""
    conn = StreamConnection()
    conn.connection_made(FakeTransport())
    offered: list[StreamConnection] = []
    conn.on_idle = offered.append
    reader = CompletionReader(None)
    task = asyncio.create_task(conn.request(b"x", reader, stall_s=5, total_s=5))
    await asyncio.sleep(0)
    conn.data_received(HEAD_CHUNKED + chunked(*TEXT, USAGE, event("[DONE]"))[:-5])  # no 0-chunk yet
    await asyncio.wait_for(task, 1)  # the answer is whole: returned before the body's end
    assert settle(reader).output_tokens == 9 and conn.draining and not conn.idle and offered == []
    conn.data_received(b"0\r\n\r\n")
    assert conn.idle and not conn.draining and offered == [conn]
    monkeypatch.setattr(stream_http, "DRAIN_S", 0.05)
    reader, conn, error = await answer_in_pieces([HEAD_CHUNKED + chunked(*TEXT, USAGE, event("[DONE]"))[:-5]])
    assert error is None and settle(reader).output_tokens == 9 and conn.draining
    await asyncio.sleep(0.1)
    assert conn.lost and not conn.idle  # no body end within DRAIN_S: the answer is kept, the connection closed
    reader, conn, error = await answer_in_pieces([HEAD_CHUNKED + chunked(*TEXT, USAGE, event("[DONE]"))[:-5]],
                                                 lost=True)
    assert error is None and settle(reader).output_tokens == 9  # lost after [DONE]: the answer still counts


async def test_the_pool_takes_a_drained_connection_back_and_closes_the_draining_ones_at_its_end() -> None:
    pool = stream_http.StreamPool("http://127.0.0.1:9", 2)
    conn = StreamConnection()
    conn.connection_made(FakeTransport())
    task = asyncio.create_task(conn.request(b"x", CompletionReader(None), stall_s=5, total_s=5))
    await asyncio.sleep(0)
    conn.data_received(HEAD_CHUNKED + chunked(*TEXT, USAGE, event("[DONE]"))[:-5])
    await task
    pool._give_back(conn)
    assert pool._idle == [] and conn in pool._draining
    conn.data_received(b"0\r\n\r\n")
    assert pool._idle == [conn] and not pool._draining
    late = StreamConnection()
    late.connection_made(FakeTransport())
    task = asyncio.create_task(late.request(b"x", CompletionReader(None), stall_s=5, total_s=5))
    await asyncio.sleep(0)
    late.data_received(HEAD_CHUNKED + chunked(*TEXT, USAGE, event("[DONE]"))[:-5])
    await task
    pool._give_back(late)
    pool.close()
    assert conn.lost and late.lost and pool._idle == []


# ---- a real server on loopback ----------------------------------------------------------------------------


class RawServer:
    """A loopback HTTP server: answers each request with ANSWER, keeps connections, and closes a connection at
    its `close_at`-th request without answering (as a keep-alive timeout would, racing the request)."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.close_at = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.requests += 1
                if self.requests == self.close_at:
                    break
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


@pytest.fixture
async def raw_server() -> AsyncIterator[tuple[str, RawServer]]:
    state = RawServer()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/prefix/", state
    finally:
        server.close()
        await server.wait_closed()


async def test_kept_connections_are_reused_and_a_closed_one_is_retried_once(
    raw_server: tuple[str, RawServer],
) -> None:
    url, state = raw_server
    request = completion_request(url, "m", "p", 9)
    assert request.startswith(b"POST /prefix/v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    async with StreamPool(url, 2) as pool:
        results = [await stream_completion(pool, request) for _ in range(4)]
        assert all(r.ok and r.output_tokens == 9 for r in results)
        assert state.connections == 1 and state.requests == 4
        state.close_at = 5  # the kept connection dies under the 5th request, before any byte of its answer
        again = await stream_completion(pool, request)
        assert again.ok and state.connections == 2 and state.requests == 6
        both = await asyncio.gather(*(stream_completion(pool, request) for _ in range(2)))
        assert all(r.ok for r in both) and state.connections == 3  # two at once: a second connection


async def test_an_unreachable_server_is_a_connection_error() -> None:
    async with StreamPool("http://127.0.0.1:9", 1) as pool:
        result = await stream_completion(pool, completion_request("http://127.0.0.1:9", "m", "p", 4))
    assert not result.ok and "Connect call failed" in result.error


def test_a_base_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="'ftp://x': not an http"):
        StreamPool("ftp://x", 1)


# ---- orjson agrees with the standard library ----------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=8)
chunks = st.fixed_dictionaries({}, optional={
    "choices": st.one_of(values, st.lists(st.fixed_dictionaries({}, optional={
        "text": values, "delta": st.one_of(values, st.fixed_dictionaries({}, optional={"content": values}))}),
        max_size=2)),
    "usage": st.one_of(values, st.fixed_dictionaries({}, optional={"completion_tokens": scalars})),
    "meta_info": st.one_of(values, st.fixed_dictionaries({}, optional={"spec_verify_ct": scalars,
                                                                       "completion_tokens": scalars})),
    "error": values,
    "created": values,
})


def outcome(payload: bytes) -> tuple[Any, ...]:
    """What a reader makes of one payload: its tokens, text and acceptance, or its error's class and text."""
    try:
        chunk, tokens = read_chunk(payload)
        if chunk is None:
            return ("empty",)
        return tokens, chunk_text(chunk), meta_accept_len(chunk, tokens)
    except StreamFailed as exc:
        return type(exc), str(exc)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(chunks.map(lambda c: json.dumps(c).encode()), st.binary(max_size=60),
                 chunks.map(lambda c: json.dumps(c, ensure_ascii=False).encode())))
def test_orjson_reads_every_payload_as_the_standard_library_does(payload: bytes) -> None:
    fast = outcome(payload)
    with mock.patch.object(client.orjson, "loads", side_effect=client.orjson.JSONDecodeError("refused", "", 0)):
        reference = outcome(payload)  # the standard library's reading alone
    assert fast == reference


def reference_reading(payloads: list[bytes]) -> tuple[Any, ...]:
    """The stream read with the general functions alone: chunks with text, tokens, acceptance, or the error."""
    tokens, accept, texts = None, None, 0
    try:
        for payload in payloads:
            chunk, so_far = read_chunk(payload)
            if chunk is None:
                continue
            tokens = so_far if so_far is not None else tokens
            accept = meta_accept_len(chunk, tokens) or accept
            texts += bool(chunk_text(chunk))
    except StreamFailed as exc:
        return type(exc), str(exc)
    return texts, tokens, accept


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(chunks, st.fixed_dictionaries({"choices": st.lists(st.fixed_dictionaries(
    {"text": st.one_of(st.text(max_size=3), st.none())}), min_size=1, max_size=2)})), max_size=5))
def test_the_reader_finds_what_the_general_functions_find(stream: list[dict[str, Any]]) -> None:
    payloads = [json.dumps(c).encode() for c in stream]
    reader = CompletionReader(None)
    try:
        reader.feed(b"".join(b"data: " + p + b"\n\n" for p in payloads), 1.0)
        got: tuple[Any, ...] = (reader.chunks, reader.usage_tokens, reader.result.accept_len)
    except StreamFailed as exc:
        got = type(exc), str(exc)
    assert got == reference_reading(payloads)
