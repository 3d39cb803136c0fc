"""Live A/A honesty and A/B power of the A/B design with launches as the unit, on the simulated demo server.

A/A: --aa experiments whose two arms are the same config (the demo profile, NEXTN 1 step), each through the real
Experiment (a relaunch per launch, launches interleaved A B B A, --launches per arm of --trials trials), with the
simulator's launch-to-launch variance on (speed_model.toml launch_sigma, 3%). Prints the share that claims a
difference (target <= 5%) with its Wilson 95% interval and, as the alternative measured on the same trials, the
share the old trial-level interval (Welch on all trials of an arm, as if one launch) would have claimed.
Power: --power experiments of steps 1 vs 3, the same design: the share that finds B faster (target >= 95%).

Run (in the background; ~45 s an experiment at the defaults):
  nohup .venv/bin/python bench/bench_aa_live.py --aa 40 --power 0 --port 31010 > OUT 2>&1 &
  nohup .venv/bin/python bench/bench_aa_live.py --aa 0 --power 20 --port 31020 > OUT 2>&1 &
--jsonl FILE keeps one line per experiment (every launch's trials); --summarize FILE... prints the figures of
several such files together (e.g. two halves of the 40 A/A run side by side on two ports).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_common import bench_spec, close, demo_copy, design_options, lifecycle, median, share

from app.core.measure.experiment import Experiment, ExperimentSpec, parse_arm
from app.core.measure.stats import launch_ratio_stats, ratio_stats


def _claim(kind: str, ci: Any) -> bool:
    if not ci:
        return False
    return bool(ci[0] > 1.0 or ci[1] < 1.0) if kind == "A/A" else bool(ci[0] > 1.0)


def _claims(kind: str, data: dict[str, Any]) -> tuple[bool, bool]:
    """(the launch-level claim as the run computed it, the trial-level claim on the same trials)."""
    flat = ratio_stats(data["arms"][0]["trials"], data["arms"][1]["trials"])
    return _claim(kind, data["comparisons"][0]["ratio_ci"]), _claim(kind, flat.ci95)


def _claim_now(kind: str, data: dict[str, Any]) -> bool:
    """The launch-level claim recomputed from the stored launches with the statistics of this checkout."""
    r = launch_ratio_stats(data["arms"][0]["launch_trials"], data["arms"][1]["launch_trials"])
    return _claim(kind, r.ci95)


def summarize(records: list[dict[str, Any]]) -> None:
    """Per kind: the share that claims (with its Wilson interval), the trial-level share, medians."""
    for kind in ("A/A", "power"):
        rows = [r for r in records if r["kind"] == kind]
        if not rows:
            continue
        claims = [_claims(kind, r) for r in rows]
        n = len(rows)
        arms = [a for r in rows for a in r["arms"]]
        launch_cv = [a["launch_cv"] for a in arms if a["launch_cv"] is not None]
        trial_cv = [a["trial_cv"] for a in arms if a["trial_cv"] is not None]
        widths = [r["ratio_ci"][1] - r["ratio_ci"][0] for r in rows if r["ratio_ci"]]
        design = f"{rows[0]['arms'][0]['launches']} launches x {rows[0]['arms'][0]['trials_per_launch'][0]} trials"
        word = "claim a difference (target <= 5%)" if kind == "A/A" else "find B faster (target >= 95%)"
        print(f"\n{kind}: {n} live experiments, {design} per arm")
        print(f"  launch-level interval as run: {share(sum(c for c, _ in claims), n)} {word}")
        print(f"  launch-level interval recomputed with this checkout's stats: "
              f"{share(sum(_claim_now(kind, r) for r in rows), n)}")
        print(f"  trial-level interval on the same trials (Welch, as if one launch per arm): "
              f"{share(sum(f for _, f in claims), n)}")
        print(f"  medians: B/A {median([r['ratio'] for r in rows]):.4f}, CI width {median(widths):.4f}, launch CV "
              f"{100 * median(launch_cv):.2f}%, trial CV {100 * median(trial_cv):.2f}% (launch/trial "
              f"{median(launch_cv) / median(trial_cv):.1f}x), {median([r['seconds'] for r in rows]):.0f} s per "
              "experiment")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aa", type=int, default=40, help="live A/A experiments")
    ap.add_argument("--power", type=int, default=20, help="live steps 1 vs 3 experiments")
    ap.add_argument("--jsonl", type=Path, help="append one JSON line per experiment here")
    ap.add_argument("--summarize", type=Path, nargs="+", metavar="JSONL",
                    help="run nothing: summarize the experiments of earlier --jsonl files together")
    design_options(ap, port=31010)
    args = ap.parse_args()
    if args.summarize:
        records = [json.loads(line) for path in args.summarize for line in path.read_text().splitlines() if line]
        summarize(records)
        return
    profile, state = demo_copy(args)
    life = lifecycle(profile)
    out = args.jsonl.open("a") if args.jsonl else None
    print(f"design: {args.launches} launches x {args.trials} trials per arm, {args.requests} requests at "
          f"concurrency {args.concurrency}, {args.max_tokens} output tokens; port {args.port}", flush=True)
    records: list[dict[str, Any]] = []
    try:
        plan = [("A/A", "", "", i) for i in range(args.aa)]
        plan += [("power", "speculative-num-steps=1", "speculative-num-steps=3", i) for i in range(args.power)]
        for kind, a_text, b_text, i in plan:
            spec = ExperimentSpec([parse_arm(profile, a_text, "A"), parse_arm(profile, b_text, "B")], args.trials,
                                  bench_spec(args, seed=(1000 if kind == "A/A" else 2000) + i),
                                  launches=args.launches, ready_timeout_s=120)
            started = time.monotonic()
            result = await Experiment(spec, life).run()
            record = {"kind": kind, "i": i, "seconds": time.monotonic() - started, **result.to_json()}
            records.append(record)
            claim, flat = _claims(kind, record)
            ci = record["ratio_ci"]
            print(f"{kind} {i + 1}: B/A {record['ratio']:.4f} (95% CI {f'{ci[0]:.3f}-{ci[1]:.3f}' if ci else 'none'}) "
                  f"claim={claim} trial-level claim={flat}; launch means A {record['arms'][0]['launch_values']} "
                  f"B {record['arms'][1]['launch_values']}; {record['seconds']:.0f} s", flush=True)
            if out is not None:
                out.write(json.dumps(record) + "\n")
                out.flush()
    finally:
        await close(life, state)
        if out is not None:
            out.close()
    summarize(records)


if __name__ == "__main__":
    asyncio.run(main())
