"""Fixtures for the simulated host's own tests: its environment and process-group cleanup (`sim_state` is in
tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.sim.host_env import sim_environment


@pytest.fixture
def sim_env(sim_state: Path) -> dict[str, str]:
    """os.environ plus the simulated host's variables."""
    env = dict(os.environ)
    env.update(sim_environment(sim_state))
    env.pop("TUNEDASH_SIM_FAULT", None)
    env["TUNEDASH_SIM_STARTUP_S"] = "0.4"
    return env


def smi(env: dict[str, str], *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """Run the fake nvidia-smi found on the simulated host's PATH."""
    return subprocess.run(["nvidia-smi", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


class GroupReaper:
    """Starts processes in their own process group and kills every group at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, argv: list[str], env: dict[str, str], **kw: object) -> subprocess.Popen[str]:
        proc: subprocess.Popen[str] = subprocess.Popen(  # type: ignore[call-overload]
            argv, env=env, start_new_session=True, text=True, **kw
        )
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def reaper() -> Iterator[GroupReaper]:
    r = GroupReaper()
    yield r
    r.kill_all()


def wait_for(predicate: object, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll `predicate()` until it is truthy or `timeout` passes."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
