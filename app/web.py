"""The dashboard in a browser: textual-serve's Server behind an access token (`tunedash serve`).

textual-serve runs one process per browser tab (a WebSocket carries its terminal); this module adds what a
dashboard that can kill servers needs before it goes on a port: every request (the page, the WebSocket, the
static files, downloads) must carry the access token, first as `?token=` in the URL `tunedash serve` prints,
then as an HttpOnly, SameSite=Strict cookie the first answer sets (the page is redirected to a URL without the
token); a WebSocket must come from the page's own origin; the page's URLs follow the Host the browser used (an
SSH port forward on another port works). The token is compared with hmac.compare_digest and never logged:
aiohttp's access log is off. docs/architecture.md#the-web-view has the picture, README "tunedash serve" the
security model.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp_jinja2
from aiohttp import WSCloseCode, WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.server import Server, to_int

TOKEN_PARAM = "token"
REFUSED = ("403: this tunedash dashboard needs its access token. Open the whole URL `tunedash serve` printed "
           "(it ends in ?token=...); a new `tunedash serve` prints a new one.\n")
SHUTDOWN_S = 5.0  # how long serving waits for the tabs' dashboards to quit when it stops
log = logging.getLogger("tunedash.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AccessGate:
    """The access token of one `tunedash serve`: which requests carry it, and the aiohttp middleware."""

    def __init__(self, token: str, port: int) -> None:
        if not token:
            raise ValueError("the access token is empty")
        self._token = token.encode()
        self.cookie = f"tunedash_serve_{port}"  # a cookie is per host, not per port: one name per serving port

    def _matches(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode("utf-8", "surrogateescape"), self._token)

    def carried_by(self, request: web.Request) -> str | None:
        """"query" or "cookie" when the request carries the token there, else None."""
        if self._matches(request.query.get(TOKEN_PARAM)):
            return "query"
        if self._matches(request.cookies.get(self.cookie)):
            return "cookie"
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse (403) a request without the token, or a WebSocket from another origin; swap the URL's token for
        the cookie on the page."""
        carried = self.carried_by(request)
        if carried is None or (request.path == "/ws" and not same_origin(request)):
            return web.Response(status=403, text=REFUSED, headers=_NO_STORE)
        if carried == "query" and request.method == "GET" and request.path == "/":
            rest = request.rel_url.query.copy()
            rest.popall(TOKEN_PARAM)
            redirect = web.Response(status=303, headers={**_NO_STORE,
                                                         "Location": request.rel_url.with_query(rest).human_repr()})
            redirect.set_cookie(self.cookie, self._token.decode(), httponly=True, samesite="Strict", path="/")
            return redirect
        response = await handler(request)
        if not response.prepared:  # a WebSocket or a download has sent its headers already
            response.headers.update(_NO_STORE)
        return response


_NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff"}


def same_origin(request: web.Request) -> bool:
    """Whether a request's Origin (sent by every browser on a WebSocket) is the page's own host; a client that
    sends none (not a browser) passes on its token alone."""
    origin = request.headers.get("Origin")
    return origin is None or origin in (f"http://{request.host}", f"https://{request.host}")


class DashboardServer(Server):
    """textual-serve's Server for one dashboard command, behind an AccessGate; it keeps the tabs it started (each
    one's dashboard process and WebSocket) so that stopping it stops them."""

    def __init__(self, command: str, gate: AccessGate, *, title: str) -> None:
        super().__init__(command, title=title)
        self.gate = gate
        self.tabs: dict[AppService, web.WebSocketResponse] = {}

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self.gate.middleware)
        return app

    async def on_shutdown(self, app: web.Application) -> None:
        """Close every tab's WebSocket: each handler then asks its dashboard to quit (it gives back the driver lock)."""
        for websocket in list(self.tabs.values()):
            await websocket.close(code=WSCloseCode.GOING_AWAY, message=b"tunedash serve stopped")

    async def on_startup(self, app: web.Application) -> None:
        """Nothing: `tunedash serve` prints its own lines (textual-serve's banner would print the URL's host only)."""

    @aiohttp_jinja2.template("app_index.html")
    async def handle_index(self, request: web.Request) -> dict[str, Any]:
        """textual-serve's page, its URLs on the host and port the browser asked for (a port forward's)."""
        base = f"{request.scheme}://{request.host}"
        return {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": f"{'wss' if request.scheme == 'https' else 'ws'}://{request.host}/ws",
            "config": {"static": {"url": f"{base}/static/"}},
            "application": {"name": self.title},
        }

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """One tab: its own dashboard process for as long as the WebSocket stays open (textual-serve's handler,
        keeping the process in `tabs`)."""
        websocket = web.WebSocketResponse(heartbeat=15)
        width = to_int(request.query.get("width", "80"), 80)
        height = to_int(request.query.get("height", "24"), 24)
        service: AppService | None = None

        async def close() -> None:
            await websocket.close()

        try:
            await websocket.prepare(request)
            service = AppService(self.command, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
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


MAX_CELLS = 1000  # a terminal wider or taller than this is not a browser window


def read_envelope(text: str) -> tuple[str, str | tuple[int, int] | None] | None:
    """One message of textual-serve's page, checked: ("stdin", keys), ("resize", (width, height)) in cells,
    ("ping", token up to 64 characters), ("blur" | "focus", None); None for anything else."""
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
                and not isinstance(height, bool) and 1 <= width <= MAX_CELLS and 1 <= height <= MAX_CELLS):
            return kind, (width, height)
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

