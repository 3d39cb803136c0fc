"""The log parser on logs written by the simulated SGLang server (app/sim/sglang.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.core.data import DecodeStats, FatalEvent, Notice, Phase, PhaseEvent, ReadyEvent
from app.core.logs.parser import parse_lines, read_log_lines
from app.sim.host_env import reset_state, sim_environment
from tests.helpers import free_port

StartSim = Callable[..., "subprocess.Popen[bytes]"]
READY = "The server is fired up and ready to roll!"


@pytest.fixture
def run_sim(tmp_path: Path) -> Iterator[StartSim]:
    """Start the simulated server in its own process group, writing its log to a file; kill the group after."""
    started: list[subprocess.Popen[bytes]] = []
    env = dict(os.environ)
    env.update(sim_environment(reset_state(tmp_path / "sim", startup_s=0.4)))
    env["TUNEDASH_SIM_STARTUP_S"] = "0.4"

    def start(log: Path, fault: str = "", *flags: str) -> subprocess.Popen[bytes]:
        env["TUNEDASH_SIM_FAULT"] = fault
        argv = [sys.executable, "-m", "app.sim.sglang", "--model-path", "sim/qwen3.6-27b", "--tp-size", "2"]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*argv, "--port", str(free_port()), *flags],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def test_sim_startup_log_parses_to_phases_ready_and_notices(run_sim: StartSim, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    proc = run_sim(log, "", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    deadline = time.monotonic() + 20
    while READY not in log.read_text(errors="replace") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert READY in log.read_text(errors="replace"), log.read_text(errors="replace")
    parsed = parse_lines(read_log_lines(log))
    assert parsed.backend == "sglang"
    events = list(parsed.events)
    seen = [(e.phase, e.begin) for e in events if isinstance(e, PhaseEvent)]
    for step in [(Phase.INIT, True), (Phase.WEIGHTS, False), (Phase.KV_CACHE, True), (Phase.CUDA_GRAPH, False)]:
        assert step in seen
    assert any(isinstance(e, ReadyEvent) for e in events)
    assert any(isinstance(e, Notice) and e.text.startswith("Overlap scheduler is disabled") for e in events)
    assert not any(isinstance(e, FatalEvent) for e in events)
    summary = parsed.summary()
    assert summary.ready and summary.ready_seconds is not None
    assert not any(isinstance(e, DecodeStats) for e in events) or summary.max_gen_tps is not None


def test_sim_oom_at_capture_is_an_oom_fatal(run_sim: StartSim, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    proc = run_sim(log, "oom_capture")
    assert proc.wait(timeout=20) != 0
    events = list(parse_lines(read_log_lines(log)).events)
    fatal = [e for e in events if isinstance(e, FatalEvent)]
    assert "oom" in [e.kind for e in fatal], [(e.kind, e.text) for e in fatal]
    assert not any(isinstance(e, ReadyEvent) for e in events)
