"""The access token of `tunedash serve` (app.web.AccessGate) on a real aiohttp app in this process; the page's
messages to a tab (read_envelope); the port and URL of `serve`.

The gate sits in front of stand-in handlers for the routes textual-serve has (the page, the WebSocket, static
files); the browser end to end is tests/integration/test_serve_chromium.py.
"""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp import web

from app.cli.common import CliError
from app.cli.serve import bind, page_url, tab_argv
from app.core.errors import Reason
from app.web import REFUSED, AccessGate, listen, read_envelope
from tests.helpers import serving

TOKEN = "s3cr3t-Token_value-0123456789abcdef"
PORT = 18999  # the cookie's name only; the app itself listens on a free port


def gated_app() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="the page")

    async def websocket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str("hello")
        await ws.close()
        return ws

    async def static(request: web.Request) -> web.Response:
        return web.Response(text="static")

    app = web.Application(middlewares=[AccessGate(TOKEN, PORT).middleware])
    app.add_routes([web.get("/", page), web.get("/ws", websocket), web.get("/static/{name}", static)])
    return app


COOKIE = {"Cookie": f"tunedash_serve_{PORT}={TOKEN}"}


@pytest.mark.parametrize("path", ["/", "/static/textual.js", "/ws", "/download/abc", "/nothing-here"])
@pytest.mark.parametrize("headers", [{}, {"Cookie": f"tunedash_serve_{PORT}=wrong"},
                                     {"Cookie": f"tunedash_serve_{PORT + 1}={TOKEN}"}])
async def test_without_the_token_every_path_is_403(path: str, headers: dict[str, str]) -> None:
    async with serving(gated_app()) as port, aiohttp.ClientSession() as client, \
            client.get(f"http://127.0.0.1:{port}{path}", headers=headers, allow_redirects=False) as answer:
        assert answer.status == 403
        assert await answer.text() == REFUSED
        assert TOKEN not in await answer.text()


@pytest.mark.parametrize("token", ["", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "tökén", "%00"])
async def test_a_wrong_token_in_the_url_is_403(token: str) -> None:
    async with serving(gated_app()) as port, aiohttp.ClientSession() as client, \
            client.get(f"http://127.0.0.1:{port}/", params={"token": token}, allow_redirects=False) as answer:
        assert answer.status == 403


async def test_the_token_in_the_url_becomes_a_cookie_and_leaves_the_url() -> None:
    jar = aiohttp.CookieJar(unsafe=True)  # keep cookies of an IP address, as a browser does
    async with serving(gated_app()) as port, aiohttp.ClientSession(cookie_jar=jar) as client:
        async with client.get(f"http://127.0.0.1:{port}/", params={"token": TOKEN, "fontsize": "14"},
                              allow_redirects=False) as answer:
            assert answer.status == 303
            assert answer.headers["Location"] == "/?fontsize=14"
            cookie = answer.headers["Set-Cookie"]
            assert cookie.startswith(f"tunedash_serve_{PORT}={TOKEN};")
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
            assert answer.headers["Cache-Control"] == "no-store"
        async with client.get(f"http://127.0.0.1:{port}/?fontsize=14") as page:  # the client kept the cookie
            assert page.status == 200 and await page.text() == "the page"
            assert page.headers["Referrer-Policy"] == "no-referrer"
        async with client.get(f"http://127.0.0.1:{port}/static/x.js") as static:
            assert static.status == 200


async def test_the_websocket_needs_the_token_and_the_page_origin() -> None:
    async with serving(gated_app()) as port, aiohttp.ClientSession() as client:
        url = f"http://127.0.0.1:{port}/ws"
        async with client.ws_connect(url, headers={**COOKIE, "Origin": f"http://127.0.0.1:{port}"}) as ws:
            assert (await ws.receive_str()) == "hello"
        async with client.ws_connect(url, headers=COOKIE) as ws:  # no Origin: not a browser; the token suffices
            assert (await ws.receive_str()) == "hello"
        for origin in ("http://evil.example", f"http://127.0.0.1:{port + 1}", "null"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(url, headers={**COOKIE, "Origin": origin})
            assert refused.value.status == 403
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect(url)
        assert refused.value.status == 403


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        AccessGate("", PORT)


def test_a_taken_port_is_a_clear_error_before_anything_listens() -> None:
    first = listen("127.0.0.1", 0)
    port = first.getsockname()[1]
    try:
        with pytest.raises(CliError) as taken:
            bind("127.0.0.1", port)
        assert taken.value.reason == Reason.PORT_IN_USE
        assert f"port {port} on 127.0.0.1 is taken" in str(taken.value) and "--port" in str(taken.value)
    finally:
        first.close()
    again = bind("127.0.0.1", port)  # free again once the first is gone
    again.close()


def test_a_host_that_is_not_ours_names_the_flag() -> None:
    with pytest.raises(CliError, match=r"--host 192\.0\.2\.1"):
        bind("192.0.2.1", 0)


def test_the_printed_url_and_the_tab_command() -> None:
    assert page_url("127.0.0.1", 8765, "abc") == "http://127.0.0.1:8765/?token=abc"
    assert page_url("::1", 8765, "abc") == "http://[::1]:8765/?token=abc"
    assert page_url("0.0.0.0", 80, "abc") == f"http://{socket.gethostname()}:80/?token=abc"
    argv = tab_argv("/p/demo.toml", readonly=False)
    assert argv[1:] == ["-m", "app", "ui", "/p/demo.toml", "--watch"]
    assert tab_argv("/p/demo.toml", readonly=True)[-2:] == ["--watch", "--readonly"]


@pytest.mark.parametrize(("text", "read"), [
    ('["stdin", "s"]', ("stdin", "s")),
    ('["resize", {"width": 120, "height": 40}]', ("resize", (120, 40))),
    ('["ping", "1733040000000"]', ("ping", "1733040000000")),
    ('["focus"]', ("focus", None)),
    ('["blur", null]', ("blur", None)),
])
def test_the_page_messages_a_tab_takes(text: str, read: object) -> None:
    assert read_envelope(text) == read


@pytest.mark.parametrize("text", [
    "", "not json", "{}", "[]", "[1, 2]", '["stdin"]', '["stdin", 5]', '["resize", {"width": "120", "height": 40}]',
    '["resize", {"width": 0, "height": 40}]', '["resize", {"width": 120, "height": 100000}]',
    '["resize", {"width": true, "height": 40}]', '["resize", [120, 40]]', '["ping", "' + "x" * 65 + '"]',
    '["quit"]', '["open_url", "http://evil.example"]',
])
def test_anything_else_from_the_page_is_dropped(text: str) -> None:
    assert read_envelope(text) is None
