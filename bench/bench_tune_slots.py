"""Issue 21 item 5 on the real simulator: `tunedash tune --slots 4` against `--slots 1`, the same space, same run.

The profile: profiles/demo-8gpu.toml (8 simulated H200s at TP 2 = 4 slots, GPUs 6-7 4% slower) with a bench-only
[tune] table written into a temp dir: speculative steps 1, 2 and 4 (draft tokens follow the steps) x the `g` toggle
off/on (the piecewise CUDA graph kept on; `--no-graph`: steps only) = 6 candidates, at two request shapes whose true
best is clear in the sim's speed model (app/sim/speed_model.toml): 1 stream at a short context, where 4 steps with
the graph lead the next (2 steps with it, 4 without) by 12-16%, and 32 streams at an 8K context, where 1 step with
the graph leads 1 step without by ~5% and 2 steps by ~13%; a fixed budget of --launches (default 12: 2 per
candidate, so both arms spend it all and the wall times compare the same work). Each repetition runs both arms, in
alternating order, each on a fresh simulated host and history; every server is killed after each run.

The true speeds come from the sim itself: each candidate's command line (the profile's flags with the overrides the
tune's JSON lists for it) goes through the sim's own flag parser and
resolver (app.sim.server_args) into app.sim.speed.SpeedModel.mean_stream_tok_s at the shape's concurrency and mean
context (input + output / 2), launch noise off. Printed per arm per rep: the winner per shape (the leader, else the
front), whether it is the true best (within 2% of the best true speed), whether the board separated it; per rep
"same answers" = at every shape both arms picked the same winner or both are within 2% of the true best; then the
median wall times and the ratio slots-4 / slots-1 (the goal: <= 0.35x), and the machine's load average before and
after (the CPU is shared: the sim's servers are Python processes).

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

from app.core.measure.experiment import parse_arm  # noqa: E402
from app.core.profiles.loading import load_profile  # noqa: E402
from app.sim.server_args import load_models, parse, resolve  # noqa: E402
from app.sim.sglang import speed_config  # noqa: E402
from app.sim.speed import SpeedModel, load_params  # noqa: E402
from app.sim.versions import current_version  # noqa: E402
from tests.helpers import kill_launched  # noqa: E402  (the sim's own clean-up: every job record's group)
from tests.slot_helpers import write_8gpu_profile  # noqa: E402  (demo-8gpu's host with a [tune] of the bench's)

TOLERANCE = 0.02  # "the true best" = within 2% of the best true speed at the shape
H200_MIB = 143771  # app/sim/gpu_models.py
STEPS = (1, 2, 4)
SHAPES = ({"concurrency": 1, "input_len": 256, "output_len": 64, "requests": 2},
          {"concurrency": 32, "input_len": 8000, "output_len": 32, "requests": 32})

TUNE = """
[bench]
concurrency = 1
requests = 2
input_len = 256
output_len = 64
warmup = 0
[tune]
shapes = [{shapes}]
max_launches = {launches}
advisor_seeds = false
[tune.flags]
speculative-num-steps = [{steps}]
{toggles}"""


def tune_text(launches: int, graph: bool) -> str:
    """The bench's [bench] and [tune] tables (module docstring)."""
    shapes = ", ".join("{ " + ", ".join(f"{k} = {v}" for k, v in sh.items()) + " }" for sh in SHAPES)
    toggles = '[tune.toggles]\ng = ["off", "on"]\n' if graph else ""
    return TUNE.format(launches=launches, shapes=shapes, toggles=toggles, steps=", ".join(str(x) for x in STEPS))


def flags_of(overrides: str) -> dict[str, Any]:
    """The profile's flags with a candidate's overrides ("F=V F=V !F", as the tune's JSON lists them), read as
    `tunedash ab --a` reads an arm's (app.core.measure.experiment.parse_arm)."""
    return dict(parse_arm(load_profile(REPO / "profiles" / "demo-8gpu.toml"), overrides, "candidate").profile.flags)


def true_speeds(overrides: str) -> dict[str, float]:
    """Shape (keyed by its concurrency) -> the sim's true output tok/s per stream of a candidate, launch noise off:
    its command line through the sim's own flag parser and resolver into the speed model."""
    argv = ["--model-path", "sim/qwen3.6-27b"]
    for k, v in flags_of(overrides).items():
        if v is True:
            argv.append(f"--{k}")
        elif v is not False:
            argv += [f"--{k}", str(v)]
    version = current_version()
    model = load_models()["sim/qwen3.6-27b"]
    params = {**load_params(), "launch_sigma": 0.0}
    speed = SpeedModel(speed_config(resolve(parse(argv, version), model, H200_MIB, version), model), params, seed=0)
    return {str(sh["concurrency"]): speed.mean_stream_tok_s(sh["concurrency"], sh["input_len"] + sh["output_len"] / 2)
            for sh in SHAPES}


def truth_of(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Candidate label -> its true speeds per shape, for every candidate the tune listed."""
    return {c["label"]: true_speeds(str(c["overrides"])) for c in data["candidates"]}


def answers(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per shape (keyed by concurrency): the winner (leader, else front), whether it is the true best (within 2% of
    the best candidate's true speed) and whether the board separated it (a leader not tied)."""
    truth = truth_of(data)
    out: dict[str, dict[str, Any]] = {}
    for b in data["shapes"]:
        key = str(b["concurrency"])
        winner = b["leader"] or b["front"]
        best = max(speeds[key] for speeds in truth.values())
        out[key] = {"winner": winner, "true_best": truth[winner][key] >= (1 - TOLERANCE) * best,
                    "separated": bool(b["leader"]) and not b["tied"]}
    return out


def same_answers(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> bool:
    """Both arms pick the same winner, or both a true best, at every shape."""
    return all(a[k]["winner"] == b[k]["winner"] or (a[k]["true_best"] and b[k]["true_best"]) for k in a)


def one(slots: int, launches: int, port: int, graph: bool) -> tuple[float, dict[str, Any], int]:
    """(wall s, the tune's JSON, launches spent) of one `tune --slots N` on a fresh sim host and history."""
    with tempfile.TemporaryDirectory(prefix="bench-slots-") as tmp:
        root = Path(tmp)
        profile, state = write_8gpu_profile(root, tune_text(launches, graph), name="bench-slots", port=port)
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
        return wall, data, int(data["launches"]["spent"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--launches", type=int, default=12)
    ap.add_argument("--port", type=int, default=34100)
    ap.add_argument("--no-graph", dest="graph", action="store_false",
                    help="steps only (3 candidates), without the graph toggle g off/on (6 candidates)")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    walls: dict[int, list[float]] = {1: [], 4: []}
    per_launch: dict[int, list[float]] = {1: [], 4: []}
    right = {1: 0, 4: 0}
    separated = {1: 0, 4: 0}
    agree = 0
    printed = False
    for rep in range(args.reps):
        order = (1, 4) if rep % 2 == 0 else (4, 1)
        got: dict[int, dict[str, dict[str, Any]]] = {}
        for slots in order:
            wall, data, spent = one(slots, args.launches, args.port, args.graph)
            if not printed:
                printed = True
                for label, speeds in truth_of(data).items():
                    print(f"true tok/s per stream of {label}: " + ", ".join(f"c{k} {v:.2f}" for k, v in speeds.items()),
                          flush=True)
            walls[slots].append(wall)
            per_launch[slots].append(wall / max(spent, 1))
            got[slots] = answers(data)
            right[slots] += sum(a["true_best"] for a in got[slots].values())
            separated[slots] += sum(a["separated"] for a in got[slots].values())
            words = "; ".join(f"c{k}: {a['winner']} ("
                              f"{'true best' if a['true_best'] else 'NOT the true best'}, "
                              f"{'separated' if a['separated'] else 'not separated'})" for k, a in got[slots].items())
            aa = f"; slots A/A: {data['slots']['aa']}" if "slots" in data else ""
            print(f"rep {rep + 1} --slots {slots}: {wall:.1f} s, {spent} launches; {words}{aa}", flush=True)
        same = same_answers(got[1], got[4])
        agree += same
        print(f"rep {rep + 1}: same answers: {'yes' if same else 'NO'}", flush=True)
    m1, m4 = statistics.median(walls[1]), statistics.median(walls[4])
    n = args.reps * len(SHAPES)
    print(f"median wall: --slots 1 {m1:.1f} s, --slots 4 {m4:.1f} s; ratio {m4 / m1:.2f}x (goal <= 0.35x)")
    p1, p4 = statistics.median(per_launch[1]), statistics.median(per_launch[4])
    print(f"median wall per launch spent: --slots 1 {p1:.1f} s, --slots 4 {p4:.1f} s; ratio {p4 / p1:.2f}x "
          "(the arms may stop after different launch counts)")
    print(f"true best per shape: --slots 1 {right[1]}/{n}, --slots 4 {right[4]}/{n}; separated: --slots 1 "
          f"{separated[1]}/{n}, --slots 4 {separated[4]}/{n}; same answers in {agree}/{args.reps} reps")
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
