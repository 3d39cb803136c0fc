"""Warm mode for a custom profile end to end on the simulated host, through the headless CLI: scripts/gpu_hog.py
--sim plays the daemon (its [warm] table) and the engine (the profile's command, the daemon's client), holding
memory on the simulated GPUs per pid; the daemon is tunedash's own job (record, tag, proofs); an engine kill is
WARM with the daemon's MiB, `kill --all` FREE at 0 MiB; a stale ready file does not make a daemon ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.sim.rank_phases import CONTEXT_MIB
from tests.fakes import live_group_members
from tests.helpers import REPO, kill_launched, tunedash

pytestmark = pytest.mark.slow
HOG = str(REPO / "scripts" / "gpu_hog.py")


def write_hog(tmp_path: Path, sim_state: Path, *, daemon_writes_file: bool = True, ready_regex: bool = True,
              top: str = "") -> Path:
    """tmp_path/hog.toml: gpu_hog --sim as the daemon (5000 MiB) and the engine (3000 MiB) on simulated GPU 1."""
    ready = tmp_path / "daemon.ready"
    writes = f', "--ready-file", "{ready}"' if daemon_writes_file else ""
    regex = 'ready_regex = "gpu_hog daemon: all \\\\d+ ranks hold"\n' if ready_regex else ""
    path = tmp_path / "hog.toml"
    path.write_text(
        f'name = "hog"\nhost = "sim"\nsim_state = "{sim_state}"\nbackend = "custom"\npython = "{sys.executable}"\n'
        f'gpus = [1]\n{top}command = ["{{python}}", "{HOG}", "--sim", "--role", "engine"]\n'
        'ready_regex = "gpu_hog engine: all \\\\d+ ranks hold"\n[flags]\nmib = 3000\n'
        f'[warm]\ndaemon = ["{{python}}", "{HOG}", "--sim", "--role", "daemon", "--mib", "5000"{writes}]\n{regex}'
        f'ready_file = "{ready}"\nclient_args = ["--daemon-file", "{ready}"]\n'
    )
    return path


@pytest.fixture
def hog_profile(tmp_path: Path, sim_state: Path) -> Iterator[Path]:
    yield write_hog(tmp_path, sim_state)
    kill_launched(sim_state)


def records(sim_state: Path) -> dict[str, dict]:
    return {data["profile"]: data for data in
            (json.loads(p.read_text()) for p in (sim_state / "host" / "jobs").glob("*.json"))}


def holders(profile: Path) -> dict[int, int]:
    """pid -> MiB on the profile's GPU, from the simulated nvidia-smi through `tunedash gpus --json`."""
    gpus = json.loads(tunedash("gpus", str(profile), "--json").stdout)["gpus"]
    gpu = next(g for g in gpus if g["index"] == 1)
    return {p["pid"]: p["used_mib"] for p in gpu["processes"]}


def ranks(record: dict) -> list[int]:
    return [p.pid for p in live_group_members(record["pgid"]) if p.pid != record["pid"]]


def test_daemon_and_engine_then_warm_then_free(hog_profile: Path, sim_state: Path, tmp_path: Path) -> None:
    launched = tunedash("launch", str(hog_profile), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "weight cache daemon ready" in launched.stdout and "READY" in launched.stdout
    daemon, engine = records(sim_state)["hog+weight-cache"], records(sim_state)["hog"]
    assert daemon["argv"][2:5] == ["--sim", "--role", "daemon"] and daemon["tag"] != engine["tag"]
    assert engine["argv"][-4:] == ["--mib", "3000", "--daemon-file", str(tmp_path / "daemon.ready")]
    daemon_rank, engine_rank = ranks(daemon), ranks(engine)
    assert holders(hog_profile) == {daemon_rank[0]: 5000 + CONTEXT_MIB, engine_rank[0]: 3000 + CONTEXT_MIB}

    killed = tunedash("kill", str(hog_profile), "--confirm-free", "--timeout", "20")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert f"WARM: engine gone; 5.4 GiB per GPU held by the weight cache, pids {daemon_rank[0]}" in killed.stdout
    assert "STUCK" not in killed.stdout
    assert holders(hog_profile) == {daemon_rank[0]: 5000 + CONTEXT_MIB}
    assert live_group_members(engine["pgid"]) == []

    kept = tunedash("relaunch", str(hog_profile), "--set", "mib=2000")  # the engine's flags keep the daemon
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "restarting the weight cache daemon" not in kept.stdout
    assert records(sim_state)["hog+weight-cache"]["pid"] == daemon["pid"]
    assert sorted(holders(hog_profile).values()) == [2000 + CONTEXT_MIB, 5000 + CONTEXT_MIB]

    freed = tunedash("kill", str(hog_profile), "--all", "--timeout", "20")
    assert freed.returncode == 0, freed.stdout + freed.stderr
    assert "GPU1 0 MiB" in freed.stdout and "FREE" in freed.stdout
    assert holders(hog_profile) == {}
    assert live_group_members(daemon["pgid"]) == []
    assert not (tmp_path / "daemon.ready").exists()  # the daemon removed its ready file on SIGTERM


def test_a_stale_ready_file_does_not_make_the_daemon_ready(tmp_path: Path, sim_state: Path) -> None:
    ready = tmp_path / "daemon.ready"
    ready.write_text("pid=1\nmib=5000\n")  # left behind by an earlier daemon, an hour ago
    os.utime(ready, (time.time() - 3600,) * 2)
    profile = write_hog(tmp_path, sim_state, daemon_writes_file=False, ready_regex=False, top="ready_timeout = 3\n")
    try:
        launched = tunedash("launch", str(profile), "--wait", "--timeout", "30")
    finally:
        kill_launched(sim_state)
    assert launched.returncode != 0, launched.stdout
    assert "the weight cache daemon of hog was not ready within 3 s (stopped it)" in launched.stderr
    assert "hog" not in records(sim_state)  # the engine never started


def test_the_engine_refuses_to_start_without_its_daemon(tmp_path: Path) -> None:
    engine = subprocess.run([sys.executable, HOG, "--no-cuda", "--role", "engine", "--mib", "1", "--daemon-file",
                             str(tmp_path / "none.ready")], capture_output=True, text=True, timeout=30)
    assert engine.returncode == 1
    assert f"gpu_hog engine: no live daemon in {tmp_path / 'none.ready'}; start the daemon first" in engine.stdout
