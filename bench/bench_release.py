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
nvidia-smi sampler and the in-process NVML one), each with the release watch as it was before issue 20
("before": nvidia-smi every 50 ms, NVML every 100 ms) and as it is ("after": NVML every 5 ms on this machine,
whichever the dashboard reads), --rounds of each, interleaved; the ratio FREE / driver free, and the manual habit
`kill; sleep 3; nvidia-smi` (3 s plus one nvidia-smi call, timed in the same run) for comparison.

Run on a GPU host (needs torch and nvidia-ml-py):
    python3 bench/bench_release.py [--rounds 5] [--mib 8192] [--gpus 0] [--sources smi,nvml] [--json FILE]

Without a GPU, `--sources sim,ssh` measures the same kill on the simulated host (profiles/demo), where the
driver's release is known exactly (released.jsonl `released_at`): `sim` is the simulated host itself (the release
watch reads it through its NVML-like reader), `ssh` the simulated host behind a loopback sshd (nvidia-smi's -lms
stream and the process-list loop over one kept connection; needs /usr/sbin/sshd, as root). Each source runs
--rounds "before" rounds (the watch as it was: nvidia-smi every 50 ms with a one-shot process list as often) and
--rounds "after" rounds (release_sampler_for), interleaved, in one run. Per round: last release -> FREE, and the
CPU seconds tunedash's process spent from the SIGTERM to FREE.
    .venv/bin/python bench/bench_release.py --sources sim,ssh [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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


# ---- the simulated host: before and after in one run ----------------------------------------------------
def legacy_sampler(host: Any, gpus: Any, telemetry: Any) -> Any:
    """The release watch before issue 20: nvidia-smi every 50 ms with a one-shot process list as often; NVML (the
    CLI's --source nvml) at its 100 ms floor with a process list every 50 ms."""
    from app.core.server.release import ReleaseSampler
    from app.core.telemetry.nvml import NvmlTelemetry
    from app.core.telemetry.smi import SmiTelemetry

    if isinstance(telemetry, NvmlTelemetry):
        return ReleaseSampler(NvmlTelemetry(telemetry.indices, process_interval_s=0.05), 50, "nvml-before")
    return ReleaseSampler(SmiTelemetry(host, gpus, apps_interval_s=0.05), 50, "smi-before")


@contextlib.contextmanager
def paced(pace: str) -> Iterator[None]:
    """The release watch as it was ("before") or as it is ("after") for the kills inside."""
    from app.core.server import release

    original = release.release_sampler_for
    if pace == "before":
        release.release_sampler_for = legacy_sampler
    try:
        yield
    finally:
        release.release_sampler_for = original


@dataclasses.dataclass
class SimRound:
    source: str
    pace: str  # "before" | "after"
    release_to_free_s: float
    sigterm_to_free_s: float
    cpu_s: float
    watcher: str
    samples: int


async def sim_round(lifecycle: Any, state: Path, pace: str, source: str) -> SimRound:
    from app.core.server import release
    from app.sim.gpu_state import released_log

    await lifecycle.launch()
    ready = await lifecycle.wait_ready(60)
    if ready != ServerState.READY:
        raise SystemExit(f"the simulated server did not become ready ({ready.value})")
    await asyncio.sleep(0.3)
    record = lifecycle.record
    pids = {p.pid for p in await lifecycle.host.processes() if p.pgid == record.pgid}
    marks: dict[str, float] = {}
    watchers: list[Any] = []

    def listener(event: LifecycleEvent) -> None:
        if isinstance(event, StateChanged):
            marks.setdefault(event.state.value, event.at)

    real_start = release.FreeWatch.__init__

    def remember(self: Any, *args: Any, **kwargs: Any) -> None:
        real_start(self, *args, **kwargs)
        watchers.append(self)

    release.FreeWatch.__init__ = remember  # type: ignore[method-assign]
    unsubscribe = lifecycle.subscribe(listener)
    cpu = time.process_time()
    try:
        with paced(pace):
            verdict = await lifecycle.kill(confirm_free=True)
    finally:
        release.FreeWatch.__init__ = real_start  # type: ignore[method-assign]
        if callable(unsubscribe):
            unsubscribe()
    cpu = time.process_time() - cpu
    if not (verdict and verdict.confirmed) or "FREE" not in marks:
        raise SystemExit(f"the kill did not end FREE: {verdict}")
    released = [r["released_at"] for r in released_log(state) if r["pid"] in pids]
    watch = watchers[0]
    return SimRound(source, pace, marks["FREE"] - max(released), marks["FREE"] - marks["KILLING"], cpu,
                    watch.source, watch.samples)


async def sim_rounds(source: str, rounds: int, work: Path) -> list[SimRound]:
    from app.core.hosts.ssh import SshHost
    from app.core.profiles.loading import resolve_profile
    from app.sim.host_env import reset_state, sim_environment
    from tests.helpers import free_port
    from tests.integration.sshd import running_sshd
    from tests.integration.test_ssh_cli import open_to_all

    folder = work / source
    folder.mkdir(parents=True)
    state = reset_state(folder / "sim")
    base = dataclasses.replace(resolve_profile("demo"), port=free_port(), sim_state=state, python=sys.executable,
                               env={"TUNEDASH_SIM_STARTUP_S": "0.5"})
    out: list[SimRound] = []
    if source == "sim":
        host = host_for(base)
        lifecycle = ServerLifecycle(host, base, telemetry_for(host, "smi", tuple(base.gpus)))
        for i in range(rounds * 2):
            out.append(await sim_round(lifecycle, state, ("before", "after")[i % 2], source))
        await lifecycle.close()
        return out
    open_to_all(folder)
    with running_sshd() as server:
        profile = dataclasses.replace(base, host=server.spec)
        host = SshHost(server.spec, extra_env=sim_environment(state), state_dir=str(state / "host"),
                       options=server.options())
        lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", tuple(profile.gpus)))
        try:
            for i in range(rounds * 2):
                out.append(await sim_round(lifecycle, state, ("before", "after")[i % 2], source))
        finally:
            await lifecycle.close()
            await host.close()
    return out


def sim_main(sources: list[str], rounds: int, json_out: Path | None) -> int:
    work = Path(tempfile.mkdtemp(prefix="bench_release-sim-"))
    work.chmod(0o755)  # the SSH test user reaches the simulated state through it
    results: list[SimRound] = []
    for source in sources:
        results += asyncio.run(sim_rounds(source, rounds, work))
    for source in sources:
        print(f"\n{source}: kill -> FREE on the simulated host ({rounds} rounds each, interleaved)")
        medians = {}
        for pace in ("before", "after"):
            mine = [r for r in results if r.source == source and r.pace == pace]
            free = [r.release_to_free_s for r in mine]
            medians[pace] = statistics.median(free)
            print(f"  {pace:6} ({mine[0].watcher:10}) last release -> FREE {spread(free)}")
            print(f"  {'':6} {'':12} SIGTERM -> FREE      {spread([r.sigterm_to_free_s for r in mine])}")
            cpu = [r.cpu_s for r in mine]
            samples = [r.samples for r in mine]
            print(f"  {'':6} {'':12} CPU SIGTERM -> FREE  median {statistics.median(cpu) * 1000:.0f} ms "
                  f"(min {min(cpu) * 1000:.0f}, max {max(cpu) * 1000:.0f}); samples median "
                  f"{statistics.median(samples):.0f}")
        print(f"  after / before: {medians['after'] / medians['before']:.2f}x")
    if json_out:
        json_out.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    return 0


# ---- the rounds ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Round:
    source: str
    marks: dict[str, float]  # state name -> time.time() of the first StateChanged into it
    free_confirmed: bool


async def one_round(profile_path: Path, mib: int, source: str, state_dir: str, pace: str = "after") -> Round:
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
    with paced(pace):
        verdict = await lifecycle.kill(confirm_free=True)
    await lifecycle.close()
    await lifecycle.telemetry.close()
    await asyncio.sleep(0.5)
    return Round(f"{source} {pace}", marks, bool(verdict and verdict.confirmed))


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
    parser.add_argument("--apps-loops", type=int, default=None,
                        help="sim/ssh: kept-open process-list loops of the 'after' watch (default: release's own)")
    parser.add_argument("--json", type=Path, default=None, help="write every round's figures here")
    parser.add_argument("--poll", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gpus", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poll:
        poll([int(g) for g in args.gpus.split(",")], args.poll_ms, args.out)
        return 0
    simulated = [s for s in args.sources.split(",") if s in ("sim", "ssh")]
    if simulated:
        if args.apps_loops is not None:
            from app.core.server import release

            release.SMI_APPS_LOOPS = args.apps_loops
        return sim_main(simulated, args.rounds, args.json)

    gpus = list(load_profile(args.profile).gpus)
    work = Path(tempfile.mkdtemp(prefix="bench_release-"))
    poll_out = work / "poll.json"
    poller = subprocess.Popen([sys.executable, __file__, "--poll", "--gpus", ",".join(map(str, gpus)),
                               "--poll-ms", str(args.poll_ms), "--out", str(poll_out)])
    time.sleep(1.0)
    rounds: list[Round] = []
    try:
        for source in args.sources.split(","):
            for i in range(args.rounds * 2):  # the watch before and after issue 20, interleaved
                pace = ("before", "after")[i % 2]
                rounds.append(asyncio.run(one_round(args.profile, args.mib, source, str(work / "state"), pace)))
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
    for source in [f"{s} {pace}" for s in args.sources.split(",") for pace in ("before", "after")]:
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
