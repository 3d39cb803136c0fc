"""The custom backend end to end through the CLI, on the simulated host with no GPUs (gpus = []).

CPU-only stand-ins play the server: a one-line Python program that prints a ready line, Python's own
http.server for the health URL, a program that crashes, and scripts/gpu_hog.py --no-cuda (one child per
rank in the parent's process group) for the orphan case.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fakes import live_group_members
from tests.helpers import REPO, free_port, kill_launched, tunedash

WriteProfile = Callable[..., Path]


@pytest.fixture
def custom_profile(tmp_path: Path, sim_state: Path) -> Iterator[WriteProfile]:
    """Write a custom profile on the simulated host (private state folder); kill its groups afterwards."""

    def write(command: list[str], *, name: str = "c", extra: str = "") -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\nhost = "sim"\nbackend = "custom"\ngpus = []\nport = {free_port()}\n'
            f'sim_state = "{sim_state}"\ncommand = {json.dumps(command)}\n{extra}\n'
        )
        return path

    yield write
    kill_launched(sim_state)


def _record(sim_state: Path, name: str = "c") -> dict:
    return json.loads(next((sim_state / "host" / "jobs").glob(f"{name}-*.json")).read_text())


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_ready_by_log_regex_then_kill(custom_profile: WriteProfile, sim_state: Path) -> None:
    script = "import time; print('warming up', flush=True); time.sleep(0.3); print('srv: listening', flush=True); " \
             "time.sleep(600)"
    profile = custom_profile([sys.executable, "-c", script], extra='ready_regex = "srv: listen(ing)?"')
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "30")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "READY" in launched.stdout
    assert "ready:" in launched.stdout
    record = _record(sim_state)
    assert record["backend"] == "custom"
    assert record["argv"] == [sys.executable, "-c", script]

    status = tunedash("status", str(profile), "--json")
    assert json.loads(status.stdout)["state"] == "READY"

    killed = tunedash("kill", str(profile), "--confirm-free", "--grace", "5")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "FREE" in killed.stdout
    assert "no GPUs in the profile" in killed.stdout
    assert not _alive(record["pid"])


def test_ready_by_health_url(custom_profile: WriteProfile, tmp_path: Path) -> None:
    (tmp_path / "health").write_text("ok\n")
    # http.server answers 200 for a file once it listens; a 1 s sleep first keeps it unready for a while.
    serve = "import runpy, sys, time; time.sleep(1); sys.argv = sys.argv[1:]; runpy.run_module('http.server', " \
            "run_name='__main__')"
    profile = custom_profile(
        [sys.executable, "-c", serve, "http.server", "--bind", "127.0.0.1", "--directory", "{profile_dir}", "{port}"],
        extra='health_url = "http://127.0.0.1:{port}/health"',
    )
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "30")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "/health answered 200" in launched.stdout
    assert "READY" in launched.stdout
    killed = tunedash("kill", str(profile), "--confirm-free", "--grace", "5")
    assert killed.returncode == 0, killed.stdout + killed.stderr


def test_crash_before_ready_names_the_error(custom_profile: WriteProfile) -> None:
    script = "print('loading', flush=True); raise RuntimeError('weights file /m/x.bin is missing')"
    profile = custom_profile([sys.executable, "-c", script], extra='ready_regex = "never printed"')
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "30")
    assert launched.returncode == 4, launched.stdout + launched.stderr
    assert "RuntimeError: weights file /m/x.bin is missing" in launched.stderr


def test_orphaned_children_are_killed_with_their_group(custom_profile: WriteProfile, sim_state: Path) -> None:
    hog = str(REPO / "scripts" / "gpu_hog.py")
    profile = custom_profile([sys.executable, hog, "--no-cuda", "--gpus", "0,1"],
                             extra='ready_regex = "gpu_hog: all \\\\d+ ranks hold"\n[flags]\nmib = 1')
    launched = tunedash("launch", str(profile), "--set", "orphan-children=true", "--wait", "--timeout", "30")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    record = _record(sim_state)
    assert record["argv"][-3:] == ["--mib", "1", "--orphan-children"]
    children = [p.pid for p in live_group_members(record["pgid"]) if p.pid != record["pid"]]
    assert len(children) == 2

    os.kill(record["pid"], signal.SIGKILL)  # the parent alone, as a careless `kill -9 PID` does
    assert _wait_gone([record["pid"]]) == []
    assert all(_alive(child) for child in children)

    killed = tunedash("kill", str(profile), "--confirm-free", "--grace", "5")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "(2 processes)" in killed.stdout
    assert _wait_gone(children) == []


