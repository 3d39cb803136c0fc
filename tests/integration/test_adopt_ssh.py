"""`tunedash adopt` over the loopback sshd: the simulated SGLang started by hand by the SSH user (not by tunedash)
is listed as that user's, with its GPUs read on the far side, and its profile (host = the ssh:// URL) loads back
to the same command line. Nothing is signalled."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.core.data import ServerState
from app.core.profiles.loading import load_profile
from app.core.profiles.render import launch_argv
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.sim.host_env import reset_state, sim_environment
from app.tui.app import TunedashApp, create_app
from tests.helpers import free_port
from tests.helpers import pilot_until as until
from tests.integration.sshd import TEST_USER, Sshd, open_to_all
from tests.integration.test_ssh_cli import cli
from tests.ui.ui_flows import SIZE, event_texts, screen_text, state_of
from widgets import ConfirmModal

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


@dataclass
class ByHand:
    """The simulated SGLang started by hand by the SSH user, as in a tmux pane on that host."""

    pid: int
    argv: list[str]
    port: int
    state: Path
    log: Path
    host_profile: Path
    home: Path


@contextlib.contextmanager
def started_by_hand(sshd: Sshd, ssh_tmp: Path) -> Iterator[ByHand]:
    if os.geteuid() != 0:
        pytest.skip("the server is started as the SSH user with runuser (root only)")
    state = ssh_tmp / "sim"
    reset_state(state, startup_s=0.4)
    open_to_all(state)
    host_profile = ssh_tmp / "remote.toml"
    host_profile.write_text(f'host = "{sshd.spec}"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\n'
                            f'python = "{sys.executable}"\nmodule = "app.sim.sglang"\nsim_state = "{state}"\n')
    home = sshd.make_home(ssh_tmp / "home")
    port = free_port()
    argv = [sys.executable, "-m", "app.sim.sglang", "--model-path", "sim/qwen3.6-27b", "--port", str(port),
            "--tp-size", "2", "--enable-metrics", "--max-total-tokens", "8192"]
    env = {**sim_environment(state), "CUDA_VISIBLE_DEVICES": "0,1", "TUNEDASH_SIM_STARTUP_S": "0.4",
           "HOME": f"/home/{TEST_USER}"}
    log = ssh_tmp / "by-hand.log"
    log.touch()
    log.chmod(0o666)
    runner = subprocess.Popen(["runuser", "-u", TEST_USER, "--", "sh", "-c", 'exec "$@" >> "$0" 2>&1', str(log),
                               "env", *(f"{k}={v}" for k, v in env.items()), *argv],
                              cwd="/", start_new_session=True)
    pid = None
    try:
        deadline = time.monotonic() + 60
        while "fired up" not in log.read_text(errors="replace"):
            assert runner.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        pid = int(subprocess.run(["pgrep", "-P", str(runner.pid)], capture_output=True, text=True).stdout.split()[0])
        yield ByHand(pid, argv, port, state, log, host_profile, home)
    finally:
        if pid is not None:  # the processes this test started, by their pids: the server's children first
            children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
            for child in [*map(int, children), pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        runner.wait(timeout=10)


def test_sim_started_by_hand_found_and_written_over_ssh(sshd: Sshd, ssh_tmp: Path) -> None:
    with started_by_hand(sshd, ssh_tmp) as hand:
        pid, home, host_profile, state, log, port, argv = (hand.pid, hand.home, hand.host_profile, hand.state,
                                                           hand.log, hand.port, hand.argv)
        done = cli(home, "adopt", str(host_profile), "--json")
        assert done.returncode == 0, done.stderr
        rows = [row for row in json.loads(done.stdout) if row["pid"] == pid]
        assert len(rows) == 1
        row = rows[0]
        assert (row["user"], row["mine"], row["simulated"], row["port"]) == (TEST_USER, True, True, port)
        assert set(row["gpus_mib"]) == {"0", "1"} and row["log"] == str(log)
        target = ssh_tmp / "adopted.toml"
        wrote = cli(home, "adopt", str(host_profile), "--pid", str(pid), "--write", str(target))
        assert wrote.returncode == 0, wrote.stderr
        profile = load_profile(target)
        assert (profile.host, profile.sim_state, profile.gpus) == (sshd.spec, state, (0, 1))
        assert Counter(launch_argv(profile)) == Counter(argv)
        assert Path(f"/proc/{pid}").exists()  # still running: nothing was signalled


async def test_the_dashboard_over_ssh_adopts_asks_and_relaunches_under_tunedash(
        sshd: Sshd, ssh_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard on the written profile (host = the ssh:// URL): READY with probe tok/s through the port
    forward, `r` asks naming the SSH user's pid, yes kills it (the proof re-read on the far side) and relaunches
    it under tunedash's own record on that host."""

    with started_by_hand(sshd, ssh_tmp) as hand:
        target = ssh_tmp / "adopted.toml"
        wrote = cli(hand.home, "adopt", str(hand.host_profile), "--pid", str(hand.pid), "--write", str(target))
        assert wrote.returncode == 0, wrote.stderr
        monkeypatch.setenv("HOME", str(hand.home))
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        profile = load_profile(target)
        app = create_app(profile, probe=True, keymap_file=None)
        try:
            async with app.run_test(size=SIZE, notifications=True) as pilot:
                await flow(pilot, app, hand, profile)
        finally:
            await app.session.host.close()  # what `tunedash ui` gets by exiting: the app first, then the connection


async def flow(pilot: Any, app: TunedashApp, hand: ByHand, profile: Profile) -> None:
    """READY, tok/s, r asks, yes: killed and relaunched under tunedash; then k kills it as tunedash's own."""
    await until(pilot, lambda: state_of(app) == ServerState.READY, 60, "READY over SSH",
                lambda: " | ".join(event_texts(app)))
    assert app.session.adopted is not None and app.session.adopted.proof.pid == hand.pid
    await until(pilot, lambda: any(p.source == "probe" and p.tokens_per_s > 0
                                   for p in app.session.throughput), 60, "probe tok/s over SSH")
    await pilot.press("r")
    await until(pilot, lambda: isinstance(app.screen, ConfirmModal), 10, "the adopt question")
    text = " ".join(screen_text(app).split())
    assert f"pid {hand.pid}" in text and f"user {TEST_USER}" in text
    await pilot.press("y")
    await until(pilot, lambda: gone(hand.pid), 30, "the hand-started server gone")
    await until(pilot, lambda: state_of(app) == ServerState.READY and app.session.busy is None, 60,
                "READY under tunedash over SSH", lambda: " | ".join(event_texts(app)))
    record = await jobs.load_job(app.session.host, profile)
    assert record is not None and record.tag and record.pid not in (None, hand.pid)
    assert any(f"SIGTERM to pid {hand.pid} (adopted" in t for t in event_texts(app))
    await pilot.press("k")
    await until(pilot, lambda: isinstance(app.screen, ConfirmModal), 10, "the ordinary kill question")
    await pilot.press("y")
    await until(pilot, lambda: state_of(app) == ServerState.FREE, 60, "FREE",
                lambda: " | ".join(event_texts(app)))


def gone(pid: int) -> bool:
    """No such process, or a zombie (an empty command line)."""
    try:
        return not Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
