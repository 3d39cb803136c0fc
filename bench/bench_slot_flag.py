"""The "slots differ" flag's false-positive rate on equal slots (issue 21 item 5; docs/decisions.md "Tune: slots as
a blocking factor"): N A/A races of 8 identical candidates over 4 equal slots, as bench_tune.py's A/A runs them
(its Launcher and run_slot_race, 24-launch budget), the flag read at the race's end; or with --fixed, the same
launches on a fixed design (each candidate 3 launches on slots (i + r) % 4, no race choosing who is next).
Prints the count and its Wilson 95% interval against the stated 5%.

    .venv/bin/python bench/bench_slot_flag.py --races 1000 [--fixed] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_tune as bt

from app.core.measure.stats import wilson_interval
from app.core.tune.obs import Obs
from app.core.tune.race import RaceRule
from app.core.tune.slots_stats import estimate_slot_effects


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--races", type=int, default=1000)
    ap.add_argument("--fixed", action="store_true", help="a fixed design instead of the race")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    params = bt.load_params()
    rng = random.Random(args.seed)
    names = [f"same{i}" for i in range(8)]
    same = bt.candidates()["s3-g-o"]
    space = {c: same for c in names}
    rule = RaceRule(confidence=0.95, max_launches=3 * len(names))
    hits = 0
    t0 = time.perf_counter()
    for _ in range(args.races):
        launcher = bt.Launcher(space, params, bt.SHAPES, 3, random.Random(rng.getrandbits(63)))
        if args.fixed:
            obs = [Obs(c, s, r, v, (i + r) % 4) for i, c in enumerate(names) for r in range(3)
                   for s, v in launcher.launch(c).items()]
            fx = estimate_slot_effects(obs)
        else:
            fx = bt.run_slot_race(names, launcher, bt.SHAPES, rule, [1.0] * 4, 46.0)[2].slots
        hits += fx is not None and fx.significant
    lo, hi = wilson_interval(hits, args.races)
    print(f"'slots differ' on 4 equal slots, {'fixed design' if args.fixed else 'race'}: {hits} of {args.races} "
          f"({hits / args.races:.1%}, Wilson 95% {lo:.1%}-{hi:.1%}; stated: 5%) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
