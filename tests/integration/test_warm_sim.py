"""Warm mode end to end on the simulated SGLang 0.5.23, through the headless CLI: the daemon is tunedash's own job
(its record, tag, proofs), the server its client; an engine kill is WARM with the daemon's MiB, never FREE or
STUCK; a relaunch that keeps the cache key keeps the daemon, one that changes it restarts it naming the field;
`kill --all` ends FREE at 0 MiB; a daemon that dies mid-run takes the engine with it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.fakes import live_group_members
from tests.helpers import MakeProfile, tunedash

pytestmark = pytest.mark.slow

WARM = 'sim_version = "0.5.23"\nwarm = true\n'


def warm_text(make_profile: MakeProfile, sim_state: Path) -> Path:
    path = make_profile(extra=WARM)
    text = path.read_text()
    for line in ('speculative-algorithm = "NEXTN"\n', "speculative-num-steps = 1\n", "speculative-eagle-topk = 1\n",
                 "speculative-num-draft-tokens = 2\n"):
        text = text.replace(line, "")
    path.write_text(text)
    return path


def records(sim_state: Path) -> dict[str, dict]:
    out = {}
    for path in (sim_state / "host" / "jobs").glob("*.json"):
        data = json.loads(path.read_text())
        out[data["profile"]] = data
    return out


def used(profile: Path) -> list[int]:
    gpus = json.loads(tunedash("gpus", str(profile), "--json").stdout)["gpus"]
    return [g["memory_used_mib"] for g in gpus]


def test_warm_launch_kill_relaunch_and_kill_all(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = warm_text(make_profile, sim_state)
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "weight cache daemon started" in launched.stdout and "weight cache daemon ready" in launched.stdout
    daemon = records(sim_state)["t+weight-cache"]
    server = records(sim_state)["t"]
    assert daemon["argv"][1:3] == ["-m", "app.sim.weight_cache"] and daemon["tag"] and daemon["tag"] != server["tag"]
    assert server["argv"][-2:] == ["--weight-cache-mode", "client"]
    assert "Loaded model via IPC (mode=client)" in Path(server["log_path"]).read_text()

    killed = tunedash("kill", str(profile), "--confirm-free", "--timeout", "20")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "WARM: engine gone; 25." in killed.stdout and "GiB per GPU held by the weight cache, pids" in killed.stdout
    assert "STUCK" not in killed.stdout and "GPUs still held" not in killed.stdout
    assert all(mib > 25000 for mib in used(profile))  # the daemon's share stays on the GPUs
    assert live_group_members(server["pgid"]) == [] and live_group_members(daemon["pgid"]) != []
    status = tunedash("status", str(profile))  # the engine is gone, the daemon's memory is not: say so
    assert f"weight cache daemon: running, pids {daemon['pid']}" in status.stdout, status.stdout
    cache = json.loads(tunedash("status", str(profile), "--json").stdout)["weight_cache"]
    assert cache["running"] and cache["pid"] == daemon["pid"] and daemon["pid"] in cache["pids"]

    kept = tunedash("relaunch", str(profile), "--set", "cuda-graph-backend-prefill=breakable")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "restarting the weight cache daemon" not in kept.stdout
    assert records(sim_state)["t+weight-cache"]["pid"] == daemon["pid"]
    assert "Loaded model via IPC" in Path(records(sim_state)["t"]["log_path"]).read_text()

    changed = tunedash("relaunch", str(profile), "--set", "dtype=float16")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "the weight cache key changes (dtype): restarting the weight cache daemon" in changed.stdout
    assert records(sim_state)["t+weight-cache"]["pid"] != daemon["pid"]

    freed = tunedash("kill", str(profile), "--all", "--timeout", "20")
    assert freed.returncode == 0, freed.stdout + freed.stderr
    assert "GPU0 0 MiB, GPU1 0 MiB" in freed.stdout
    assert used(profile) == [0, 0]
    assert live_group_members(records(sim_state)["t+weight-cache"]["pgid"]) == []
    assert "weight cache daemon: not running" in tunedash("status", str(profile)).stdout


def test_a_dead_daemon_takes_the_engine_and_is_named(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = warm_text(make_profile, sim_state)
    assert tunedash("launch", str(profile), "--wait", "--timeout", "60").returncode == 0
    daemon, server = records(sim_state)["t+weight-cache"], records(sim_state)["t"]
    os.killpg(daemon["pgid"], signal.SIGKILL)  # the group this test's launch started
    status = {}
    for _ in range(60):
        status = json.loads(tunedash("status", str(profile), "--json").stdout)
        if status["state"] == "CRASHED":
            break
    assert status["state"] == "CRASHED", status
    assert "Weight cache daemon (pid=" in str(status.get("fatal")), status  # the cause, not the watchdog's echo
    assert "died while this engine holds its weights via CUDA IPC" in Path(server["log_path"]).read_text()


def test_warm_with_speculation_is_refused_before_anything_starts(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = make_profile(extra=WARM)
    refused = tunedash("launch", str(profile), "--wait")
    assert refused.returncode != 0
    assert "refuses --weight-cache-mode with --speculative-algorithm" in refused.stderr + refused.stdout
    assert "t+weight-cache" not in records(sim_state) if (sim_state / "host" / "jobs").exists() else True


def test_another_sessions_daemon_on_the_gpus_is_named(make_profile: MakeProfile, sim_state: Path) -> None:
    first = warm_text(make_profile, sim_state)
    assert tunedash("launch", str(first), "--wait", "--timeout", "60").returncode == 0
    assert tunedash("kill", str(first), "--confirm-free", "--timeout", "20").returncode == 0  # WARM
    other = make_profile(name="u", extra=WARM)
    text = other.read_text()
    for line in ('speculative-algorithm = "NEXTN"\n', "speculative-num-steps = 1\n", "speculative-eagle-topk = 1\n",
                 "speculative-num-draft-tokens = 2\n"):
        text = text.replace(line, "")
    other.write_text(text)
    refused = tunedash("launch", str(other), "--wait")
    assert refused.returncode != 0
    out = refused.stdout + refused.stderr
    assert "python3" in out and "another tunedash launch's (tag" in out, out
    assert "such as its weight cache daemon" in out
    assert "u+weight-cache" not in records(sim_state)


def test_stuck_beside_the_daemon_names_the_daemon_as_ours(make_profile: MakeProfile, sim_state: Path) -> None:
    """The engine's memory never comes back (a leak): STUCK, not WARM, and the daemon's pids are named as this
    profile's weight cache daemon, not as a stranger's."""
    path = make_profile(extra=WARM, fault="never_release")
    text = path.read_text()
    for line in ('speculative-algorithm = "NEXTN"\n', "speculative-num-steps = 1\n", "speculative-eagle-topk = 1\n",
                 "speculative-num-draft-tokens = 2\n"):
        text = text.replace(line, "")
    path.write_text(text)
    assert tunedash("launch", str(path), "--wait", "--timeout", "60").returncode == 0
    stuck = tunedash("kill", str(path), "--confirm-free", "--timeout", "3")
    assert stuck.returncode == 3, stuck.stdout + stuck.stderr
    assert "GPUs still held" in stuck.stdout and "WARM:" not in stuck.stdout
    assert "python3" in stuck.stdout and "(this profile's weight cache daemon)" in stuck.stdout, stuck.stdout
    from app.sim.host_env import reset_state

    assert tunedash("kill", str(path), "--all", "--timeout", "3").returncode == 3  # the leak stays: still held
    reset_state(sim_state)
