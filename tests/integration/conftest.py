"""Fixtures for end-to-end tests on the simulated host: a private state folder, a free port, a profile file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.sim.host_env import reset_state

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def sim_state(tmp_path: Path) -> Path:
    state = tmp_path / "sim"
    reset_state(state)
    return state


MakeProfile = Callable[..., Path]


@pytest.fixture
def make_profile(tmp_path: Path, sim_state: Path) -> Iterator[MakeProfile]:
    """Write a demo-like profile with its own state folder and port; kill whatever it launched afterwards."""
    written: list[Path] = []

    def make(*, name: str = "t", startup_s: float = 0.6, fault: str = "", steps: int = 1, extra: str = "") -> Path:
        env = {"TUNEDASH_SIM_STARTUP_S": str(startup_s)}
        if fault:
            env["TUNEDASH_SIM_FAULT"] = fault
        env_toml = ", ".join(f'{k} = "{v}"' for k, v in env.items())
        path = tmp_path / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\nhost = "sim"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\n'
            f"port = {free_port()}\ngpus = [0, 1]\nsim_state = \"{sim_state}\"\nenv = {{ {env_toml} }}\n{extra}\n"
            "[flags]\ntp-size = 2\nmem-fraction-static = 0.88\nspeculative-algorithm = \"NEXTN\"\n"
            f"speculative-num-steps = {steps}\nspeculative-eagle-topk = 1\n"
            f"speculative-num-draft-tokens = {steps + 1}\ndecode-log-interval = 40\n"
        )
        written.append(path)
        return path

    yield make
    jobs_dir = sim_state / "host" / "jobs"
    for record_file in jobs_dir.glob("*.json") if jobs_dir.exists() else []:
        pgid = json.loads(record_file.read_text())["pgid"]
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def tunedash(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
