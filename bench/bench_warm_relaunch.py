"""Relaunch wall time, cold vs warm, at the seed model's real phase times (issue 20), on the simulated 0.5.23.

One run: the demo-warm profile (TUNEDASH_SIM_TIMING=seed: weights 31.1 s, verify/decode graph 12.4 s, prefill
graph 3.9 s) relaunched N times cold (warm = false) and N times warm (the weight cache daemon kept), each relaunch
a flag change that keeps the cache key (the prefill graph toggled: `g r`; SGLang 0.5.23 refuses the weight cache
with speculation, so the seed's `s s r` has no warm form). Prints each relaunch's wall time and phases, the
medians, the ratio cold / warm, and the goal: warm <= capture + warmup + 3 s.

Run: .venv/bin/python bench/bench_warm_relaunch.py [--cycles 5]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import socket
import statistics
import tempfile
import time
from pathlib import Path

from app.connect import host_for
from app.core.data import ServerState
from app.core.profiles.loading import resolve_profile
from app.core.profiles.types import Profile
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.smi import telemetry_for
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


async def run_arm(profile: Profile, cycles: int) -> list[tuple[float, dict[str, float]]]:
    host = host_for(profile)
    lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
    await lifecycle.launch()
    assert await lifecycle.wait_ready(400) == ServerState.READY
    out = []
    for i in range(1, cycles + 1):
        t0 = time.monotonic()
        state = await lifecycle.relaunch(toggled(profile, i), ready_timeout_s=400)
        wall = time.monotonic() - t0
        assert state == ServerState.READY, state
        times = lifecycle.phase_times
        out.append((wall, times))
        print(f"  {'warm' if profile.warm else 'cold'} relaunch {i}: {wall:.1f} s  "
              + " ".join(f"{k} {v:.1f}" for k, v in times.items()), flush=True)
    if profile.warm:
        await lifecycle.kill_all()
    else:
        await lifecycle.kill(confirm_free=True)
    await lifecycle.close()
    await host.close()
    return out


async def main(cycles: int) -> None:
    base = resolve_profile("demo-warm")
    results = {}
    for warm in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            state = Path(tmp) / "sim"
            reset_state(state)
            profile = dataclasses.replace(base, port=free_port(), sim_state=state, warm=warm)
            results[warm] = await run_arm(profile, cycles)
    cold = statistics.median(w for w, _ in results[False])
    warm_wall = statistics.median(w for w, _ in results[True])
    capture = statistics.median(t.get("capture", 0.0) for _, t in results[True])
    warmup = statistics.median(t.get("warmup", 0.0) for _, t in results[True])
    print(f"cold relaunch median {cold:.1f} s, warm relaunch median {warm_wall:.1f} s, ratio {cold / warm_wall:.2f}x")
    goal = capture + warmup + 3.0
    print(f"goal warm <= capture {capture:.1f} + warmup {warmup:.1f} + 3 s = {goal:.1f} s: "
          f"{'met' if warm_wall <= goal else 'missed'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cycles", type=int, default=5)
    asyncio.run(main(parser.parse_args().cycles))
