"""A/B honesty and power on the simulated server.

1. Power (live): --power experiments of steps 1 vs 3 on the demo flags, 3 trials per arm, each through the
   real Experiment (relaunch per arm); counts how many find B faster with an interval above 1.
2. A/A honesty: trial values are recorded live from the simulated server (steps 1, --pool trials spread
   over several relaunches), then --aa A/A experiments (3 + 3 trials drawn without replacement, fixed
   seed) go through the same statistics engine; prints the share that claims a difference (target <= 5%).
   The A/A runs on recorded trials because 40 live A/A experiments (80 relaunches) take too long on a
   shared 2-core machine; --live-aa N also runs N live A/A experiments.

Run: .venv/bin/python bench/bench_ab.py [--power 5] [--aa 40] [--pool 30] [--live-aa 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import tempfile
from pathlib import Path

from app.connect import host_for
from app.core.measure.bench import BenchSpec
from app.core.measure.experiment import Experiment, ExperimentSpec, parse_arm
from app.core.measure.stats import ratio_stats
from app.core.profiles.loading import load_profile
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.smi import telemetry_for
from app.sim.host_env import reset_state

BENCH = BenchSpec(requests=6, concurrency=3, input_len=32, max_tokens=48, warmup=1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--power", type=int, default=5)
    ap.add_argument("--aa", type=int, default=40)
    ap.add_argument("--pool", type=int, default=30)
    ap.add_argument("--live-aa", type=int, default=0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tunedash-bench-ab-"))
    state = reset_state(tmp / "sim")
    path = tmp / "p.toml"
    path.write_text(
        f'name = "benchab"\nhost = "sim"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\nport = {free_port()}\n'
        f'gpus = [0, 1]\nsim_state = "{state}"\nenv = {{ TUNEDASH_SIM_STARTUP_S = "0.3" }}\n'
        "[flags]\ntp-size = 2\nmem-fraction-static = 0.88\nspeculative-algorithm = \"NEXTN\"\n"
        "speculative-num-steps = 1\nspeculative-eagle-topk = 1\nspeculative-num-draft-tokens = 2\n")
    profile = load_profile(path)
    host = host_for(profile)
    life = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus), grace_s=3)
    try:
        detected = 0
        for i in range(args.power):
            spec = ExperimentSpec([parse_arm(profile, "speculative-num-steps=1", "A"),
                                   parse_arm(profile, "speculative-num-steps=3", "B")], 3,
                                  BenchSpec(**{**BENCH.__dict__, "seed": i}), ready_timeout_s=60)
            result = await Experiment(spec, life).run()
            r = result.ratio()
            detected += bool(r.ci95 and r.ci95[0] > 1.0)
            print(f"power {i + 1}: B/A {r.ratio:.3f} CI {r.ci95}  {result.verdict}", flush=True)
        # record a pool of steps-1 trials across relaunches
        pool: list[float] = []
        per_launch = max(1, args.pool // 3)
        while len(pool) < args.pool:
            spec = ExperimentSpec([parse_arm(profile, "", "A"), parse_arm(profile, "", "B")], per_launch // 2 or 1,
                                  BenchSpec(**{**BENCH.__dict__, "seed": len(pool)}), ready_timeout_s=60)
            result = await Experiment(spec, life).run()
            pool += result.arms[0].values + result.arms[1].values
        live_claims = 0
        for i in range(args.live_aa):
            spec = ExperimentSpec([parse_arm(profile, "", "A"), parse_arm(profile, "", "B")], 3,
                                  BenchSpec(**{**BENCH.__dict__, "seed": 100 + i}), ready_timeout_s=60)
            live_claims += (await Experiment(spec, life).run()).ratio().significant
        rng = random.Random(2024)
        claims = 0
        for _ in range(args.aa):
            draw = rng.sample(pool, 6)
            claims += ratio_stats(draw[:3], draw[3:]).significant
        print(f"A/B power: steps 1 vs 3 detected {detected}/{args.power} with 3 trials per arm")
        print(f"A/A honesty (recorded trials, {len(pool)} trials from the sim): {claims}/{args.aa} claim a "
              f"difference = {100 * claims / max(args.aa, 1):.1f}% (target <= 5%)")
        many = 4000
        many_claims = sum(ratio_stats(*_split(rng.sample(pool, 6))).significant for _ in range(many))
        print(f"A/A honesty over {many} resampled experiments from the same pool: {100 * many_claims / many:.1f}% "
              "(the 40-experiment share is itself noisy: binomial sd ~3.4 points at 5%)")
        if args.live_aa:
            print(f"A/A live: {live_claims}/{args.live_aa} claim a difference")
        print("pool:", json.dumps([round(v, 2) for v in pool]))
    finally:
        await life.kill(confirm_free=False)
        await life.close()
        for record in (state / "host" / "jobs").glob("*.json"):
            try:
                os.killpg(json.loads(record.read_text())["pgid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError, KeyError, ValueError):
                pass


def _split(draw: list[float]) -> tuple[list[float], list[float]]:
    return draw[:3], draw[3:]


if __name__ == "__main__":
    asyncio.run(main())
