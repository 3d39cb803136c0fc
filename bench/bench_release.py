"""Kill -> FREE on a real GPU: tunedash's confirm-free against the driver's own release, seen by NVML.

Each round launches profiles/gpu-hog.toml (a torch process per GPU holding --mib MiB) through
ServerLifecycle, the code `tunedash launch --wait` and `tunedash kill --confirm-free` run, waits for READY,
then kills it with confirm-free. Beside it a separate process polls NVML every --poll-ms (5 ms): v2
memory.used and the compute-process list of the profile's GPUs, with wall-clock times. Per round:

    group gone     SIGTERM sent (KILLING) -> the process group has left (RELEASING)
    driver free    SIGTERM sent -> NVML shows memory.used <= baseline + 64 MiB and no process, on every GPU
    pid gone       SIGTERM sent -> the last pid left NVML's process list
    tunedash FREE  SIGTERM sent -> tunedash declared FREE (two consecutive free readings)
    lag            tunedash FREE - driver free

It prints the median and range of each for every telemetry source (--sources smi,nvml: the CLI's
nvidia-smi sampler and the in-process NVML one), the ratio FREE / driver free, and the manual habit
`kill; sleep 3; nvidia-smi` (3 s plus one nvidia-smi call, timed in the same run) for comparison.

Run on a GPU host (needs torch and nvidia-ml-py):
    python3 bench/bench_release.py [--rounds 5] [--mib 8192] [--gpus 0] [--sources smi,nvml] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.connect import host_for
from app.core.data import ServerState
from app.core.profiles.loading import apply_overrides, load_profile
from app.core.server.events import LifecycleEvent, StateChanged
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.freecheck import DEFAULT_TOLERANCE_MIB
from app.core.telemetry.smi import telemetry_for

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20


# ---- the side poller (a separate process, so tunedash's own work cannot delay it) ---------------------
def poll(gpus: list[int], period_ms: float, out: Path) -> None:
    """Record every change of (v2 used MiB, compute pids) per GPU with time.time(), until SIGTERM."""
    import pynvml as nv

    nv.nvmlInit()
    handles = {g: nv.nvmlDeviceGetHandleByIndex(g) for g in gpus}
    changes: list[dict[str, Any]] = []
    last: dict[int, tuple[int, tuple[int, ...]]] = {}
    samples = 0
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop:
        now = time.time()
        for gpu, handle in handles.items():
            used = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2).used // MIB
            pids = tuple(sorted(p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)))
            if last.get(gpu) != (used, pids):
                last[gpu] = (used, pids)
                changes.append({"t": now, "gpu": gpu, "used_mib": used, "pids": list(pids)})
        samples += 1
        time.sleep(period_ms / 1000)
    nv.nvmlShutdown()
    out.write_text(json.dumps({"samples": samples, "period_ms": period_ms, "changes": changes}))


# ---- the rounds ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Round:
    source: str
    marks: dict[str, float]  # state name -> time.time() of the first StateChanged into it
    free_confirmed: bool


async def one_round(profile_path: Path, mib: int, source: str, state_dir: str) -> Round:
    profile = apply_overrides(load_profile(profile_path), [f"mib={mib}"], [])
    host = host_for(profile)
    host._state_dir = state_dir  # type: ignore[attr-defined]  # a private job folder for the bench
    lifecycle = ServerLifecycle(host, profile, telemetry_for(host, source, tuple(profile.gpus)),
                                grace_s=15.0, free_timeout_s=60.0)
    marks: dict[str, float] = {}

    def listener(event: LifecycleEvent) -> None:
        if isinstance(event, StateChanged):
            marks.setdefault(event.state.value, time.time())

    lifecycle.subscribe(listener)
    await lifecycle.launch()
    state = await lifecycle.wait_ready(180)
    if state != ServerState.READY:
        raise SystemExit(f"gpu-hog did not become ready ({state.value}); last lines: {list(lifecycle.last_lines)}")
    await asyncio.sleep(1.0)  # the poller sees the loaded state
    for key in ("KILLING", "RELEASING", "FREE", "STUCK"):
        marks.pop(key, None)
    verdict = await lifecycle.kill(confirm_free=True)
    await lifecycle.close()
    await lifecycle.telemetry.close()
    await asyncio.sleep(0.5)
    return Round(source, marks, bool(verdict and verdict.confirmed))


def driver_times(changes: list[dict[str, Any]], gpus: list[int], after: float, baseline: dict[int, int]) -> tuple[
        float | None, float | None]:
    """(all GPUs free, last pid gone) as the first moments after `after` that the poller saw them."""
    state: dict[int, tuple[int, list[int]]] = {}
    free_at = pids_at = None
    for change in changes:
        state[change["gpu"]] = (change["used_mib"], change["pids"])
        if change["t"] < after or len(state) < len(gpus):
            continue
        if pids_at is None and all(not pids for _, pids in state.values()):
            pids_at = change["t"]
        if free_at is None and all(not pids and used <= baseline[g] + DEFAULT_TOLERANCE_MIB
                                   for g, (used, pids) in state.items()):
            free_at = change["t"]
    return free_at, pids_at


def smi_call_s(repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, check=False)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    low, high = min(values) * 1000, max(values) * 1000
    return f"median {statistics.median(values) * 1000:7.0f} ms  (min {low:.0f}, max {high:.0f}, n={len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=8192)
    parser.add_argument("--profile", type=Path, default=REPO / "profiles" / "gpu-hog.toml")
    parser.add_argument("--sources", default="smi,nvml")
    parser.add_argument("--poll-ms", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None, help="write every round's figures here")
    parser.add_argument("--poll", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gpus", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poll:
        poll([int(g) for g in args.gpus.split(",")], args.poll_ms, args.out)
        return 0

    gpus = list(load_profile(args.profile).gpus)
    work = Path(tempfile.mkdtemp(prefix="bench_release-"))
    poll_out = work / "poll.json"
    poller = subprocess.Popen([sys.executable, __file__, "--poll", "--gpus", ",".join(map(str, gpus)),
                               "--poll-ms", str(args.poll_ms), "--out", str(poll_out)])
    time.sleep(1.0)
    rounds: list[Round] = []
    try:
        for source in args.sources.split(","):
            for _ in range(args.rounds):
                rounds.append(asyncio.run(one_round(args.profile, args.mib, source, str(work / "state"))))
    finally:
        poller.send_signal(signal.SIGTERM)
        poller.wait(timeout=30)
    polled = json.loads(poll_out.read_text())
    changes = polled["changes"]
    baseline = {g: min((c["used_mib"] for c in changes if c["gpu"] == g and not c["pids"]), default=0) for g in gpus}
    smi_s = smi_call_s()
    print(f"gpu-hog: {len(gpus)} GPU(s) {gpus}, {args.mib} MiB per rank; NVML poller every {args.poll_ms} ms "
          f"({polled['samples']} samples); idle baseline {baseline} MiB")
    report: dict[str, Any] = {"gpus": gpus, "mib": args.mib, "baseline_mib": baseline, "smi_call_s": smi_s,
                              "rounds": []}
    for source in args.sources.split(","):
        figures: dict[str, list[float]] = {"group gone": [], "pid gone": [], "driver free": [], "tunedash FREE": [],
                                           "lag": []}
        for one in (r for r in rounds if r.source == source):
            killed = one.marks.get("KILLING")
            if killed is None:
                continue
            free_at, pids_at = driver_times(changes, gpus, killed, baseline)
            row = {"source": source, "confirmed": one.free_confirmed,
                   "group_gone_s": one.marks.get("RELEASING", killed) - killed,
                   "pid_gone_s": None if pids_at is None else pids_at - killed,
                   "driver_free_s": None if free_at is None else free_at - killed,
                   "tunedash_free_s": one.marks["FREE"] - killed if "FREE" in one.marks else None}
            report["rounds"].append(row)
            for key, name in (("group_gone_s", "group gone"), ("pid_gone_s", "pid gone"),
                              ("driver_free_s", "driver free"), ("tunedash_free_s", "tunedash FREE")):
                if row[key] is not None:
                    figures[name].append(row[key])
            if row["driver_free_s"] is not None and row["tunedash_free_s"] is not None:
                figures["lag"].append(row["tunedash_free_s"] - row["driver_free_s"])
        print(f"\ntelemetry {source}: kill (SIGTERM to the group) ->")
        for name, values in figures.items():
            print(f"  {name:14} {spread(values)}")
        if figures["driver free"] and figures["tunedash FREE"]:
            ratio = statistics.median(figures["tunedash FREE"]) / statistics.median(figures["driver free"])
            print(f"  FREE / driver free: {ratio:.2f}x")
    habit = 3.0 + smi_s
    print(f"\nmanual habit `kill; sleep 3; nvidia-smi`: {habit * 1000:.0f} ms "
          f"(one nvidia-smi call {smi_s * 1000:.0f} ms)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
