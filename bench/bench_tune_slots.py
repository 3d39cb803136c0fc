"""Issue 21 item 5 on the real simulator: `tunedash tune --slots 4` against `--slots 1`, the same space, same run.

The profile: profiles/demo-8gpu.toml (8 simulated H200s at TP 2 = 4 slots, GPUs 6-7 4% slower) with a [tune]
table of 8 candidates (speculative steps 1-4 x single-batch overlap `o` sched/off), two request shapes (1 and 4
streams, a few short requests each: the launch's startup and release dominate, as on a real host, where a launch
costs ~46 s of weights and graphs) and a fixed budget of --launches (default 16: a two-launch grid). Each
repetition runs both, in alternating order, each on a fresh simulated host and history; every server is killed
after each run. Printed: each run's wall time, the medians, the ratio slots-4 / slots-1 (the goal: <= 0.35x), and
whether the two agree on the winner per shape (the leader, else the front: who is ahead); also the machine's
load average before and after (the CPU is shared: the sim's servers are Python processes).

    .venv/bin/python bench/bench_tune_slots.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import kill_launched  # noqa: E402  (the sim's own clean-up: every job record's group)

TUNE = """
[bench]
concurrency = 4
requests = 4
input_len = 32
output_len = 32
warmup = 0
[tune]
shapes = [{{ concurrency = 1, requests = 2 }}, {{ concurrency = 4, requests = 4 }}]
max_launches = {launches}
advisor_seeds = false
[tune.flags]
speculative-num-steps = [1, 2, 3, 4]
[tune.toggles]
o = ["sched", "off"]
"""


def profile_text(state: Path, port: int, launches: int) -> str:
    out = []
    for line in (REPO / "profiles" / "demo-8gpu.toml").read_text().splitlines():
        if line.startswith("name ="):
            line = 'name = "bench-slots"'
        elif line.startswith("sim_state ="):
            line = f'sim_state = "{state}"'
        elif line.startswith("port ="):
            line = f"port = {port}"
        elif line.startswith("[env]"):
            line = '[env]\nTUNEDASH_SIM_STARTUP_S = "0.3"'
        elif line.startswith("[bench]"):
            break
        out.append(line)
    return "\n".join(out) + "\n" + TUNE.format(launches=launches)


def _verdict(board: dict[str, Any]) -> str:
    """A shape's answer: the leader (separated, or tied with others) or who is ahead without separation."""
    if board["leader"]:
        return str(board["leader"]) + (f" (tied with {len(board['tied']) - 1})" if board["tied"] else " (separated)")
    return f"{board['front']} (ahead, not separated)"


def one(slots: int, launches: int, port: int) -> tuple[float, dict[str, str], int]:
    """(wall s, shape -> winner, launches spent) of one `tune --slots N` on a fresh sim host and history."""
    with tempfile.TemporaryDirectory(prefix="bench-slots-") as tmp:
        root = Path(tmp)
        state = root / "sim"
        profile = root / "bench-slots.toml"
        profile.write_text(profile_text(state, port, launches))
        env = {**os.environ, "TUNEDASH_DATA_DIR": str(root / "data"), "PYTHONUNBUFFERED": "1"}
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-m", "app", "tune", str(profile), "--slots", str(slots), "--json"],
                                  capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
            wall = time.monotonic() - started
        finally:
            kill_launched(state)
        if done.returncode != 0:
            raise SystemExit(f"tune --slots {slots} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        data = json.loads(done.stdout)
        winners = {s["shape"]: _verdict(s) for s in data["shapes"]}
        if "slots" in data:
            winners["slots A/A"] = data["slots"]["aa"]
        return wall, winners, int(data["launches"]["spent"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--launches", type=int, default=16)
    ap.add_argument("--port", type=int, default=34100)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    walls: dict[int, list[float]] = {1: [], 4: []}
    agree = 0
    for rep in range(args.reps):
        order = (1, 4) if rep % 2 == 0 else (4, 1)
        got: dict[int, dict[str, str]] = {}
        for slots in order:
            wall, winners, spent = one(slots, args.launches, args.port)
            walls[slots].append(wall)
            got[slots] = winners
            print(f"rep {rep + 1} --slots {slots}: {wall:.1f} s, {spent} launches, winners {winners}", flush=True)
        same = all(got[1][k] == got[4][k] for k in got[1])
        agree += same
        print(f"rep {rep + 1}: winners per shape {'agree' if same else 'differ'}", flush=True)
    m1, m4 = statistics.median(walls[1]), statistics.median(walls[4])
    print(f"median wall: --slots 1 {m1:.1f} s, --slots 4 {m4:.1f} s; ratio {m4 / m1:.2f}x (goal <= 0.35x); "
          f"winners agree in {agree}/{args.reps} reps")
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
