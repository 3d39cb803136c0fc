"""The access token of `tunedash serve` (app.web.AccessGate) and its tabs (app.web.DashboardServer) on a real
aiohttp app in this process; the page's messages to a tab (read_envelope); the port and URL of `serve`.

The tabs run a stand-in dashboard (FAKE_TAB: it speaks textual's web-driver framing, tells the size it was started
at and echoes every meta packet back), so these tests start no Textual app; the browser end to end, with real
dashboards, is tests/integration/test_serve_chromium.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping

import aiohttp
import pytest

from app.cli.common import CliError
from app.cli.main import build_parser
from app.cli.serve import bind, page_url, tab_argv
from app.core.errors import Reason
from app.web import (
    DEFAULT_MAX_TABS,
    MAX_HEIGHT,
    MAX_WIDTH,
    REFUSED,
    AccessGate,
    DashboardServer,
    listen,
    read_envelope,
)
from tests.helpers import serving

TOKEN = "s3cr3t-Token_value-0123456789abcdef"
PREFIX = f"/t/{TOKEN}"
# A stand-in for `tunedash ui --watch` under textual's web driver: the prelude line, then one data packet with
# the size it was started at (COLUMNS x ROWS), then each meta packet it is sent comes back as a data packet;
# "quit" ends it.
FAKE_TAB = r"""
import os, sys
out, inp = sys.stdout.buffer, sys.stdin.buffer
def send(payload):
    out.write(b"D" + len(payload).to_bytes(4, "big") + payload); out.flush()
out.write(b"__GANGLION__\n"); out.flush()
send(("size %sx%s" % (os.environ["COLUMNS"], os.environ["ROWS"])).encode())
while (kind := inp.read(1)):
    payload = inp.read(int.from_bytes(inp.read(4), "big"))
    if kind == b"M":
        send(payload)
        if b'"quit"' in payload:
            break
"""


@contextlib.asynccontextmanager
async def dashboard_server(max_tabs: int = DEFAULT_MAX_TABS) -> AsyncIterator[tuple[DashboardServer, str]]:
    """A DashboardServer of FAKE_TAB tabs on a free loopback port; yields it and its base URL (no token)."""
    server = DashboardServer([sys.executable, "-c", FAKE_TAB], AccessGate(TOKEN), title="tunedash · test",
                             max_tabs=max_tabs)
    async with serving(await server._make_app()) as port:
        try:
            yield server, f"http://127.0.0.1:{port}"
        finally:
            for _ in range(200):  # the clients have closed their tabs: their stand-in dashboards quit
                if not server.tabs:
                    break
                await asyncio.sleep(0.05)
            server.stop_tabs()


async def first_data(ws: aiohttp.ClientWebSocketResponse) -> str:
    message = await asyncio.wait_for(ws.receive(), 30)
    assert message.type == aiohttp.WSMsgType.BINARY, message
    return bytes(message.data).decode()


def assert_answer_headers(headers: Mapping[str, str]) -> None:
    csp = headers.get("Content-Security-Policy", "")
    assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp, csp
    assert headers.get("X-Frame-Options") == "DENY"
    assert "Set-Cookie" not in headers


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "OPTIONS"])
@pytest.mark.parametrize("path", ["/", "/static/js/textual.js", "/ws", "/download/abc", "/nothing-here", "/t/",
                                  "/t/wrong/", f"/t/{TOKEN[:-1]}/", f"/t/{TOKEN}x/", f"/t/{TOKEN.upper()}/",
                                  f"/x{PREFIX}/", f"/?token={TOKEN}", f"/t//{TOKEN}/", f"/static{PREFIX}/"])
async def test_without_the_token_in_the_path_every_path_and_method_is_403(method: str, path: str) -> None:
    async with dashboard_server() as (_server, base), aiohttp.ClientSession() as client, \
            client.request(method, f"{base}{path}", headers={"Cookie": f"token={TOKEN}"},
                           allow_redirects=False) as answer:
        assert answer.status == 403
        assert await answer.text() == REFUSED
        assert_answer_headers(answer.headers)


async def test_the_page_and_its_files_live_under_the_token_and_set_no_cookie() -> None:
    async with dashboard_server() as (_server, base), aiohttp.ClientSession() as client:
        async with client.get(f"{base}{PREFIX}", allow_redirects=False) as bare:
            assert bare.status == 308 and bare.headers["Location"] == f"{PREFIX}/"
        async with client.get(f"{base}{PREFIX}/?fontsize=14") as page:
            assert page.status == 200
            html = await page.text()
            assert_answer_headers(page.headers)
            assert page.headers["Cache-Control"] == "no-store"
            assert page.headers["Referrer-Policy"] == "no-referrer"
        host = base.split("//", 1)[1]
        assert f'data-session-websocket-url="ws://{host}{PREFIX}/ws"' in html
        # every URL the page names is this server's, under the token (no web font from the internet)
        named = re.findall(r"""(?:src|href)=["']([^"']*)["']|url\(["']?([^"')]*)""", html)
        urls = {a or b for a, b in named} - {""}
        assert urls and all(url.startswith(f"{base}{PREFIX}/static/") for url in urls), urls
        assert not re.search(r"https?://(?!127\.0\.0\.1)", html.replace("http://www.w3.org/2000/svg", "")), html
        for name in ("js/textual.js", "css/xterm.css", "fonts/RobotoMono-VariableFont_wght.ttf"):
            async with client.get(f"{base}{PREFIX}/static/{name}") as static:
                assert static.status == 200, name
                assert_answer_headers(static.headers)
        assert not client.cookie_jar.filter_cookies(base)  # type: ignore[arg-type]


async def test_the_websocket_needs_the_token_and_the_page_origin() -> None:
    async with dashboard_server() as (_server, base), aiohttp.ClientSession() as client:
        url = f"{base}{PREFIX}/ws"
        async with client.ws_connect(url, headers={"Origin": base}) as ws:
            assert (await first_data(ws)).startswith("size ")
        async with client.ws_connect(url) as ws:  # no Origin: not a browser; the token suffices
            assert (await first_data(ws)).startswith("size ")
        port = int(base.rsplit(":", 1)[1])
        for origin in ("http://evil.example", f"http://127.0.0.1:{port + 1}", "null"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(url, headers={"Origin": origin})
            assert refused.value.status == 403
        for wrong in ("/ws", f"/t/{TOKEN[:-1]}/ws"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(f"{base}{wrong}")
            assert refused.value.status == 403


async def test_a_tab_gets_at_most_the_largest_size_at_start_and_on_resize() -> None:
    async with dashboard_server() as (_server, base), aiohttp.ClientSession() as client:
        async with client.ws_connect(f"{base}{PREFIX}/ws?width=30000&height=30000") as ws:
            assert await first_data(ws) == f"size {MAX_WIDTH}x{MAX_HEIGHT}"
            await ws.send_str(json.dumps(["resize", {"width": 100000, "height": 7}]))
            assert json.loads(await first_data(ws)) == {"type": "resize", "width": MAX_WIDTH, "height": 7}
        async with client.ws_connect(f"{base}{PREFIX}/ws?width=-5&height=abc") as ws:
            assert await first_data(ws) == "size 1x24"
        async with client.ws_connect(f"{base}{PREFIX}/ws?width=120&height=40") as ws:
            assert await first_data(ws) == "size 120x40"


async def test_a_tab_beyond_max_tabs_is_answered_503_until_one_closes() -> None:
    async with dashboard_server() as (server, base), aiohttp.ClientSession() as client:
        url = f"{base}{PREFIX}/ws"
        tabs = [await client.ws_connect(url) for _ in range(DEFAULT_MAX_TABS)]
        for ws in tabs:
            assert (await first_data(ws)).startswith("size ")
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect(url)
        assert refused.value.status == 503
        async with client.get(f"{base}{PREFIX}/") as page:  # the page says so in words
            assert page.status == 503
            text = await page.text()
            assert f"{DEFAULT_MAX_TABS} tabs open" in text and f"--max-tabs {DEFAULT_MAX_TABS}" in text, text
            assert_answer_headers(page.headers)
        assert len(server.tabs) == DEFAULT_MAX_TABS
        await tabs.pop().close()
        for _ in range(100):  # its dashboard quits, its place is free
            if len(server.tabs) < DEFAULT_MAX_TABS:
                break
            await asyncio.sleep(0.05)
        async with client.ws_connect(url) as ws:
            assert (await first_data(ws)).startswith("size ")
        for ws in tabs:
            await ws.close()


async def test_a_tab_whose_dashboard_dies_is_closed() -> None:
    async with dashboard_server() as (server, base), aiohttp.ClientSession() as client, \
            client.ws_connect(f"{base}{PREFIX}/ws") as ws:
        assert (await first_data(ws)).startswith("size ")
        (service,) = server.tabs
        assert service.pid is not None
        os.kill(service.pid, signal.SIGKILL)
        message = await asyncio.wait_for(ws.receive(), 30)  # the page's socket closes: it shows "Session ended"
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), message


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        AccessGate("")


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
    assert page_url("127.0.0.1", 8765, "abc") == "http://127.0.0.1:8765/t/abc/"
    assert page_url("::1", 8765, "abc") == "http://[::1]:8765/t/abc/"
    assert page_url("0.0.0.0", 80, "abc") == f"http://{socket.gethostname()}:80/t/abc/"
    argv = tab_argv("/p/demo.toml", readonly=False)
    assert argv[1:] == ["-m", "app", "ui", "/p/demo.toml", "--watch", "--tuning-flags-only"]
    assert tab_argv("/p/demo.toml", readonly=True)[-3:] == ["--watch", "--tuning-flags-only", "--readonly"]
    assert "--tuning-flags-only" not in tab_argv("/p/demo.toml", readonly=False, all_flags=True)
    build_parser().parse_args(argv[3:])  # the tab's own command line is one `ui` takes


def test_serve_takes_max_tabs_and_allow_all_flags() -> None:
    args = build_parser().parse_args(["serve", "demo"])
    assert args.max_tabs == DEFAULT_MAX_TABS == 8 and not args.allow_all_flags
    args = build_parser().parse_args(["serve", "demo", "--max-tabs", "2", "--allow-all-flags"])
    assert args.max_tabs == 2 and args.allow_all_flags


@pytest.mark.parametrize(("text", "read"), [
    ('["stdin", "s"]', ("stdin", "s")),
    ('["resize", {"width": 120, "height": 40}]', ("resize", (120, 40))),
    ('["ping", "1733040000000"]', ("ping", "1733040000000")),
    ('["focus"]', ("focus", None)),
    ('["blur", null]', ("blur", None)),
    ('["resize", {"width": 120, "height": 100000}]', ("resize", (120, MAX_HEIGHT))),
    ('["resize", {"width": 30000, "height": 30000}]', ("resize", (MAX_WIDTH, MAX_HEIGHT))),
])
def test_the_page_messages_a_tab_takes(text: str, read: object) -> None:
    assert read_envelope(text) == read


@pytest.mark.parametrize("text", [
    "", "not json", "{}", "[]", "[1, 2]", '["stdin"]', '["stdin", 5]', '["resize", {"width": "120", "height": 40}]',
    '["resize", {"width": 0, "height": 40}]', '["resize", {"width": 120, "height": -1}]',
    '["resize", {"width": true, "height": 40}]', '["resize", [120, 40]]', '["ping", "' + "x" * 65 + '"]',
    '["quit"]', '["open_url", "http://evil.example"]',
])
def test_anything_else_from_the_page_is_dropped(text: str) -> None:
    assert read_envelope(text) is None
