"""End to end on a simulated 8-GPU host (a small copy of profiles/demo-8gpu.toml): `tunedash ab --slots 2` runs A and B
side by side on two slots crossed over, the two servers never share a GPU or a port, and the JSON finds the 4% slower
slot while A == B; afterwards slot 0 keeps running and slot 1's server is gone, its GPUs free."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from tests.helpers import REPO, MakeProfile, free_port, kill_launched, wait_until

pytestmark = pytest.mark.slow

SMALL = ["--requests", "4", "--concurrency", "2", "--max-tokens", "40", "--input-len", "32", "--warmup", "1"]
# The slot is 20% slower here, not demo-8gpu's 4%: on this test's loaded 2-core machine two servers and two load
# generators at once spread a launch mean by ~4% (CPU, not the sim's 0.5% launch factor), so 4 launches per arm
# resolve about 12% (docs/decisions.md, "A/B on two slots: a crossover", has the 4% slot found on an idle host).
SLOW = 0.8


def _two_free_ports() -> int:
    """A port p with p + 1 free too (slot 1 listens on the profile's port + 1)."""
    for _ in range(50):
        port = free_port()
        try:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise AssertionError("no two adjacent free ports")


def _profile(tmp_path: Path, state: Path, port: int) -> Path:
    speed = tmp_path / "speed.toml"
    speed.write_text("launch_sigma = 0.005\nnoise_sigma = 0.01\n")  # a 4% slot stands out of a 0.5% launch spread
    path = tmp_path / "slots8.toml"
    path.write_text(
        f'name = "slots8"\nhost = "sim"\nsim_gpus = "8xH200"\nsim_state = "{state}"\nbackend = "sglang"\n'
        f'model = "sim/qwen3.6-27b"\nport = {port}\ngpus = [0, 1]\n'
        # slot 1 is the next free pair (GPUs 2, 3): put the slower link there, as demo-8gpu has it on 6, 7
        f'env = {{ TUNEDASH_SIM_STARTUP_S = "0.3", TUNEDASH_SIM_GPU_SPEED = "2={SLOW},3={SLOW}", '
        f'TUNEDASH_SIM_SPEED_FILE = "{speed}" }}\n'
        '[flags]\ntp-size = 2\nmem-fraction-static = 0.88\nspeculative-algorithm = "NEXTN"\n'
        "speculative-num-steps = 1\nspeculative-eagle-topk = 1\nspeculative-num-draft-tokens = 2\n")
    return path


def _live_records(state: Path) -> list[dict[str, object]]:
    out = []
    for f in (state / "host" / "jobs").glob("*.json") if (state / "host" / "jobs").exists() else []:
        try:
            record = json.loads(f.read_text())
        except (OSError, ValueError):  # being rewritten right now: the next look reads it
            continue
        if record.get("pid") is not None and record.get("outcome") in ("running", "ready"):
            out.append(record)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ab_on_two_slots_finds_the_slow_slot_and_no_difference(tmp_path: Path) -> None:
    state = tmp_path / "sim8"
    port = _two_free_ports()
    profile = _profile(tmp_path, state, port)
    data = tmp_path / "data"
    env = {**os.environ, DATA_DIR_ENV: str(data)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "ab", str(profile), "--slots", "2", "--a", "", "--b", "",
         "--launches", "4", "--trials", "1", *SMALL, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    together: list[list[dict[str, object]]] = []  # every look that saw both slots' servers at once

    def look() -> bool:
        live = [r for r in _live_records(state) if isinstance(r.get("pid"), int) and _alive(int(r["pid"]))]  # type: ignore[arg-type]
        if len(live) > 1:
            together.append(live)
        return proc.poll() is not None

    try:
        wait_until(look, timeout=400, what="ab --slots 2 to finish", interval=0.1)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert together, "the two slots' servers never ran at the same time"
        for live in together:
            gpus = [g for r in live for g in r["gpus"]]  # type: ignore[attr-defined]
            ports = [r["port"] for r in live]
            assert len(gpus) == len(set(gpus)) and len(ports) == len(set(ports)), live
            assert {tuple(r["gpus"]) for r in live} <= {(0, 1), (2, 3)}, live  # type: ignore[arg-type]
        result = json.loads(out)
        cross = result["crossover"]
        assert cross["launch_slots"] == [[0, 1, 0, 1], [1, 0, 1, 0]]
        seen = {"crossover": cross, "launch_values": [a["launch_values"] for a in result["arms"]]}
        assert SLOW - 0.08 < cross["slot_ratio"] < SLOW + 0.08, seen  # slot 1 (GPUs 2, 3) is the slower one
        assert cross["slot_significant"] and cross["slot_ci"][1] < 1.0, seen
        # A == B: the 20% slot does not leak into B/A (balanced: the ratio is the plain one; 0.12 is ~3.4 of its se
        # on this machine, where a slot leaking into one arm would put it near 0.8 or 1.25)
        assert cross["naive_ratio"] == pytest.approx(cross["ratio"], abs=1e-4), seen
        assert abs(result["ratio"] - 1.0) < 0.12, seen
        assert "slot 1 runs" in result["verdict"] and "slower than slot 0" in result["verdict"], result["verdict"]
        assert "slot 1 (GPUs 2,3" in err and "confirmed free" in err, err
        # afterwards: slot 0 (the profile's GPUs and port) keeps running, slot 1's server is gone
        live = [r for r in _live_records(state) if _alive(int(r["pid"]))]  # type: ignore[arg-type]
        assert [(r["gpus"], r["port"]) for r in live] == [([0, 1], port)], live
        with HistoryStore(data / "history.sqlite3") as store:
            run = store.run(result["run_id"])
            assert run is not None
            slots = [(ln.arm_idx, ln.launch_idx, ln.flags["slot"]["gpus"]) for ln in run.launches]
            assert sorted(slots) == [(0, 0, [0, 1]), (0, 1, [2, 3]), (0, 2, [0, 1]), (0, 3, [2, 3]),
                                     (1, 0, [2, 3]), (1, 1, [0, 1]), (1, 2, [2, 3]), (1, 3, [0, 1])]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_launched(state)


def test_too_few_free_gpus_is_bad_input_and_launches_nothing(make_profile: MakeProfile, sim_state: Path,
                                                              tmp_path: Path) -> None:
    profile = make_profile()  # the default simulated host: 2 GPUs, so one slot of 2
    env = {**os.environ, DATA_DIR_ENV: str(tmp_path / "data")}
    for slots, says in (("2", "--slots 2 needs 2 sets of 2 adjacent free GPUs; 1 fit"), ("3", "1 slot or 2")):
        done = subprocess.run([sys.executable, "-m", "app", "ab", str(profile), "--slots", slots, "--a", "",
                               "--b", "", *SMALL], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr, done.stderr
    assert _live_records(sim_state) == []  # refused before anything was launched
