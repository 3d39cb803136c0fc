"""The real `tunedash demo` in a real tmux: keys in with `tmux send-keys`, screen out with `capture-pane`.

`tunedash demo PROFILE` runs the demo (autolaunch, probe on) with a demo-like profile on a private sim
state folder and a free port, so the test never touches the user's demo server on port 30000 or the
default state folder. The tmux server has its own socket (-L), and teardown kills it and every process
group the sim host's job records name. Textual draws on stderr; stdout goes to a file that must stay
empty (a print would land in the middle of the screen).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, MakeProfile

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (CI installs it via .ci/run)"),
]


class Tmux:
    """One detached tmux session on a private socket, 120x40."""

    def __init__(self, command: str, cwd: Path) -> None:
        self.socket = f"tunedash-test-{uuid.uuid4().hex[:8]}"
        self.name = "demo"
        self._tmux("new-session", "-d", "-x", "120", "-y", "40", "-s", self.name, "-c", str(cwd), command)

    def _tmux(self, *args: str) -> str:
        result = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10)
        return result.stdout

    def send(self, *keys: str) -> None:
        for key in keys:
            self._tmux("send-keys", "-t", self.name, key)
            time.sleep(0.15)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.name)

    def wait_for(self, check: Callable[[str], bool], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if check(text):
                return text
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; screen:\n{text}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


def flag_row(screen: str, key: str) -> str:
    """The Flags panel's line for one toggle key, from its "value" column on ("1", "1 → 3")."""
    line = next((line for line in screen.splitlines() if f"[{key}]" in line), "")
    return line.split(f"[{key}]", 1)[1].split("│", 1)[0].strip() if line else ""


@pytest.fixture
def demo_in_tmux(make_profile: MakeProfile, tmp_path: Path) -> Iterator[tuple[Tmux, Path]]:
    profile = make_profile(name="tmuxdemo", startup_s=0.5)
    stdout = tmp_path / "stdout.txt"
    # Textual draws on stderr (its driver's terminal); stdout goes to a file that must stay empty.
    command = f"{shlex.join([sys.executable, '-m', 'app', 'demo', str(profile)])} >{shlex.quote(str(stdout))}"
    env_prefix = "TEXTUAL_ANIMATIONS=none "
    tmux = Tmux(env_prefix + command, REPO)
    try:
        yield tmux, stdout
    finally:
        tmux.kill()  # the dashboard goes with the tmux server; make_profile's teardown kills the server's group


def test_demo_in_tmux_relaunch_and_kill(demo_in_tmux: tuple[Tmux, Path]) -> None:
    tmux, stdout = demo_in_tmux
    tmux.wait_for(lambda s: "READY" in s and "tokens/s" in s, 60, "READY")
    assert flag_row(tmux.screen(), "s").endswith("1")

    tmux.send("s", "s")
    tmux.wait_for(lambda s: flag_row(s, "s").endswith("1 → 3"), 10, "pending steps 1 → 3")
    tmux.send("r")
    # The event log's last line is the run's saved line ("relaunch 1.4 s; weights from disk 0.2 s"), which comes
    # right after "relaunched with steps 1 -> 3" and pushes it out of the small Events panel; the chart's marker
    # names the change.
    tmux.wait_for(lambda s: "steps 1 -> 3" in s and re.search(r"relaunch \d+\.\d s; weights from disk", s), 60,
                  "the relaunch's marker and its line in the event log")
    screen = tmux.wait_for(lambda s: "READY" in s, 30, "READY after the relaunch")
    row = flag_row(screen, "s")
    assert row.endswith("3") and "→" not in row, row  # running 3, nothing pending

    tmux.send("k")
    tmux.wait_for(lambda s: "Kill the server?" in s, 10, "the kill confirmation")
    tmux.send("y")
    screen = tmux.wait_for(lambda s: "FREE" in s and s.count(" 0/49140 MiB") >= 2, 60, "FREE with 0 MiB")
    assert "no process" in screen

    tmux.send("q")
    time.sleep(1.0)
    assert stdout.read_text() == "", f"the dashboard wrote to stdout:\n{stdout.read_text()}"
