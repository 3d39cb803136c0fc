"""Web view benchmark: a key pressed in the browser -> the changed frame, through `tunedash serve`.

Run: .venv/bin/python bench/bench_web.py [--presses 40] [--no-tmux]

The real `tunedash serve` (its own process, as a user starts it) on a demo-like profile with 8 simulated GPUs
sampled at 4 Hz, the server READY; Debian's headless chromium opens the URL through selenium, turns the probe
on (`p`: the chart streams, as in the tmux figure) and presses `s` (the Flags panel's pending steps) again and
again, 0.3-0.7 s apart at random, `u` before the steps would wrap. Both ends are stamped inside the page, so
selenium's own round trips are not counted: t0 = the trusted keydown reaching the document (performance.now()),
t1 = the first xterm.js render whose buffer shows the new pending value ("→ N" on the [s] row; also printed: the
moment xterm.js parsed it into its buffer, before drawing). Between them:
xterm.js -> WebSocket -> serve -> the tab's dashboard process (stdin) -> Textual -> its output -> serve ->
WebSocket -> xterm.js parse and draw. Target: p95 <= 150 ms on loopback.

The alternative, measured in the same run (unless --no-tmux): the same key on the same dashboard in a real
tmux (bench_dashboard.measure_tmux: send-keys -> the app's write reaching tmux through pipe-pane), and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# bench/ is sys.path[0] when this runs as a script; bench_dashboard puts the repository on sys.path for `app`
from bench_dashboard import flag_value, free_port, kill_launched, make_profile, measure_tmux, p95

from tests.web_page import TERMINAL_HOOK  # bench_dashboard put the repository on sys.path

REPO = Path(__file__).resolve().parents[1]

# The page's terminal (tests/web_page.py), and the row that holds a text.
HOOK = TERMINAL_HOOK + """
window.__row = (needle) => {
  const term = window.__terms[0];
  if (!term) { return null; }
  const buffer = term.buffer.active;
  for (let y = 0; y < term.rows; y++) {
    const line = buffer.getLine(buffer.viewportY + y);
    const text = line ? line.translateToString(true) : '';
    if (text.includes(needle)) { return text; }
  }
  return null;
};
"""
# Arm one measurement: the next trusted `s` keydown is t0; the first render showing `expect` after it is t1.
ARM = """
const expect = arguments[0];
window.__t0 = null; window.__t1 = null; window.__tp = null;
if (!window.__listening) {
  window.__listening = true;
  document.addEventListener('keydown', (e) => {
    if (e.key === 's' && e.isTrusted && window.__t0 === null) { window.__t0 = performance.now(); }
  }, true);
  const shows = () => { const row = window.__row('[s]'); return row && row.includes(window.__expect); };
  if (window.__terms[0].onWriteParsed) {
    window.__terms[0].onWriteParsed(() => {
      if (window.__t0 !== null && window.__tp === null && shows()) { window.__tp = performance.now(); }
    });
  }
  window.__terms[0].onRender(() => {
    if (window.__t0 !== null && window.__t1 === null) {
      if (shows()) { window.__t1 = performance.now(); }
    }
  });
}
window.__expect = expect;
"""


def env_for(folder: Path) -> dict[str, str]:
    env = dict(os.environ, TEXTUAL_ANIMATIONS="none")
    for kind in ("STATE", "DATA", "CACHE", "CONFIG"):
        env[f"XDG_{kind}_HOME"] = str(folder / "xdg" / kind.lower())
    return env


def browser(folder: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(shutil.which("chromium"))
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900",
                     f"--user-data-dir={folder / 'chromium'}", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=str(shutil.which("chromedriver"))), options=options)


def wait(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")


def measure_web(url: str, presses: int, folder: Path) -> tuple[list[float], list[float]]:
    """`s` in the browser -> the frame with the new pending value, in ms, per press (module docstring); and
    `s` -> the new value parsed into xterm.js's buffer (before it is drawn), where the browser reports it."""
    from selenium.webdriver.common.action_chains import ActionChains

    page = browser(folder)
    try:
        page.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOOK})
        page.get(url)
        wait(lambda: "READY" in page.execute_script("return window.__screen()"), 90, "READY in the page")
        page.find_element("css selector", "#terminal").click()
        keys = ActionChains(page)

        def press(key: str) -> None:
            keys.send_keys(key).perform()
            keys.reset_actions()

        def row() -> str:
            return flag_value(page.execute_script("return window.__screen()"), "s")

        press("p")  # the probe on: the chart streams, as in the tmux run
        wait(lambda: "probe" in page.execute_script("return window.__screen()").splitlines()[0], 10, "probe on")
        time.sleep(3.0)  # the probe's first points, the chart's first replot
        rng = random.Random(7)
        latencies: list[float] = []
        parsed: list[float] = []
        for _ in range(presses):
            before = row()
            if "→ 4" in before or "→ 5" in before:
                press("u")
                wait(lambda: "→" not in row(), 10, "the undo")
                before = row()
            expect = f"→ {int(before.split()[-1]) + 1}"
            page.execute_script(ARM, expect)
            press("s")
            wait(lambda: page.execute_script("return window.__t1 !== null"), 10, f"`s` to show {expect}")
            t0, t1, tp = page.execute_script("return [window.__t0, window.__t1, window.__tp]")
            latencies.append(float(t1) - float(t0))
            if tp is not None:
                parsed.append(float(tp) - float(t0))
            time.sleep(rng.uniform(0.3, 0.7))
        press("u")
        return latencies, parsed
    finally:
        page.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--presses", type=int, default=40, help="key presses per variant (at least 30)")
    parser.add_argument("--no-tmux", action="store_true", help="only the browser, not the tmux alternative")
    args = parser.parse_args()
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        sys.exit("bench_web: needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    with tempfile.TemporaryDirectory(prefix="tunedash-bench-web-") as tmp:
        folder = Path(tmp)
        profile = make_profile(folder)
        env = env_for(folder)
        serve: subprocess.Popen[str] | None = None
        try:
            subprocess.run([sys.executable, "-m", "app", "launch", str(profile.source), "--wait", "--timeout", "60"],
                           check=True, capture_output=True, cwd=REPO, env=env, timeout=90)
            serve = subprocess.Popen([sys.executable, "-m", "app", "serve", str(profile.source), "--port",
                                      str(free_port())], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=REPO, env=env, start_new_session=True)
            assert serve.stdout is not None
            url = next(line.split("open ", 1)[1].strip() for line in serve.stdout if "open http" in line)
            web, parsed = measure_web(url, args.presses, folder)
            med = statistics.median
            print(f"web view: `s` in headless chromium -> the frame showing it, {len(web)} presses: "
                  f"median {med(web):.1f} ms, p95 {p95(web):.1f} ms, max {max(web):.1f} ms; "
                  f"target p95 <= 150 ms: {'met' if p95(web) <= 150 else 'MISSED'}")
            if parsed:
                print(f"    of which in the buffer (parsed, not yet drawn): median {med(parsed):.1f} ms, "
                      f"p95 {p95(parsed):.1f} ms (drawing, the medians' difference: {med(web) - med(parsed):.1f} ms)")
            if args.no_tmux or shutil.which("tmux") is None:
                print("tmux alternative: skipped" + ("" if args.no_tmux else " (tmux is not installed)"))
                return
            keys, _ = measure_tmux(profile, args.presses, 1.0, folder)
            tmux = keys.output_ms
            print(f"tmux, same dashboard and key (send-keys -> the write reaching tmux), {len(tmux)} presses: "
                  f"median {med(tmux):.1f} ms, p95 {p95(tmux):.1f} ms")
            print(f"ratio web/tmux: median {med(web) / med(tmux):.2f}x, p95 {p95(web) / p95(tmux):.2f}x "
                  f"(the web figure includes xterm.js drawing the frame; tmux's stops at the write)")
        finally:
            if serve is not None:  # serving and its tabs' dashboards: one process group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(serve.pid, signal.SIGTERM)
                try:
                    serve.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(serve.pid, signal.SIGKILL)
            kill_launched(folder / "sim")


if __name__ == "__main__":
    main()
