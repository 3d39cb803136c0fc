"""Relaunch wall time, cold vs warm, at the seed model's real phase times (issue 20), on the simulated 0.5.23.

One run: the demo-warm profile (TUNEDASH_SIM_TIMING=seed: weights 31.1 s, verify/decode graph 12.4 s, prefill
graph 3.9 s) relaunched N times cold (warm = false) and N times warm (the weight cache daemon kept), each relaunch
a flag change that keeps the cache key (the prefill graph toggled: `g r`; SGLang 0.5.23 refuses the weight cache
with speculation, so the seed's `s s r` has no warm form). Prints each relaunch's wall time and phases, the
medians, the ratio cold / warm, and the goal: warm <= capture + warmup + 3 s. With --ab, also the wall time of
`tunedash ab PROFILE --launches 2` (prefill graph auto vs breakable), cold vs warm, in the same run.

With --kill-rounds N, first N rounds of launch, engine kill (-> WARM) and kill all (-> FREE) at a short startup,
each state's time after the simulated driver's last release (target 20 ms on the sim's NVML-like path).

Run: .venv/bin/python bench/bench_warm_relaunch.py [--cycles 5] [--ab] [--kill-rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.connect import host_for
from app.core.data import ServerState
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import resolve_profile
from app.core.profiles.types import Profile
from app.core.server.events import LifecycleEvent, StateChanged
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.smi import telemetry_for
from app.sim.gpu_state import released_log
from app.sim.host_env import reset_state

PREFILL = "cuda-graph-backend-prefill"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toggled(profile: Profile, i: int) -> Profile:
    flags = dict(profile.flags)
    if i % 2:
        flags[PREFILL] = "breakable"
    else:
        flags.pop(PREFILL, None)
    return dataclasses.replace(profile, flags=flags)


AFTER_RELEASE: dict[str, list[float]] = {"WARM": [], "FREE": []}  # state -> seconds after the driver's last release


def after_release(state: Path, since: float, at: float, names: str) -> float | None:
    """Seconds from the simulated driver's last release (of records named `names`...) since `since` to `at`."""
    times = [r["released_at"] for r in released_log(state) if r["released_at"] >= since and r["name"].startswith(names)]
    return at - max(times) if times else None


async def run_arm(profile: Profile, cycles: int, history: Path) -> list[tuple[float, dict[str, float]]]:
    host = host_for(profile)
    lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
    lifecycle.phases.store_factory = lambda: HistoryStore(history)  # the ETA of each relaunch, from the last one
    entered: dict[ServerState, float] = {}

    def listen(event: LifecycleEvent) -> None:
        if isinstance(event, StateChanged):
            entered[event.state] = event.at

    lifecycle.subscribe(listen)
    assert profile.sim_state is not None
    await lifecycle.launch()
    assert await lifecycle.wait_ready(400) == ServerState.READY
    out = []
    for i in range(1, cycles + 1):
        t0 = time.monotonic()
        since = time.time()
        relaunch = asyncio.ensure_future(lifecycle.relaunch(toggled(profile, i), ready_timeout_s=400))
        await asyncio.sleep(0.5)  # the plan is read in a thread right after the relaunch begins
        first = lifecycle.phases.progress()
        eta = None if first is None or first.eta_s is None else first.eta_s + first.elapsed_s
        state = await relaunch
        if profile.warm and ServerState.WARM in entered:
            gap = after_release(profile.sim_state, since, entered[ServerState.WARM], "sglang::")
            if gap is not None:
                AFTER_RELEASE["WARM"].append(gap)
        wall = time.monotonic() - t0
        assert state == ServerState.READY, state
        times = lifecycle.phase_times
        out.append((wall, times))
        print(f"  {'warm' if profile.warm else 'cold'} relaunch {i}: {wall:.1f} s  "
              + " ".join(f"{k} {v:.1f}" for k, v in times.items())
              + (f"  (ETA at 0.5 s: {eta:.1f} s)" if eta is not None else "  (no ETA: no earlier run of this config)"),
              flush=True)
        await asyncio.sleep(0.3)  # the saved line lands after the record write
        if lifecycle.phases.saved:
            print(f"    event log: {lifecycle.phases.saved}", flush=True)
    if profile.warm:
        since = time.time()
        await lifecycle.kill_all()
        gap = after_release(profile.sim_state, since, entered[ServerState.FREE], "")
        if gap is not None:
            AFTER_RELEASE["FREE"].append(gap)
    else:
        await lifecycle.kill(confirm_free=True)
    await lifecycle.close()
    await host.close()
    return out


async def kill_rounds(rounds: int) -> None:
    """Engine kill -> WARM and kill all -> FREE, each after the simulated driver's last release, `rounds` times on
    demo-warm at a short startup (2 s, not the seed's: only the release is measured): launch, kill, kill all."""
    base = resolve_profile("demo-warm")
    gaps: dict[str, list[float]] = {"WARM": [], "FREE": []}
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "sim"
        reset_state(state)
        profile = dataclasses.replace(base, port=free_port(), sim_state=state, env={"TUNEDASH_SIM_STARTUP_S": "2"})
        host = host_for(profile)
        lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
        entered: dict[ServerState, float] = {}

        def listen(event: LifecycleEvent) -> None:
            if isinstance(event, StateChanged):
                entered[event.state] = event.at

        lifecycle.subscribe(listen)
        for i in range(rounds):
            await lifecycle.launch()
            assert await lifecycle.wait_ready(120) == ServerState.READY
            since = time.time()
            await lifecycle.kill(confirm_free=True)
            assert lifecycle.state == ServerState.WARM, lifecycle.state
            warm = after_release(state, since, entered[ServerState.WARM], "sglang::")
            since = time.time()
            await lifecycle.kill_all()
            assert lifecycle.state == ServerState.FREE, lifecycle.state
            free = after_release(state, since, entered[ServerState.FREE], "")
            if warm is not None:
                gaps["WARM"].append(warm)
            if free is not None:
                gaps["FREE"].append(free)
            nan = float("nan")
            print(f"  round {i + 1}: WARM {(warm or nan) * 1000:.0f} ms, FREE {(free or nan) * 1000:.0f} ms after the "
                  "driver's last release", flush=True)
        await lifecycle.close()
        await host.close()
    for name, values in gaps.items():
        if values:
            print(f"{name}: median {statistics.median(values) * 1000:.0f} ms after the driver's last release "
                  f"(min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f}, {len(values)} rounds); target 20 ms")


def ab_wall(warm: bool) -> float:
    """`tunedash ab` on a copy of demo-warm (its own state folder and port), warm or cold: its wall time."""
    source = Path(__file__).resolve().parents[1] / "profiles" / "demo-warm.toml"
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "sim"
        reset_state(state)
        text = source.read_text().replace('sim_state = "~/.cache/tunedash/sim-warm"', f'sim_state = "{state}"')
        text = text.replace("port = 30024", f"port = {free_port()}")
        text = text.replace("warm = true", f"warm = {str(warm).lower()}")
        path = Path(tmp) / "ab.toml"
        path.write_text(text)
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "app", "ab", str(path), "--a", "", "--b",
                               f"{PREFILL}=breakable", "--launches", "2", "--trials", "1", "--requests", "8",
                               "--ready-timeout", "400"], capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        subprocess.run([sys.executable, "-m", "app", "kill", str(path), "--all", "--take-over"], capture_output=True,
                       check=False)
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
        return wall


async def main(cycles: int, ab: bool, rounds: int = 0) -> None:
    if rounds:
        await kill_rounds(rounds)
        if cycles == 0 and not ab:
            return
    if ab:
        cold_ab, warm_ab = ab_wall(False), ab_wall(True)
        print(f"tunedash ab --launches 2: cold {cold_ab:.1f} s, warm {warm_ab:.1f} s, ratio {cold_ab / warm_ab:.2f}x",
              flush=True)
        if cycles == 0:
            return
    base = resolve_profile("demo-warm")
    results = {}
    history = Path(tempfile.mkdtemp(prefix="bench-warm-")) / "history.sqlite3"  # cold runs first: "instead of"
    for warm in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            state = Path(tmp) / "sim"
            reset_state(state)
            profile = dataclasses.replace(base, port=free_port(), sim_state=state, warm=warm)
            results[warm] = await run_arm(profile, cycles, history)
    cold = statistics.median(w for w, _ in results[False])
    warm_wall = statistics.median(w for w, _ in results[True])
    capture = statistics.median(t.get("capture", 0.0) for _, t in results[True])
    warmup = statistics.median(t.get("warmup", 0.0) for _, t in results[True])
    print(f"cold relaunch median {cold:.1f} s, warm relaunch median {warm_wall:.1f} s, ratio {cold / warm_wall:.2f}x")
    goal = capture + warmup + 3.0
    print(f"goal warm <= capture {capture:.1f} + warmup {warmup:.1f} + 3 s = {goal:.1f} s: "
          f"{'met' if warm_wall <= goal else 'missed'}")
    for name, gaps in AFTER_RELEASE.items():
        if gaps:
            print(f"{name} {statistics.median(gaps) * 1000:.0f} ms after the driver's last release (median of "
                  f"{len(gaps)}; the sim's release watch, app/core/telemetry's pace)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--ab", action="store_true", help="also time `tunedash ab --launches 2`, cold vs warm")
    parser.add_argument("--kill-rounds", type=int, default=0,
                        help="first: engine kill -> WARM and kill all -> FREE after the last release, N rounds")
    options = parser.parse_args()
    asyncio.run(main(options.cycles, options.ab, options.kill_rounds))
