"""The dashboard in a browser: textual-serve's Server behind an access token (`tunedash serve`).

textual-serve runs one process per browser tab (a WebSocket carries its terminal); this module adds what a
dashboard that can kill servers needs before it goes on a port. Every request (the page, the WebSocket, the
static files) must name the access token as the first part of its path, `/t/<token>/...`, the URL `tunedash
serve` prints; nothing is kept in a cookie, so a browser never sends the token anywhere else (a cookie of
127.0.0.1 goes to every port of it). A WebSocket must come from the page's own origin; the page's URLs follow
the Host the browser used (an SSH port forward on another port works). Every answer forbids framing and names
this server as the page's only source; the page pulls nothing from outside. Tabs are bounded in number
(`max_tabs`, 503 beyond) and in size (MAX_WIDTH x MAX_HEIGHT cells), each tab's process dies with `serve`
(PR_SET_PDEATHSIG), and a tab whose dashboard ends says so on the page. The token is compared with
hmac.compare_digest and never logged: aiohttp's access log is off. docs/architecture.md#the-web-view has the
picture, README "The dashboard in a browser" the security model.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hmac
import json
import logging
import os
import shlex
import signal
import socket
import sys
from asyncio.subprocess import PIPE, Process
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp_jinja2
from aiohttp import WSCloseCode, WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.server import Server, to_int

PATH_PREFIX = "/t/"  # a page's path is PATH_PREFIX + token + "/" + what it asks for
REFUSED = ("403: this tunedash dashboard needs its access token. Open the whole URL `tunedash serve` printed "
           "(http://HOST:PORT/t/<token>/); a new `tunedash serve` prints a new one.\n")
SHUTDOWN_S = 5.0  # how long serving waits for the tabs' dashboards to quit when it stops
DEFAULT_MAX_TABS = 8
MAX_WIDTH, MAX_HEIGHT = 500, 200  # cells; a tab asking for more gets this (a 4K screen at a small font is ~480x130)
PAGE_FOLDER = Path(__file__).with_name("web_page")
# The page's only source is this server (its inline styles aside: xterm.js adds its own); never inside a frame.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data:; font-src 'self'; connect-src 'self'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'")
ANSWER_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
                  "X-Frame-Options": "DENY", "Content-Security-Policy": CONTENT_SECURITY_POLICY}
log = logging.getLogger("tunedash.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AccessGate:
    """The access token of one `tunedash serve`: which requests carry it (in their path), and the middleware."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the access token is empty")
        self._token = token.encode()
        self.prefix = f"{PATH_PREFIX}{token}"
        """Every path this server answers starts with it (then "/")."""

    def admits(self, request: web.Request) -> bool:
        """Whether the request's path starts with /t/<token> (compared in constant time)."""
        path = request.path
        if not path.startswith(PATH_PREFIX):
            return False
        named = path[len(PATH_PREFIX):].split("/", 1)[0]
        return hmac.compare_digest(named.encode("utf-8", "surrogateescape"), self._token)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse (403) a request without the token, or a WebSocket from another origin; /t/<token> alone is sent
        on to /t/<token>/."""
        if not self.admits(request) or (request.path == f"{self.prefix}/ws" and not same_origin(request)):
            return web.Response(status=403, text=REFUSED)
        if request.path == self.prefix:
            return web.Response(status=308, headers={"Location": f"{self.prefix}/"})
        return await handler(request)


async def add_answer_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: ANSWER_HEADERS on every answer (page, static file, WebSocket, refusal)."""
    response.headers.update(ANSWER_HEADERS)


def same_origin(request: web.Request) -> bool:
    """Whether a request's Origin (sent by every browser on a WebSocket) is the page's own host; a client that
    sends none (not a browser) passes on its token alone."""
    origin = request.headers.get("Origin")
    return origin is None or origin in (f"http://{request.host}", f"https://{request.host}")


def clamp_size(width: int, height: int) -> tuple[int, int]:
    """A terminal size in cells within 1..MAX_WIDTH x 1..MAX_HEIGHT."""
    return min(max(width, 1), MAX_WIDTH), min(max(height, 1), MAX_HEIGHT)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def dies_with(parent: int) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGTERM when `parent` (the thread that forks it, serve's loop) dies, however
    it dies (kill -9 too); a child whose parent died before it could ask exits at once. Linux; elsewhere nothing."""

    def ask() -> None:
        if _LIBC is None:
            return
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return ask


class TabService(AppService):
    """textual-serve's AppService for one tab, its dashboard started from an argv (no shell) that dies with
    `serve`; when that process ends the tab's WebSocket is closed, so the page says "Session ended"."""

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        super().__init__(shlex.join(argv), **kwargs)
        self.argv = argv

    async def _open_app_process(self, width: int = 80, height: int = 24) -> Process:
        self._process = process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=PIPE, stdout=PIPE, stderr=PIPE, env=self._build_environment(width, height),
            preexec_fn=dies_with(os.getpid()))
        assert process.stdin is not None
        self._stdin = process.stdin
        return process

    async def run(self) -> None:
        try:
            await super().run()
        finally:  # the dashboard's output ended: it quit or died. Its pipes are let go, and the page shows it
            if self._stdin is not None:
                self._stdin.close()
            if self._process is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._process.wait(), SHUTDOWN_S)
            await self.remote_close()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None


class DashboardServer(Server):
    """textual-serve's Server for one dashboard argv, under the AccessGate's path; it keeps the tabs it started
    (each one's dashboard process and WebSocket), at most `max_tabs` at once, so that stopping it stops them."""

    def __init__(self, argv: list[str], gate: AccessGate, *, title: str, max_tabs: int = DEFAULT_MAX_TABS) -> None:
        super().__init__(shlex.join(argv), title=title, templates_path=PAGE_FOLDER)
        if max_tabs < 1:
            raise ValueError("max_tabs must be 1 or more")
        self.argv = argv
        self.gate = gate
        self.max_tabs = max_tabs
        self.tabs: dict[TabService, web.WebSocketResponse] = {}
        self._open = 0  # tabs counted from the WebSocket's arrival (before their process exists) to their end

    async def _make_app(self) -> web.Application:
        """textual-serve's app (its page, WebSocket, static files and downloads) under /t/<token>/, behind the gate."""
        tab_app = await super()._make_app()
        app = web.Application(middlewares=[self.gate.middleware])
        app.add_subapp(self.gate.prefix, tab_app)
        app.on_response_prepare.append(add_answer_headers)
        return app

    @property
    def full(self) -> bool:
        return self._open >= self.max_tabs

    def refused_full(self) -> web.HTTPServiceUnavailable:
        return web.HTTPServiceUnavailable(text=(
            f"503: this tunedash serve has {self._open} tabs open, as many as it takes (serve --max-tabs "
            f"{self.max_tabs}). Close one and reload, or restart serve with a larger --max-tabs.\n"))

    async def on_shutdown(self, app: web.Application) -> None:
        """Close every tab's WebSocket: each handler then asks its dashboard to quit (it gives back the driver lock)."""
        for websocket in list(self.tabs.values()):
            await websocket.close(code=WSCloseCode.GOING_AWAY, message=b"tunedash serve stopped")

    async def on_startup(self, app: web.Application) -> None:
        """Nothing: `tunedash serve` prints its own lines (textual-serve's banner would print the URL's host only)."""

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        """The page (app/web_page/index.html), its URLs on the host and port the browser asked for (a port
        forward's); 503 when the tabs are all taken."""
        if self.full:
            raise self.refused_full()
        return await self._render_page(request)

    @aiohttp_jinja2.template("index.html")
    async def _render_page(self, request: web.Request) -> dict[str, Any]:
        base = f"{request.host}{self.gate.prefix}"
        return {
            "font_size": min(max(to_int(request.query.get("fontsize", "16"), 16), 6), 72),
            "app_websocket_url": f"{'wss' if request.scheme == 'https' else 'ws'}://{base}/ws",
            "config": {"static": {"url": f"{request.scheme}://{base}/static/"}},
            "application": {"name": self.title},
        }

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """One tab: its own dashboard process for as long as the WebSocket stays open (textual-serve's handler,
        keeping the process in `tabs`, its size clamped); 503 beyond `max_tabs`."""
        if self.full:
            raise self.refused_full()
        self._open += 1
        try:
            return await self._run_tab(request)
        finally:
            self._open -= 1

    async def _run_tab(self, request: web.Request) -> web.WebSocketResponse:
        websocket = web.WebSocketResponse(heartbeat=15)
        width, height = clamp_size(to_int(request.query.get("width", "80"), 80),
                                   to_int(request.query.get("height", "24"), 24))
        service: TabService | None = None

        async def close() -> None:
            await websocket.close()

        try:
            await websocket.prepare(request)
            service = TabService(self.argv, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                                 close=close, download_manager=self.download_manager)
            self.tabs[service] = websocket
            await service.start(width, height)
            await self._process_messages(websocket, service)
        except asyncio.CancelledError:
            await websocket.close()
        except Exception as exc:  # a broken tab ends that tab, never the server
            log.warning("a browser tab ended with an error: %s", exc)
        finally:
            if service is not None:
                await service.stop()  # asks the tab's dashboard to quit and waits until its output ends
                self.tabs.pop(service, None)
        return websocket

    async def _process_messages(self, websocket: web.WebSocketResponse, app_service: AppService) -> None:
        """The page's messages to its tab (keys, resizes, pings, focus), each checked by `read_envelope` first;
        one that is not a message of the page is dropped (textual-serve's own loop would end the tab on it)."""
        async for message in websocket:
            if message.type != WSMsgType.TEXT or (envelope := read_envelope(message.data)) is None:
                continue
            kind, data = envelope
            if kind == "stdin" and isinstance(data, str):
                await app_service.send_bytes(data.encode("utf-8", "replace"))
            elif kind == "resize" and isinstance(data, tuple):
                await app_service.set_terminal_size(*data)
            elif kind == "ping":
                await websocket.send_json(["pong", data])
            elif kind == "blur":
                await app_service.blur()
            elif kind == "focus":
                await app_service.focus()

    def stop_tabs(self) -> None:
        """SIGTERM what is left of the tabs' dashboards (one that did not quit within SHUTDOWN_S)."""
        for service in list(self.tabs):
            process = service._process  # textual-serve keeps no public handle on the process
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)


def read_envelope(text: str) -> tuple[str, str | tuple[int, int] | None] | None:
    """One message of textual-serve's page, checked: ("stdin", keys), ("resize", (width, height)) in cells
    (clamped to MAX_WIDTH x MAX_HEIGHT), ("ping", token up to 64 characters), ("blur" | "focus", None); None for
    anything else."""
    try:
        envelope = json.loads(text)
    except ValueError:
        return None
    if not isinstance(envelope, list) or not envelope or not isinstance(envelope[0], str):
        return None
    kind, data = envelope[0], envelope[1] if len(envelope) > 1 else None
    if kind == "stdin" and isinstance(data, str):
        return kind, data
    if kind == "resize" and isinstance(data, dict):
        width, height = data.get("width"), data.get("height")
        if (isinstance(width, int) and isinstance(height, int) and not isinstance(width, bool)
                and not isinstance(height, bool) and width >= 1 and height >= 1):
            return kind, clamp_size(width, height)
        return None
    if kind == "ping" and isinstance(data, str) and len(data) <= 64:
        return kind, data
    if kind in ("blur", "focus"):
        return kind, None
    return None


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: the kernel picks); OSError as the kernel says, errno
    EADDRINUSE when something listens there already."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only; never beside a listener
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def serve(server: DashboardServer, sock: socket.socket, stop: asyncio.Event,
                started: Callable[[], None] = lambda: None) -> None:
    """Serve on `sock` until `stop` is set; `started` runs once requests are answered. On the way out the open
    tabs get SHUTDOWN_S to quit their dashboards (the servers they watch keep running)."""
    app = await server._make_app()
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        started()
        await stop.wait()
    finally:
        await runner.cleanup()
        server.stop_tabs()

