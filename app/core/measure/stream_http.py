"""The load generator's HTTP/1.1: kept connections, one streamed POST at a time, its body handed over as it arrives.

Why not aiohttp here (it serves every other request of tunedash): its reader costs several Python calls and an
await per HTTP chunk, and a streaming server sends one HTTP chunk per SSE event; this protocol decodes the chunked
body in the callback that received the bytes and hands them to the reader (`BodySink`) there, with one clock
reading per receive (docs/decisions.md#benchmark-client). What it takes from the server is checked here: the
status line, the headers (64 KiB at most), the framing (chunked, Content-Length or until close); any other answer
is an `HttpError` naming what was wrong, a lost connection an OSError, silence a TimeoutError.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from app.core.errors import Reason, TunedashError

MAX_HEAD = 64 * 1024
"""The longest status line and headers taken (bytes)."""

MAX_CHUNK_LINE = 1024
"""The longest chunk-size line of a chunked body taken (bytes)."""

ERROR_BODY = 1024
"""How much of an answer other than 200 is read for its error message (bytes)."""

DRAIN_S = 1.0
"""How long a request whose reader had the whole answer ([DONE]) waits for the body's end; then the connection is
closed and the answer kept."""

STALL_MESSAGE = "Timeout on reading data from socket"  # aiohttp's text for the same event: history stays comparable


class HttpError(TunedashError):
    """An answer that is not the HTTP the client asked for: a status other than 200 (with the start of its body),
    a broken status line, headers or chunk framing. The message is the text a RequestResult keeps as its error."""

    title = "Bad HTTP answer"
    default_reason = Reason.NO_TOKENS


class BodySink(Protocol):
    """What reads a streamed body: `feed` gets each part with the clock reading of its receive and says whether the
    answer is complete (the body's end then only frees the connection); it may raise to end the request."""

    def feed(self, data: bytes, now: float) -> bool: ...


class Origin:
    """Where requests go: scheme, host and port of a base URL, and the path before the API's."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r}: not an http:// or https:// URL with a host")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc.rpartition("@")[2]
        self.prefix = parts.path.rstrip("/")

    def post(self, path: str, body: bytes, content_type: str = "application/json") -> bytes:
        """The whole request (head and body) of a POST to `path` under the base URL, built once, sent as is."""
        head = (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\nUser-Agent: tunedash\r\n"
                f"Accept: text/event-stream\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n")
        return head.encode("ascii") + body


_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _LENGTH, _UNTIL_CLOSE, _IDLE = range(8)


class StreamConnection(asyncio.Protocol):
    """One kept HTTP/1.1 connection; `request` sends one prepared POST and returns when its answer was read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.reusable = False  # the last answer ended cleanly and the server keeps the connection
        self._state = _IDLE
        self._buffer = b""
        self._need = 0  # bytes left in the current chunk or Content-Length body
        self._sink: BodySink | None = None
        self._status = 0
        self._error_body = b""
        self._keep_alive = True
        self._answer: asyncio.Future[None] | None = None  # the reader's answer (complete, or failed)
        self._last_rx = 0.0
        self._complete = False  # the sink had the whole answer; the body's end may still be on its way
        self._drain: asyncio.TimerHandle | None = None  # DRAIN_S from then on
        self._watch_handle: asyncio.TimerHandle | None = None  # the current request's stall and total check
        self.received = 0  # bytes of the current answer
        self.on_idle: Callable[[StreamConnection], None] | None = None  # told once a drained body has ended

    # ---- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        if self._state == _UNTIL_CLOSE and exc is None:
            self._end_body()
        elif self._state != _IDLE:
            self._fail(ConnectionResetError("Server disconnected"))

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        self._last_rx = now
        self.received += len(data)
        if self._state == _IDLE:  # bytes nobody asked for: the connection is not HTTP we can trust
            self._fail(HttpError("bad answer: bytes after the end of an answer"))
            return
        try:
            self._read(self._buffer + data if self._buffer else data, now)
        except Exception as exc:  # the sink's or the framing's: ends this request, never the event loop
            self._fail(exc)

    # ---- the request ------------------------------------------------------------------------------------
    async def request(self, prepared: bytes, sink: BodySink, *, stall_s: float, total_s: float) -> None:
        """Send `prepared` and feed the answer's body to `sink` until it says the answer is complete (or the body
        ends), and return then: the body's end may still be on its way, and the connection drains it by itself
        (DRAIN_S at most, else it is closed) before `on_idle` offers it for the next request, so no request waits
        for another's tail. Raises HttpError, OSError (the connection), TimeoutError (`stall_s` without a byte,
        `total_s` in all), or what the sink raised; nothing once the sink had the whole answer."""
        assert self.transport is not None and self._state == _IDLE
        loop = asyncio.get_running_loop()
        self._sink = sink
        self._state = _HEAD
        self._buffer = b""
        self._status = 0
        self._error_body = b""
        self._keep_alive = True
        self.reusable = False
        self.received = 0
        self._complete = False
        self._answer = loop.create_future()
        started = self._last_rx = time.monotonic()
        deadline = started + total_s
        self._watch_handle = loop.call_later(min(stall_s, total_s), self._watch, stall_s, deadline, total_s)
        self.transport.write(prepared)
        try:
            await self._answer
        except BaseException:
            self.close()
            raise
        finally:
            self._watch_handle.cancel()
            self._sink = None

    @property
    def draining(self) -> bool:
        """The reader had its whole answer; the body's end has not come yet (it will within DRAIN_S, or the
        connection closes)."""
        return self._complete and self._state != _IDLE and not self.lost

    @property
    def idle(self) -> bool:
        """Open, between answers, and the last one left it fit to carry the next request."""
        return self._state == _IDLE and self.reusable and not self.lost

    def close(self) -> None:
        self.reusable = False
        self._state = _IDLE
        if self._drain is not None:
            self._drain.cancel()
        if self.transport is not None and not self.lost:
            self.transport.abort()
        self.lost = True

    def _watch(self, stall_s: float, deadline: float, total_s: float) -> None:
        if self._answer is None or self._answer.done():
            return
        now = time.monotonic()
        if now >= deadline:
            self._fail(TimeoutError(f"no whole answer within {total_s:g} s"))
            return
        silent = now - self._last_rx
        if silent >= stall_s:
            self._fail(TimeoutError(STALL_MESSAGE))
            return
        self._watch_handle = asyncio.get_running_loop().call_later(
            min(stall_s - silent, deadline - now), self._watch, stall_s, deadline, total_s)

    # ---- the answer ---------------------------------------------------------------------------------
    def _read(self, data: bytes, now: float) -> None:
        pos = 0
        body: list[bytes] = []
        while pos < len(data) and self._state != _IDLE:
            state = self._state
            if state == _CHUNK_DATA:
                take = min(self._need, len(data) - pos)
                body.append(data[pos:pos + take])
                self._need -= take
                pos += take
                if self._need == 0:
                    self._state = _CHUNK_END
            elif state == _CHUNK_END:  # the CRLF after a chunk's data
                if len(data) - pos < 2:
                    if data[pos:] not in (b"", b"\r"):
                        raise HttpError("bad answer: a broken chunked body")
                    break
                if data[pos:pos + 2] != b"\r\n":
                    raise HttpError("bad answer: a broken chunked body")
                pos += 2
                self._state = _CHUNK_SIZE
            elif state in (_CHUNK_SIZE, _TRAILER):
                end = data.find(b"\r\n", pos)
                if end < 0:
                    if len(data) - pos > MAX_CHUNK_LINE:
                        raise HttpError("bad answer: a broken chunked body")
                    break
                line = data[pos:end]
                pos = end + 2
                if state == _TRAILER:
                    if not line:
                        self._deliver(body, now)
                        body = []
                        self._end_body()
                    continue
                size = _chunk_size(line)
                stop = pos + size
                if size and stop + 2 <= len(data):  # the whole chunk is here (the usual case): taken at once
                    if data[stop:stop + 2] != b"\r\n":
                        raise HttpError("bad answer: a broken chunked body")
                    body.append(data[pos:stop])
                    pos = stop + 2
                else:
                    self._need = size
                    self._state = _CHUNK_DATA if size else _TRAILER
            elif state == _LENGTH:
                take = min(self._need, len(data) - pos)
                body.append(data[pos:pos + take])
                self._need -= take
                pos += take
                if self._need == 0:
                    self._deliver(body, now)
                    body = []
                    self._end_body()
            elif state == _UNTIL_CLOSE:
                body.append(data[pos:])
                pos = len(data)
            else:  # _HEAD
                end = data.find(b"\r\n\r\n", pos)
                if end < 0:
                    if len(data) - pos > MAX_HEAD:
                        raise HttpError(f"bad answer: HTTP headers over {MAX_HEAD // 1024} KiB")
                    break
                self._head(data[pos:end])
                pos = end + 4
        if self._state == _IDLE and pos < len(data):  # bytes past the answer's end: not HTTP we can trust
            self.reusable = False
        self._buffer = data[pos:] if pos < len(data) and self._state != _IDLE else b""
        if body:
            self._deliver(body, now)

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
            raise HttpError("bad answer: not an HTTP/1.x status line")
        status = int(parts[1])
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            return
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise HttpError("bad answer: a broken HTTP header line")
            headers[name.lower()] = value.strip().lower()
        self._status = status
        connection = headers.get(b"connection", b"")
        self._keep_alive = (b"close" not in connection and
                            (parts[0] != b"HTTP/1.0" or b"keep-alive" in connection))
        if headers.get(b"content-encoding", b"identity") != b"identity":
            raise HttpError("bad answer: a compressed body (Content-Encoding), which the client did not ask for")
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            self._state = _CHUNK_SIZE
        elif b"content-length" in headers:
            length = headers[b"content-length"]
            if not length.isdigit():
                raise HttpError("bad answer: a Content-Length that is not a number")
            self._need = int(length)
            self._state = _LENGTH if self._need else _IDLE
            if not self._need:
                self._end_body()
        else:
            self._keep_alive = False
            self._state = _UNTIL_CLOSE

    def _deliver(self, body: list[bytes], now: float) -> None:
        data = body[0] if len(body) == 1 else b"".join(body)
        if self._status != 200:
            self._error_body = (self._error_body + data)[:ERROR_BODY]
            if len(self._error_body) >= ERROR_BODY:
                self._fail(self._status_error())
            return
        if self._sink is not None and not self._complete and data and self._sink.feed(data, now):
            self._complete = True
            self._drain = asyncio.get_running_loop().call_later(DRAIN_S, self._fail, TimeoutError("no body end"))
            if self._answer is not None and not self._answer.done():
                self._answer.set_result(None)  # the reader has its answer: the tail drains without it

    def _end_body(self) -> None:
        self._state = _IDLE
        self.reusable = self._keep_alive and not self.lost
        if self._status != 200:
            self._fail(self._status_error())
        elif self._answer is not None and not self._answer.done():
            self._answer.set_result(None)  # the body ended: its reader settles what it has
        if self._drain is not None:
            self._drain.cancel()
        if not self.reusable:
            self.close()
        elif self.on_idle is not None:
            told, self.on_idle = self.on_idle, None
            told(self)

    def _status_error(self) -> HttpError:
        return HttpError(f"HTTP {self._status}: {self._error_body.decode(errors='replace')[:200]}")

    def _fail(self, exc: BaseException) -> None:
        """End the request with `exc`, or as done when its sink already had the whole answer; close."""
        if self._answer is not None and not self._answer.done():
            if self._complete:
                self._answer.set_result(None)
            else:
                self._answer.set_exception(exc)
        self.close()


_HEX = b"0123456789abcdefABCDEF"


def _chunk_size(line: bytes) -> int:
    if 0 < len(line) <= 16 and not line.strip(_HEX):  # hex digits only: no sign, 0x, underscore or space
        return int(line, 16)
    size = line.partition(b";")[0].strip()  # with a chunk extension
    if not size or len(size) > 16 or size.strip(_HEX):
        raise HttpError("bad answer: a broken chunked body")
    return int(size, 16)


class StreamPool:
    """Kept connections to one server, at most `size` requests in flight; `stream` sends one prepared request on a
    free connection (one still draining its last body's end, DRAIN_S at most, may be open beside them).

    A kept connection the server closed before any byte of the answer is retried once on a new one (the server
    read nothing of it: keep-alive timeouts close idle connections); any other failure is the request's.
    """

    def __init__(self, base_url: str, size: int, *, connect_s: float = 5.0, stall_s: float = 120.0,
                 total_s: float = 600.0) -> None:
        self.origin = Origin(base_url)
        self.size = max(size, 1)
        self.connect_s, self.stall_s, self.total_s = connect_s, stall_s, total_s
        self._idle: list[StreamConnection] = []
        self._closed = False
        self._draining: set[StreamConnection] = set()  # handed back before their body's end (StreamConnection)
        self._slots = asyncio.Semaphore(self.size)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.origin.tls else None

    async def __aenter__(self) -> StreamPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        for conn in [*self._idle, *self._draining]:
            conn.close()
        self._idle.clear()
        self._draining.clear()

    async def stream(self, prepared: bytes, sink_for: Callable[[], BodySink]) -> BodySink:
        """Send `prepared`, its body to a new sink from `sink_for`; the sink that read the answer."""
        async with self._slots:
            conn, reused = await self._take()
            sink = sink_for()
            try:
                await conn.request(prepared, sink, stall_s=self.stall_s, total_s=self.total_s)
            except (ConnectionResetError, BrokenPipeError):
                if not reused or conn.received:
                    raise
                conn, _ = await self._take(fresh=True)
                sink = sink_for()
                await conn.request(prepared, sink, stall_s=self.stall_s, total_s=self.total_s)
            finally:
                self._give_back(conn)
            return sink

    async def _take(self, fresh: bool = False) -> tuple[StreamConnection, bool]:
        while self._idle and not fresh:
            conn = self._idle.pop()
            if conn.idle and conn.transport is not None and not conn.transport.is_closing():
                return conn, True
            conn.close()
        loop = asyncio.get_running_loop()
        origin = self.origin
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(
                    StreamConnection, origin.host, origin.port, ssl=self._ssl,
                    server_hostname=origin.host if self._ssl else None)
        except TimeoutError:
            raise TimeoutError(f"Connection timeout to host {origin.host}:{origin.port}") from None
        return conn, False

    def _give_back(self, conn: StreamConnection) -> None:
        if conn.idle and len(self._idle) < self.size and not self._closed:
            self._idle.append(conn)
        elif conn.draining and not self._closed:
            self._draining.add(conn)
            conn.on_idle = self._drained  # back in the pool once the body's end has come
        else:
            conn.close()

    def _drained(self, conn: StreamConnection) -> None:
        self._draining.discard(conn)
        self._give_back(conn)
