"""The headless progress of a launch and a relaunch (issue 20 item 3) on the simulated SGLang 0.5.23, piped: a plain
line per phase, the finished line, the phase times in the history (the next run's ETA), and the line that says
what the weight cache saved."""

from __future__ import annotations

import os
import pty
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, MakeProfile, tunedash

pytestmark = pytest.mark.slow


def warm_profile(make_profile: MakeProfile) -> Path:
    path = make_profile(extra='sim_version = "0.5.23"\nwarm = true\n')
    text = path.read_text()
    for line in ('speculative-algorithm = "NEXTN"\n', "speculative-num-steps = 1\n", "speculative-eagle-topk = 1\n",
                 "speculative-num-draft-tokens = 2\n"):
        text = text.replace(line, "")
    path.write_text(text)
    return path


def history_rows() -> list[tuple[str, str, float]]:
    db = sqlite3.connect(Path(os.environ["TUNEDASH_DATA_DIR"]) / "history.sqlite3")
    try:
        return db.execute("SELECT kind, cache, total_s FROM launch_phases WHERE profile = 't' ORDER BY at").fetchall()
    finally:
        db.close()


def test_piped_progress_eta_and_what_the_cache_saved(make_profile: MakeProfile, sim_state: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # A history of its own: runs of another test's profile "t" with the same weights would change "instead of".
    monkeypatch.setenv("TUNEDASH_DATA_DIR", str(tmp_path / "history"))
    profile = warm_profile(make_profile)
    before = 0
    try:
        launched = tunedash("launch", str(profile), "--wait", "--timeout", "60")
        assert launched.returncode == 0, launched.stdout + launched.stderr
        out = launched.stdout
        assert "\r" not in out  # piped: plain lines, never a rewritten one
        progress = [line for line in out.splitlines() if line.startswith("launch ")]
        assert any(" daemon " in line for line in progress), out  # the daemon's start is a phase of its own
        assert progress[-1].startswith("launch [####################] 100%  ready after"), out
        assert "the weight cache daemon loaded the weights" in out

        first = tunedash("relaunch", str(profile), "--set", "cuda-graph-backend-prefill=breakable")
        assert first.returncode == 0, first.stdout + first.stderr
        # the weights came from the daemon the launch started: "instead of" is that daemon's start from disk
        assert "weights from the cache" in first.stdout and "instead of the daemon's start from disk" in first.stdout

        second = tunedash("relaunch", str(profile), "--set", "cuda-graph-backend-prefill=breakable")
        assert second.returncode == 0, second.stdout + second.stderr
        lines = [line for line in second.stdout.splitlines() if line.startswith("relaunch [")]
        assert any("ETA" in line and "from the last relaunch of this config (weights from the cache)" in line
                   for line in lines), second.stdout
        rows = history_rows()[before:]
        assert [(kind, cache) for kind, cache, _ in rows] == [("launch", "fill"), ("relaunch", "warm"),
                                                              ("relaunch", "warm")]
        assert all(total > 0 for _, _, total in rows)
    finally:
        tunedash("kill", str(profile), "--all", "--timeout", "20")


def test_on_a_terminal_the_progress_is_one_line_rewritten(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = make_profile(startup_s=1.5)
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "app", "launch", str(profile), "--wait", "--timeout", "60"],
                                stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE, cwd=REPO)
        os.close(follower)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=90) == 0, out.decode(errors="replace")
    finally:
        os.close(leader)
        tunedash("kill", str(profile), "--timeout", "20")
    text = out.decode(errors="replace")
    rewritten = [part for part in text.split("\r") if part.startswith("launch ")]
    assert len(rewritten) >= 2, text  # the same line drawn again in place, not a line per tick
    assert "launch [####################] 100%  ready after" in text
    assert not any(line.startswith("launch start") for line in text.split("\n")), text  # no piped-style lines
