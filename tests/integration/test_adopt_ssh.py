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
from pathlib import Path

import pytest

from app.core.profiles.loading import load_profile
from app.core.profiles.render import launch_argv
from app.sim.host_env import reset_state, sim_environment
from tests.helpers import free_port
from tests.integration.sshd import TEST_USER, Sshd, open_to_all
from tests.integration.test_ssh_cli import cli

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_sim_started_by_hand_found_and_written_over_ssh(sshd: Sshd, ssh_tmp: Path) -> None:
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
    finally:
        if pid is not None:  # the processes this test started, by their pids: the server's children first
            children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
            for child in [*map(int, children), pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        runner.wait(timeout=10)
