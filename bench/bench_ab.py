"""A/A honesty on recorded launches: the old design (one launch per arm, trial-level interval) against the new
(launches as the unit), on the same pool of launches recorded live from the simulated demo server.

1. Record: one live experiment of --pool-launches launches (half per arm, both arms the demo profile as is,
   interleaved), --trials trials per launch, the simulator's launch-to-launch variance on (launch_sigma 3%).
2. Resample --aa A/A experiments (fixed seed) from that pool and count the share that claims a difference:
   - old design: one launch per arm, its --trials trials, Welch delta-method interval on the trials
     (stats.ratio_stats; what `tunedash ab` did before launches were the unit);
   - new design: --launches launches per arm drawn without replacement, the pooled t interval on log launch
     means (stats.launch_ratio_stats).
   Then the same over 4000 resamples, for a figure with less binomial noise. Target <= 5%.
The live A/A and the power of the new design: bench/bench_aa_live.py.

Run: .venv/bin/python bench/bench_ab.py [--pool-launches 24] [--aa 40] [--port 31030]
     .venv/bin/python bench/bench_ab.py --pool-jsonl A.jsonl B.jsonl   (the launches of bench_aa_live.py's A/A)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_common import bench_spec, close, demo_copy, design_options, lifecycle, share

from app.core.measure.experiment import Experiment, ExperimentSpec, parse_arm
from app.core.measure.stats import launch_ratio_stats, ratio_stats


def _claims(pool: list[list[float]], rng: random.Random, runs: int, launches: int) -> tuple[int, int]:
    """(old design's claims, new design's claims) over `runs` A/A experiments resampled from the pool."""
    old = new = 0
    for _ in range(runs):
        one_a, one_b = rng.sample(pool, 2)
        old += ratio_stats(one_a, one_b).significant
        draw = rng.sample(pool, 2 * launches)
        new += launch_ratio_stats(draw[:launches], draw[launches:]).significant
    return old, new


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool-launches", type=int, default=24, help="launches to record (half per arm)")
    ap.add_argument("--aa", type=int, default=40, help="A/A experiments resampled from the pool")
    ap.add_argument("--pool-file", type=Path, help="read the pool (JSON list of launches) instead of recording")
    ap.add_argument("--pool-jsonl", type=Path, nargs="+", metavar="JSONL",
                    help="take the pool from bench_aa_live.py --jsonl files: every launch of their A/A experiments")
    design_options(ap, port=31030)
    args = ap.parse_args()
    if args.pool_file:
        pool = [[float(v) for v in launch] for launch in json.loads(args.pool_file.read_text())]
    elif args.pool_jsonl:
        records = [json.loads(line) for path in args.pool_jsonl for line in path.read_text().splitlines() if line]
        pool = [[float(v) for v in launch] for r in records if r.get("kind") == "A/A" for arm in r["arms"]
                for launch in arm["launch_trials"] if len(launch) == args.trials]
    else:
        profile, state = demo_copy(args)
        life = lifecycle(profile)
        try:
            spec = ExperimentSpec([parse_arm(profile, "", "A"), parse_arm(profile, "", "B")], args.trials,
                                  bench_spec(args, seed=7), launches=max(1, args.pool_launches // 2),
                                  ready_timeout_s=120)
            result = await Experiment(spec, life).run()
        finally:
            await close(life, state)
        pool = [launch for arm in result.arms for launch in arm.launches if len(launch) == args.trials]
    if len(pool) < 2 * args.launches:
        raise SystemExit(f"the pool has {len(pool)} launches; need at least {2 * args.launches}")
    rng = random.Random(2024)
    old, new = _claims(pool, rng, args.aa, args.launches)
    many = 4000
    old_many, new_many = _claims(pool, rng, many, args.launches)
    means = [sum(launch) / len(launch) for launch in pool]
    grand = sum(means) / len(means)
    spread = (sum((m - grand) ** 2 for m in means) / (len(means) - 1)) ** 0.5 / grand
    within = (sum((v - sum(ln) / len(ln)) ** 2 for ln in pool for v in ln)
              / sum(len(ln) - 1 for ln in pool)) ** 0.5 / grand
    print(f"pool: {len(pool)} launches x {args.trials} trials ({args.requests} requests at concurrency "
          f"{args.concurrency}, {args.max_tokens} tokens); launch CV {100 * spread:.2f}%, trial CV {100 * within:.2f}%")
    print(f"A/A, old design (1 launch x {args.trials} trials per arm, trial-level interval): "
          f"{share(old, args.aa)}; over {many} resamples {share(old_many, many)}")
    print(f"A/A, new design ({args.launches} launches x {args.trials} trials per arm, launch-level interval): "
          f"{share(new, args.aa)}; over {many} resamples {share(new_many, many)}")
    if old_many:
        print(f"ratio new/old false-positive share (4000 resamples): {new_many / old_many:.2f}")
    print("pool:", json.dumps([[round(v, 3) for v in launch] for launch in pool]))


if __name__ == "__main__":
    asyncio.run(main())
