"""The headless CLI end to end against the simulated host: launch, gpus, status, relaunch, kill, free."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

from app.sim.host_env import reset_state
from tests.fakes import live_group_members
from tests.helpers import MakeProfile, tunedash


def _record(sim_state: Path, name: str = "t") -> dict:
    return json.loads(next((sim_state / "host" / "jobs").glob(f"{name}-*.json")).read_text())


def test_launch_gpus_relaunch_kill(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = make_profile()
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stderr
    assert "ready" in launched.stdout

    gpus = tunedash("gpus", str(profile), "--json")
    assert gpus.returncode == 0, gpus.stderr
    data = json.loads(gpus.stdout)
    assert [g["index"] for g in data["gpus"]] == [0, 1]
    for gpu in data["gpus"]:
        assert gpu["memory_used_mib"] > 40000
        assert any(p["name"].startswith("sglang::scheduler_TP") for p in gpu["processes"])

    status = tunedash("status", str(profile), "--json")
    assert json.loads(status.stdout)["state"] == "READY"

    relaunched = tunedash("relaunch", str(profile), "--set", "speculative-num-steps=3")
    assert relaunched.returncode == 0, relaunched.stderr
    for phase in ("kill", "release", "load", "ready"):
        assert f"{phase} " in relaunched.stdout
    record = _record(sim_state)
    assert record["flags"]["speculative-num-steps"] == 3
    assert record["flags"]["speculative-num-draft-tokens"] == 4

    killed = tunedash("kill", str(profile), "--confirm-free")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "GPU0 0 MiB, GPU1 0 MiB" in killed.stdout
    assert live_group_members(record["pgid"]) == []


def test_launch_wait_leaves_a_record_that_says_ready(make_profile: MakeProfile, sim_state: Path) -> None:
    """`launch --wait` ended right after READY, before the record's write of outcome, ready time and phase times
    landed: the record said "running" forever (the fleet counted READY's time from when it first looked)."""
    profile = make_profile()
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stderr
    record = _record(sim_state)
    assert record["outcome"] == "ready"
    assert record["launched_at"] < record["ready_at"] and record["phase_times"]["ready"] > 0


def test_orphaned_ranks_hold_memory_until_the_group_is_killed(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = make_profile()
    assert tunedash("launch", str(profile), "--wait").returncode == 0
    record = _record(sim_state)
    os.kill(record["pid"], signal.SIGKILL)  # the main process only, as a careless `kill -9 PID` does
    held = tunedash("free", str(profile), "--timeout", "2")
    assert held.returncode == 3
    assert "sglang::scheduler_TP0" in held.stdout and "sglang::scheduler_TP1" in held.stdout
    freed = tunedash("kill", str(profile), "--confirm-free")
    assert freed.returncode == 0, freed.stdout + freed.stderr
    assert live_group_members(record["pgid"]) == []


def test_memory_that_never_frees_exits_3_naming_holders(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = make_profile(fault="never_release")
    assert tunedash("launch", str(profile), "--wait").returncode == 0
    stuck = tunedash("kill", str(profile), "--confirm-free", "--timeout", "2")
    assert stuck.returncode == 3
    assert "GPUs still held" in stuck.stdout
    assert "sglang::scheduler_TP" in stuck.stdout
    reset_state(sim_state)


def test_crash_while_loading_exits_4_with_the_traceback(make_profile: MakeProfile) -> None:
    profile = make_profile(fault="crash_loading")
    crashed = tunedash("launch", str(profile), "--wait")
    assert crashed.returncode == 4
    assert "Traceback" in crashed.stderr or "Error" in crashed.stderr
    assert "full log:" in crashed.stderr


def test_taken_port_is_refused_without_launching(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = make_profile()
    port = int(next(line for line in profile.read_text().splitlines() if line.startswith("port")).split("=")[1])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        refused = tunedash("launch", str(profile), "--wait")
    assert refused.returncode == 4
    assert f"port {port}" in refused.stderr
    assert not list((sim_state / "host" / "jobs").glob("t-*.json"))


def test_a_second_process_reattaches(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = make_profile(startup_s=1.0)
    started = tunedash("launch", str(profile))  # no --wait: this process exits at once
    assert started.returncode == 0, started.stderr
    again = tunedash("launch", str(profile))
    assert again.returncode == 2 and "already running" in again.stderr
    waited = tunedash("relaunch", str(profile))
    assert waited.returncode == 0
    status = json.loads(tunedash("status", str(profile), "--json").stdout)
    assert status["state"] == "READY" and status["pid"] == _record(sim_state)["pid"]
    assert tunedash("kill", str(profile), "--confirm-free").returncode == 0


def test_profile_errors_exit_2_naming_file_and_flag(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('host = "sim"\nbackend = "sglang"\nmodel = "m"\n[flags]\nspeculative-num-step = 3\n')
    result = tunedash("launch", str(bad))
    assert result.returncode == 2
    assert str(bad) in result.stderr and "speculative-num-steps" in result.stderr
    unknown = tunedash("launch", str(tmp_path / "missing.toml"))
    assert unknown.returncode == 2
