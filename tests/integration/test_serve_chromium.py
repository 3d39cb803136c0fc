"""`tunedash serve` in real headless Chromium: the page, the token (it reaches no other port of the host), a
read-only tab, take-over, closing the tab, a tab whose dashboard dies, tabs dying with a serve killed hard, and a
page that asks nothing of the internet.

Debian's chromium and chromium-driver drive the page through selenium (no download at run time; .ci/run
installs both). The dashboard's screen is a canvas, so a script added before the page loads keeps each xterm.js
Terminal the page creates (`window.__terms`) and the test reads its buffer's lines, the text a user sees.
The simulated server runs on a demo-like profile named `demo` on a private sim state and a free port, and every
tunedash process has private XDG folders: nothing here touches the user's demo on port 30000.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, MakeProfile, free_port, wait_until
from tests.web_page import SCREEN_JS, TERMINAL_HOOK

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                       reason="Debian's chromium and chromium-driver are not installed (CI installs them via .ci/run)"),
]
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the [test] extra has it)")




def tunedash_env(tmp_path: Path) -> dict[str, str]:
    """The environment of every tunedash process here: private state, data, cache and config folders."""
    env = dict(os.environ, TEXTUAL_ANIMATIONS="none")
    for kind in ("STATE", "DATA", "CACHE", "CONFIG"):
        env[f"XDG_{kind}_HOME"] = str(tmp_path / "xdg" / kind.lower())
    return env


def run_tunedash(env: dict[str, str], *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


def descendants(pid: int) -> set[int]:
    """Every live process under `pid` (from /proc: the tabs' shells and dashboards under `serve`)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def dashboards_under(pid: int) -> set[int]:
    """The `tunedash ui ... --watch` processes under `pid`."""
    found = set()
    for child in descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ui" in argv and b"--watch" in argv and not argv[0].endswith(b"sh"):
            found.add(child)
    return found


def stop_group(process: subprocess.Popen[str]) -> None:
    """SIGTERM `serve`'s process group (itself and its tabs' dashboards), SIGKILL what is left after 15 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # a tab that outlived its server
    process.wait(timeout=5)


@dataclass
class Serving:
    process: subprocess.Popen[str]
    url: str
    port: int
    profile: Path
    env: dict[str, str]


@pytest.fixture
def serving(make_profile: MakeProfile, tmp_path: Path) -> Iterator[Serving]:
    """The demo-like server READY (launched by the CLI, which lets the driver lock go), then `tunedash serve`."""
    profile = make_profile(name="demo", startup_s=0.5)
    env = tunedash_env(tmp_path)
    launched = run_tunedash(env, "launch", str(profile), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "app", "serve", str(profile), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
                               start_new_session=True)  # its own group: the tabs' dashboards are in it too
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line)
            if "open http" in line:
                break
        url = next((line.split("open ", 1)[1].strip() for line in lines if "open http" in line), "")
        assert url.startswith(f"http://127.0.0.1:{port}/t/") and url.endswith("/"), "".join(lines)
        yield Serving(process, url, port, profile, env)
    finally:
        stop_group(process)
        run_tunedash(env, "kill", str(profile), "--take-over", timeout=60)  # make_profile's teardown SIGKILLs too


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Any]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900",
                     f"--user-data-dir={tmp_path / 'chromium'}", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # every request the page makes
    browser = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield browser
    finally:
        browser.quit()


def open_page(browser: Any, url: str) -> None:
    """Open `url` in the current tab with the terminal hook in place (a CDP script is per tab)."""
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": TERMINAL_HOOK})
    browser.get(url)


def screen_of(browser: Any) -> str:
    return browser.execute_script(SCREEN_JS) or ""


def wait_for_screen(browser: Any, check: Callable[[str], bool], timeout: float, what: str) -> str:
    return str(wait_until(lambda: (lambda text: text if check(text) else "")(screen_of(browser)), timeout, what,
                          lambda: f"; screen:\n{screen_of(browser)}"))


def press(browser: Any, key: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).send_keys(key).perform()


def status_of(serving: Serving) -> dict[str, Any]:
    result = run_tunedash(serving.env, "status", str(serving.profile), "--json")
    return dict(json.loads(result.stdout))


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def token_of(serving: Serving) -> str:
    return serving.url.rstrip("/").rsplit("/", 1)[1]


def test_token_is_required_for_page_static_and_websocket(serving: Serving) -> None:
    base = f"http://127.0.0.1:{serving.port}"
    token = token_of(serving)
    assert http_status(f"{base}/") == 403
    assert http_status(f"{base}/t/not-{token}/") == 403
    assert http_status(f"{base}/?token={token}") == 403  # the old form opens nothing
    assert http_status(f"{base}/static/js/textual.js") == 403
    websocket = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                 "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    assert http_status(f"{base}/ws", websocket) == 403
    assert http_status(f"{base}/t/{token[:-1]}/ws", websocket) == 403
    assert http_status(f"{base}/ws", {**websocket, "Cookie": f"tunedash_serve_{serving.port}={token}"}) == 403

    assert http_status(serving.url) == 200
    assert http_status(f"{base}/t/{token}/static/js/textual.js") == 200
    # a WebSocket from another site's page is refused even with the token (cross-site WebSocket hijacking)
    assert http_status(f"{base}/t/{token}/ws", {**websocket, "Origin": "http://evil.example"}) == 403
    serving.process.send_signal(signal.SIGTERM)  # serving stops; what it printed after the URL has no token
    rest = serving.process.stdout.read() if serving.process.stdout else ""
    assert serving.process.wait(timeout=15) == 0
    assert token not in rest, rest


class Recorder(BaseHTTPRequestHandler):
    """Another web server of this host: keeps the request line and headers of everything it is sent."""

    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(f"{self.requestline}\n{self.headers}")
        body = b"<html><body>another local web server</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[tuple[int, list[str]]]:
    """A second HTTP server on another port of 127.0.0.1; yields its port and what it received."""
    seen: list[str] = []
    handler = type("SeenRecorder", (Recorder,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1]), seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_token_never_reaches_another_port_of_the_host(serving: Serving, chromium: Any,
                                                          other_server: tuple[int, list[str]]) -> None:
    open_page(chromium, serving.url)
    wait_for_screen(chromium, lambda s: "READY" in s, 90, "the dashboard in the page")
    port, seen = other_server
    for url in (f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{port}/static/js/textual.js",
                f"http://localhost:{port}/ws"):
        chromium.get(url)
        assert "another local web server" in chromium.page_source
    token = token_of(serving)
    assert len(seen) >= 3, seen
    for request in seen:  # no cookie, no Referer: nothing of the dashboard's page reached it
        assert token not in request and urllib.parse.quote(token) not in request, request
        assert "cookie:" not in request.lower(), request


def requests_of(browser: Any) -> list[str]:
    """The URLs of every request the browser sent so far (Chromium's performance log; each read drains it)."""
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] in ("Network.requestWillBeSent", "Network.webSocketCreated"):
            urls.append(message["params"].get("request", {}).get("url") or message["params"].get("url", ""))
    return urls


def test_the_page_asks_nothing_of_the_internet(serving: Serving, chromium: Any) -> None:
    open_page(chromium, serving.url)
    wait_for_screen(chromium, lambda s: "READY" in s, 90, "the dashboard in the page")
    wait_until(lambda: chromium.execute_script("return document.fonts.check(\"16px 'Roboto Mono'\")"), 15,
               "the shipped font loaded")
    urls = requests_of(chromium)
    assert any(url.endswith("/ws") or "/ws?" in url for url in urls), urls
    network = [urllib.parse.urlsplit(url) for url in urls]  # chrome://, data: and blob: never leave the browser
    hosts = {url.hostname for url in network if url.scheme in ("http", "https", "ws", "wss")}
    assert hosts == {"127.0.0.1"}, urls
    headers = urllib.request.urlopen(serving.url, timeout=10).headers
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"


def test_a_tab_whose_dashboard_dies_says_session_ended(serving: Serving, chromium: Any) -> None:
    open_page(chromium, serving.url)
    wait_for_screen(chromium, lambda s: "READY" in s, 90, "the dashboard in the page")
    (tab,) = wait_until(lambda: dashboards_under(serving.process.pid), 10, "the tab's dashboard process")
    os.kill(tab, signal.SIGKILL)
    ended = "return document.body.classList.contains('-closed') && document.body.innerText"
    text = wait_until(lambda: chromium.execute_script(ended), 20, "the page to say the session ended")
    assert "Session ended" in text, text
    assert serving.process.poll() is None  # serving goes on: a reload opens a new dashboard
    chromium.refresh()
    wait_for_screen(chromium, lambda s: "READY" in s, 90, "a new dashboard after the reload")


def test_tabs_die_with_serve_killed_hard(serving: Serving, chromium: Any) -> None:
    open_page(chromium, serving.url)
    wait_for_screen(chromium, lambda s: "READY" in s, 90, "the dashboard in the page")
    tabs = wait_until(lambda: dashboards_under(serving.process.pid), 10, "the tab's dashboard process")
    os.kill(serving.process.pid, signal.SIGKILL)
    serving.process.wait(timeout=10)
    wait_until(lambda: not any(alive(pid) for pid in tabs), 10, "the tab's dashboard to die with serve",
               lambda: f"; still running: {[pid for pid in tabs if alive(pid)]}")


def rss_mib(pids: set[int]) -> float:
    """The summed resident memory of `pids` (VmRSS from /proc), MiB."""
    total_kib = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text()
            total_kib += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total_kib / 1024


def test_a_tab_asking_for_30000x30000_cells_stays_small(serving: Serving) -> None:
    import aiohttp

    async def hold_tab() -> tuple[set[int], float]:
        async with aiohttp.ClientSession() as client, \
                client.ws_connect(f"{serving.url}ws?width=30000&height=30000") as ws:
            tabs = set()
            deadline = time.monotonic() + 10  # what the issue measured: 3.1 GB after 10 s
            while time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ws.receive(), 0.5)  # read the frames, as a page does
                tabs = tabs or dashboards_under(serving.process.pid)
            return tabs, rss_mib(descendants(serving.process.pid))

    tabs, rss = asyncio.run(hold_tab())
    assert len(tabs) == 1, tabs
    (tab,) = tabs
    environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{tab}/environ").read_bytes().split(b"\0") if item)
    assert (environ[b"COLUMNS"], environ[b"ROWS"]) == (b"500", b"200")  # the size it got: the largest there is
    assert rss < 300, f"the tab's processes hold {rss:.0f} MiB"


def test_browser_tab_is_read_only_until_it_takes_over(serving: Serving, chromium: Any, tmp_path: Path) -> None:
    open_page(chromium, serving.url)
    # the header's driver note follows the first frame by one UI refresh: wait for it too
    screen = wait_for_screen(chromium, lambda s: "READY" in s and "READ-ONLY" in s and "T takes over" in s, 90,
                             "READY, read-only, T takes over")
    assert "nobody drives" in screen
    tabs = wait_until(lambda: dashboards_under(serving.process.pid), 10, "the tab's dashboard process")
    assert len(tabs) == 1, tabs

    chromium.find_element("css selector", "#terminal").click()
    press(chromium, "k")
    screen = wait_for_screen(chromium, lambda s: "kill is disabled" in s, 15, "the read-only refusal of k")
    assert "read-only session" in screen
    shot = tmp_path / "serve.png"
    assert chromium.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    record_before = status_of(serving)
    assert record_before["state"] == "READY", record_before

    assert "nobody drives" in screen.splitlines()[0]
    press(chromium, "T")  # nobody drives (the CLI's launch let the lock go): taken without a question
    wait_for_screen(chromium, lambda s: "READ-ONLY" not in s.splitlines()[0], 15, "the tab driving")
    press(chromium, "k")
    wait_for_screen(chromium, lambda s: "Kill the server?" in s, 15, "the kill confirmation, now that it drives")
    press(chromium, "n")
    wait_for_screen(chromium, lambda s: "Kill the server?" not in s, 15, "the confirmation closed")

    first = chromium.current_window_handle  # a second tab: its own dashboard, read-only, naming the driver
    chromium.switch_to.new_window("tab")
    open_page(chromium, serving.url)
    screen = wait_for_screen(chromium, lambda s: "READY" in s and "@" in s.splitlines()[0], 60,
                             "the second tab naming who drives")
    assert "READ-ONLY" in screen.splitlines()[0] and "@" in screen.splitlines()[0]
    tabs = wait_until(lambda: (lambda pids: pids if len(pids) == 2 else set())(dashboards_under(serving.process.pid)),
                      10, "two tab dashboards")
    chromium.find_element("css selector", "#terminal").click()
    press(chromium, "T")
    wait_for_screen(chromium, lambda s: "Take over demo?" in s, 15, "the take-over question")
    press(chromium, "y")
    wait_for_screen(chromium, lambda s: "READ-ONLY" not in s.splitlines()[0], 15, "the second tab driving")
    chromium.switch_to.window(first)
    wait_for_screen(chromium, lambda s: "READ-ONLY" in s.splitlines()[0] and " drives" in s.splitlines()[0], 15,
                    "the first tab read-only again, naming the new driver")

    for handle in chromium.window_handles:  # close both tabs: their WebSockets close, their dashboards quit
        chromium.switch_to.window(handle)
        chromium.get("about:blank")
    wait_until(lambda: not any(alive(pid) for pid in tabs), 20, "the tabs' dashboards to exit")
    after = status_of(serving)
    assert after["state"] == "READY" and after["pgid"] == record_before["pgid"], after
    os.killpg(after["pgid"], 0)  # the server's process group is still there
    killed = run_tunedash(serving.env, "kill", str(serving.profile), timeout=60)  # no --take-over: the tabs let go
    assert killed.returncode == 0, killed.stdout + killed.stderr


def test_readonly_serve_tab_cannot_take_over(make_profile: MakeProfile, tmp_path: Path, chromium: Any) -> None:
    profile = make_profile(name="demo", startup_s=0.3)
    env = tunedash_env(tmp_path)
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "app", "serve", str(profile), "--port", str(port),
                                "--readonly"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=REPO, env=env, start_new_session=True)
    try:
        assert process.stdout is not None
        url = next(line.split("open ", 1)[1].strip() for line in process.stdout if "open http" in line)
        second = run_tunedash(env, "serve", str(profile), "--port", str(port), timeout=30)
        assert second.returncode == 4 and f"port {port}" in second.stderr and "--port" in second.stderr, second
        assert "http://" not in second.stdout, second.stdout
        open_page(chromium, url)
        screen = wait_for_screen(chromium, lambda s: "READ-ONLY" in s, 60, "the read-only header")
        assert "takes over" not in screen
        chromium.find_element("css selector", "#terminal").click()
        press(chromium, "T")
        wait_for_screen(chromium, lambda s: "take-over is disabled" in s, 15, "the take-over refusal")
        tabs = dashboards_under(process.pid)
        assert len(tabs) == 1, tabs
        process.send_signal(signal.SIGTERM)  # serving stops with the tab open: the tab's dashboard quits too
        assert process.wait(timeout=15) == 0
        wait_until(lambda: not any(alive(pid) for pid in tabs), 10, "the tab's dashboard to exit")
    finally:
        stop_group(process)
