"""The tune screen in a real tmux: `t` on the demo of a profile with a small [tune] table races it to the end (the
leaderboard, the Pareto plots, what the server runs), escape closes it, and nothing lands on stdout."""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, MakeProfile
from tests.integration.test_tmux_demo import Tmux

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (CI installs it via .ci/run)"),
]

TUNE = """
[bench]
concurrency = 2
requests = 2
input_len = 16
output_len = 16
warmup = 0
[tune]
shapes = [{ concurrency = 1, requests = 1 }, { concurrency = 2, requests = 2 }]
max_launches = 3
advisor_seeds = false
[tune.flags]
speculative-num-steps = [1, 3]
"""


def test_the_tune_screen_in_tmux(make_profile: MakeProfile, tmp_path: Path) -> None:
    profile = make_profile(name="tmuxtune", startup_s=0.3, extra=TUNE)
    stdout = tmp_path / "stdout.txt"
    command = (f"TEXTUAL_ANIMATIONS=none TUNEDASH_DATA_DIR={shlex.quote(str(tmp_path / 'data'))} "
               f"{shlex.join([sys.executable, '-m', 'app', 'demo', str(profile)])} >{shlex.quote(str(stdout))}")
    tmux = Tmux(command, REPO)
    try:
        tmux.wait_for(lambda s: "READY" in s and "tokens/s" in s, 60, "READY")
        tmux.send("t")
        tmux.wait_for(lambda s: "tune tmuxtune: 2 candidates x 2 shapes" in s, 10, "the tune screen")
        screen = tmux.wait_for(lambda s: "the server runs steps=" in s, 120, "the end of the tune")
        assert "launches 3 spent, 0 left" in screen and "c1 16/16" in screen and "c2 16/16" in screen
        assert "Pareto: per stream vs total tok/s" in screen
        tmux.send("Escape")
        tmux.wait_for(lambda s: "READY" in s and "tune tmuxtune" not in s, 10, "the dashboard again")
        tmux.send("q")
        time.sleep(1.0)
        assert stdout.read_text() == "", f"the dashboard wrote to stdout:\n{stdout.read_text()}"
    finally:
        tmux.kill()
