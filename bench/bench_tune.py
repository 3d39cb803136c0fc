"""Issue 21's tune benchmark: the racing rule (app.core.tune.race) against a one-launch and a two-launch grid.

The space: speculative steps 0..5 x piecewise CUDA graph (the `g` toggle) on/off x single-batch overlap (`o`)
on/off = 24 candidates of the demo model (sim/qwen3.6-27b, TP 2, NEXTN = EAGLE), measured at 3 request shapes
(default: 1 stream x 1K input, 32 streams x 1K, 1 stream x 50K; 128 output tokens). The speed model
(app/sim/speed.py, speed_model.toml) knows every candidate's true speed at every shape (mean_stream_tok_s).

The observations are drawn from the speed model directly, not from started servers, so 20 repetitions run in
minutes: one launch = one SpeedModel (its launch factor exp(N(0, launch_sigma)) divides every step of that launch,
at every shape, as one launched sim server does); one trial at a shape = a decode of `output_len` tokens per
stream: step times from sample_step_ms(batch, context) (per-step noise_sigma) and the mean tokens per step of the
batch's streams (acceptance drawn per step: the per-stream draws' mean, by its normal approximation). A launch's
value at a shape is the mean of its `trials` trials (3). Launch variance is on (the toml's launch_sigma, 3%;
--launch-sigma to change it).

Per repetition, on fresh draws for each method:
- race: decide() until done, one launch at a time (next[0]), min_launches 1, --max-launches (default 3 per
  candidate = the launches a one-launch grid spends when every (config, shape) point is its own launch);
- grid1: one launch per candidate, the best mean per shape wins; grid2: two launches per candidate.
Correct at a shape: the chosen config's true speed is within 2% of the true best's. Launches are counted two ways:
per config (a launch measures every shape; the vllm bench sweep way) and per point (a relaunch per (config,
shape), the SGLang auto_benchmark way). The wall time is modelled: --relaunch-s per launch (46 s: the 27B demo
loop's weights + graphs) plus each trial's decode time.
A/A: --aa races of 8 identical candidates (steps 3, graph on, overlap on) at the 3 shapes; a false positive is a
race that eliminates one or ends a shape "separated" instead of tied.

Slots (--slots N, 4 when given alone; docs/decisions.md "Tune: slots as a blocking factor"): N slots run N
launches at once in parallel rounds (decide(), then pick_slot_assignment of its `next` over the N slots, every launch
of a round ends before the next decide), the last slot --slot-bias (4%) slower: its launches' values are multiplied
by 1 - bias and their decode times divided by it. Per repetition, on fresh draws for each: the race with slot
blocking, the same without it (RaceRule(slot_blocking=False)), and --slots 1 (one launch at a time, no bias);
correct per shape as above; the modelled wall time of a round is its longest launch. A/A across slots: --aa races
of 8 identical candidates over the N slots with the slow slot, with and without blocking (false positive: an
elimination or a shape "separated"), and as many with equal slots for the rate of "slots differ".

Run: .venv/bin/python bench/bench_tune.py [--reps 20] [--aa 200] [--confidence 0.95] [--json FILE]
     [--slots [N]] [--slot-bias 0.04] [--no-grid]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core.measure.stats import wilson_interval
from app.core.tune.race import Decision, Obs, RaceRule, decide
from app.core.tune.slots_stats import pick_slot_assignment
from app.sim.speed import SpeedConfig, SpeedModel, load_params

WEIGHTS_GIB = 50.3  # sim/qwen3.6-27b (app/sim/models.toml)
TP = 2
GRAPH_MAX_BS = 32  # SGLang's auto cuda_graph_max_bs for the demo (48 GB, TP 2)
OUTPUT_LEN = 128
TOLERANCE = 0.02


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    input_len: int

    @property
    def context(self) -> float:
        return self.input_len + OUTPUT_LEN / 2


SHAPES = (Shape("1x1K", 1, 1024), Shape("32x1K", 32, 1024), Shape("1x50K", 1, 50_000))


def candidates() -> dict[str, SpeedConfig]:
    out: dict[str, SpeedConfig] = {}
    for steps in range(6):
        for graph in (False, True):
            for overlap in (False, True):
                name = f"s{steps}{'-g' if graph else ''}{'-o' if overlap else ''}"
                out[name] = SpeedConfig(
                    weights_gib=WEIGHTS_GIB, tp_size=TP, spec_algorithm="EAGLE" if steps else None,
                    spec_steps=steps, spec_topk=1, spec_draft_tokens=steps + 1 if steps else 0,
                    cuda_graph=True, cuda_graph_max_bs=GRAPH_MAX_BS, piecewise_cuda_graph=graph,
                    single_batch_overlap=overlap, overlap_schedule=not steps)  # 0.5.10: spec v1 turns overlap off
    return out


class Launcher:
    """Draws launches of the candidates from the speed model, as launched sim servers would measure them."""

    def __init__(self, space: dict[str, SpeedConfig], params: dict[str, Any], shapes: tuple[Shape, ...],
                 trials: int, rng: random.Random) -> None:
        self.space, self.params, self.shapes, self.trials, self.rng = space, params, shapes, trials, rng
        self.wall_s = 0.0

    def launch(self, cand: str) -> dict[str, tuple[float, ...]]:
        model = SpeedModel(self.space[cand], self.params, seed=self.rng.getrandbits(63),
                           launch_seed=self.rng.getrandbits(63))
        return {s.name: tuple(self._trial(model, s) for _ in range(self.trials)) for s in self.shapes}

    def _trial(self, model: SpeedModel, shape: Shape) -> float:
        mean_len = model.mean_accept_len()
        var_len = _accept_var(model)
        tokens = elapsed_ms = 0.0
        while tokens < OUTPUT_LEN:
            step = model.sample_step_ms(shape.batch, shape.context)
            per_stream = max(1.0, model.rng.gauss(mean_len, math.sqrt(var_len / shape.batch)))
            tokens += per_stream
            elapsed_ms += step
        self.wall_s += elapsed_ms / 1000
        return 1000.0 * tokens / elapsed_ms


def _accept_var(model: SpeedModel) -> float:
    """The variance of one stream's tokens per step (1 + accepted drafts)."""
    probs, reach = [], 1.0
    for i in range(1, model.draft_tokens + 1):
        reach *= model.position_accept(i)
        probs.append(reach)  # P(N >= i + 1)
    mean = 1.0 + sum(probs)
    second = 1.0 + sum((2 * i + 1) * p for i, p in enumerate(probs, start=1))  # E[N^2] = sum (2n - 1) P(N >= n)
    return max(second - mean * mean, 0.0)


def true_speeds(space: dict[str, SpeedConfig], params: dict[str, Any], shapes: tuple[Shape, ...]
                ) -> dict[str, dict[str, float]]:
    return {s.name: {c: SpeedModel(cfg, {**params, "launch_sigma": 0.0}, seed=0).mean_stream_tok_s(
        s.batch, s.context) for c, cfg in space.items()} for s in shapes}


def correct(truth: dict[str, dict[str, float]], chosen: dict[str, str]) -> dict[str, bool]:
    return {s: truth[s][c] >= (1 - TOLERANCE) * max(truth[s].values()) for s, c in chosen.items()}


def run_grid(names: list[str], launcher: Launcher, shapes: tuple[Shape, ...], per: int) -> tuple[dict[str, str], int]:
    sums: dict[str, dict[str, list[float]]] = {s.name: {c: [] for c in names} for s in shapes}
    for _ in range(per):
        for c in names:
            for s, vals in launcher.launch(c).items():
                sums[s][c].append(statistics.fmean(vals))
    chosen = {s: max(names, key=lambda c, s=s: statistics.fmean(sums[s][c])) for s in sums}  # type: ignore[misc]
    return chosen, per * len(names)


def run_race(names: list[str], launcher: Launcher, shapes: tuple[Shape, ...], rule: RaceRule
             ) -> tuple[dict[str, str], int, Any]:
    obs: list[Obs] = []
    count = {c: 0 for c in names}
    shape_names = [s.name for s in shapes]
    while True:
        d = decide(names, shape_names, obs, rule)
        if d.done:
            break
        c = d.next[0]
        for s, vals in launcher.launch(c).items():
            obs.append(Obs(c, s, count[c], vals))
        count[c] += 1
    chosen = {b.shape: b.leader or b.front or names[0] for b in d.boards}
    return chosen, d.launches_spent, d


def run_slot_race(names: list[str], launcher: Launcher, shapes: tuple[Shape, ...], rule: RaceRule,
                  factors: list[float], relaunch_s: float) -> tuple[dict[str, str], int, Decision, float]:
    """The race over len(factors) slots in parallel rounds: returns the choice per shape, the launches, the last
    Decision and the modelled wall time (per round its longest launch: relaunch + decode at the slot's speed)."""
    obs: list[Obs] = []
    history: dict[str, list[int]] = {c: [] for c in names}
    shape_names = [s.name for s in shapes]
    wall = 0.0
    while True:
        d = decide(names, shape_names, obs, rule)
        if d.done:
            break
        pairs = pick_slot_assignment(d.next, list(range(len(factors))), history, ())
        assert pairs, "the slots were left idle with candidates asked for"
        longest = 0.0
        for c, slot in pairs:
            before = launcher.wall_s
            vals = launcher.launch(c)
            longest = max(longest, relaunch_s + (launcher.wall_s - before) / factors[slot])
            for s, v in vals.items():
                obs.append(Obs(c, s, len(history[c]), tuple(x * factors[slot] for x in v), slot))
            history[c].append(slot)
        wall += longest
    chosen = {b.shape: b.leader or b.front or names[0] for b in d.boards}
    return chosen, d.launches_spent, d, wall


def slot_section(args: argparse.Namespace, space: dict[str, SpeedConfig], params: dict[str, Any],
                 truth: dict[str, dict[str, float]], rule: RaceRule, rng: random.Random) -> dict[str, Any]:
    """--slots N: blocking vs no blocking vs one slot (module docstring); the A/A across slots."""
    n = args.slots
    slow = [1.0] * (n - 1) + [1.0 - args.slot_bias]
    names = list(space)
    methods = {"blocking": (slow, rule), "no blocking": (slow, replace(rule, slot_blocking=False)),
               "slots 1": ([1.0], rule)}
    k = len(SHAPES)
    ok_shape = {m: 0 for m in methods}
    ok_all = {m: 0 for m in methods}
    spent: dict[str, list[int]] = {m: [] for m in methods}
    wall: dict[str, list[float]] = {m: [] for m in methods}
    found: list[float] = []
    t0 = time.perf_counter()
    for _ in range(args.reps):
        for m, (factors, r) in methods.items():
            launcher = Launcher(space, params, SHAPES, args.trials, random.Random(rng.getrandbits(63)))
            chosen, spent_n, d, w = run_slot_race(names, launcher, SHAPES, r, factors, args.relaunch_s)
            ok = correct(truth, chosen)
            ok_shape[m] += sum(ok.values())
            ok_all[m] += all(ok.values())
            spent[m].append(spent_n)
            wall[m].append(w)
            if m == "blocking" and d.slots is not None and d.slots.estimated:
                f = {e.slot: e.factor for e in d.slots.effects}
                others = math.exp(statistics.fmean(math.log(f[j]) for j in range(n - 1)))
                found.append(f[n - 1] / others)
    print(f"\nslots: {n} slots, slot {n - 1} {args.slot_bias:.0%} slower; {args.reps} repetitions "
          f"({time.perf_counter() - t0:.0f} s)")
    print(f"{'method':12} {'correct (shape)':>22} {'correct (all 3)':>22} {'launches':>9} {'wall h':>7}")
    out: dict[str, Any] = {"slots": n, "slot_bias": args.slot_bias}
    for m in methods:
        lo, hi = wilson_interval(ok_shape[m], args.reps * k)
        lo3, hi3 = wilson_interval(ok_all[m], args.reps)
        print(f"{m:12} {ok_shape[m]:3}/{args.reps * k} {ok_shape[m] / (args.reps * k):5.0%} [{lo:.0%}-{hi:.0%}] "
              f"{ok_all[m]:3}/{args.reps} {ok_all[m] / args.reps:5.0%} [{lo3:.0%}-{hi3:.0%}] "
              f"{statistics.median(spent[m]):9.0f} {statistics.median(wall[m]) / 3600:7.2f}")
        out[m] = {"correct_shape": ok_shape[m], "correct_all": ok_all[m],
                  "launches_median": statistics.median(spent[m]), "wall_s_median": statistics.median(wall[m])}
    ratios = [a / b for a, b in zip(wall["blocking"], wall["slots 1"], strict=True)]
    wall_ratio = statistics.median(wall["blocking"]) / statistics.median(wall["slots 1"])
    print(f"wall time slots {n} / slots 1 (blocking): {wall_ratio:.2f} of the medians (per repetition median "
          f"{statistics.median(ratios):.2f}); slow slot estimated at "
          + (f"{statistics.median(found):.4f} of the others (median of {len(found)}; true {1 - args.slot_bias:.4f})"
             if found else "(never estimable)"))
    out["wall_ratio_median"] = wall_ratio
    out["slow_slot_estimate_median"] = statistics.median(found) if found else None

    if args.aa:
        aa_names = [f"same{i}" for i in range(8)]
        same = candidates()["s3-g-o"]
        aa_space = {c: same for c in aa_names}
        aa_rule = replace(rule, max_launches=3 * len(aa_names))
        cases = {"blocking": (slow, aa_rule), "no blocking": (slow, replace(aa_rule, slot_blocking=False)),
                 "equal slots": ([1.0] * n, aa_rule)}
        for m, (factors, r) in cases.items():
            false_pos = elim = slot_claims = 0
            for _ in range(args.aa):
                launcher = Launcher(aa_space, params, SHAPES, args.trials, random.Random(rng.getrandbits(63)))
                _, _, d, _ = run_slot_race(aa_names, launcher, SHAPES, r, factors, args.relaunch_s)
                separated = any(b.leader is not None and not b.tied for b in d.boards)
                elim += bool(d.eliminated)
                false_pos += bool(d.eliminated) or separated
                slot_claims += d.slots is not None and d.slots.significant
            lo, hi = wilson_interval(false_pos, args.aa)
            slo, shi = wilson_interval(slot_claims, args.aa)
            print(f"A/A across slots, {m:11}: {args.aa} races of 8 identical candidates over {n} slots: declared "
                  f"different in {false_pos} ({false_pos / args.aa:.1%}, 95% CI {lo:.1%}-{hi:.1%}), with an "
                  f"elimination {elim}; 'slots differ' in {slot_claims} ({slot_claims / args.aa:.1%}, "
                  f"{slo:.1%}-{shi:.1%})")
            out[f"aa {m}"] = {"races": args.aa, "declared_different": false_pos, "with_elimination": elim,
                              "slots_differ": slot_claims}
    return out


def grid_section(args: argparse.Namespace, space: dict[str, SpeedConfig], params: dict[str, Any],
                 truth: dict[str, dict[str, float]], rule: RaceRule, rng: random.Random) -> dict[str, Any]:
    """The race against a one-launch and a two-launch grid, and the A/A of 8 identical candidates."""
    names = list(space)
    methods = ("race", "grid1", "grid2")
    per_shape = {m: 0 for m in methods}
    all_shapes = {m: 0 for m in methods}
    spent: dict[str, list[int]] = {m: [] for m in methods}
    wall: dict[str, list[float]] = {m: [] for m in methods}
    why: dict[str, int] = {}
    t0 = time.perf_counter()
    for _ in range(args.reps):
        for m in methods:
            launcher = Launcher(space, params, SHAPES, args.trials, random.Random(rng.getrandbits(63)))
            if m == "race":
                chosen, n, d = run_race(names, launcher, SHAPES, rule)
                key = d.why_done.split(":")[0]
                why[key] = why.get(key, 0) + 1
            else:
                chosen, n = run_grid(names, launcher, SHAPES, 1 if m == "grid1" else 2)
            ok = correct(truth, chosen)
            per_shape[m] += sum(ok.values())
            all_shapes[m] += all(ok.values())
            spent[m].append(n)
            wall[m].append(n * args.relaunch_s + launcher.wall_s)
    elapsed = time.perf_counter() - t0
    reps, k = args.reps, len(SHAPES)
    print(f"\n{reps} repetitions ({elapsed:.0f} s):")
    print(f"{'method':7} {'correct (shape)':>22} {'correct (all 3)':>22} {'launches':>9} {'points':>7} "
          f"{'wall h':>7}")
    results: dict[str, Any] = {}
    for m in methods:
        lo, hi = wilson_interval(per_shape[m], reps * k)
        lo3, hi3 = wilson_interval(all_shapes[m], reps)
        med = statistics.median(spent[m])
        print(f"{m:7} {per_shape[m]:3}/{reps * k} {per_shape[m] / (reps * k):5.0%} [{lo:.0%}-{hi:.0%}] "
              f"{all_shapes[m]:3}/{reps} {all_shapes[m] / reps:5.0%} [{lo3:.0%}-{hi3:.0%}] {med:9.0f} "
              f"{med * k if m != 'race' else med:7.0f} {statistics.median(wall[m]) / 3600:7.2f}")
        results[m] = {"correct_shape": per_shape[m], "correct_all": all_shapes[m], "launches_median": med,
                      "launches": spent[m], "wall_s_median": statistics.median(wall[m])}
    race_med = statistics.median(spent["race"])
    g2 = statistics.median(spent["grid2"])
    print(f"race launches / two-launch grid: {race_med / g2:.2f} per config (a launch measures every shape), "
          f"{race_med / (g2 * k):.2f} per point (a relaunch per config x shape); race stops: {why}")
    print("('points' for a grid = launches when every (config, shape) point is its own launch, auto_benchmark's "
          "way; the race's launch always measures every shape)")

    if args.aa:
        aa_names = [f"same{i}" for i in range(8)]
        same = candidates()["s3-g-o"]
        aa_space = {c: same for c in aa_names}
        aa_rule = RaceRule(confidence=args.confidence, tie_pct=args.tie_pct, max_launches=3 * len(aa_names))
        false_pos = elim = 0
        aa_spent = []
        for _ in range(args.aa):
            launcher = Launcher(aa_space, params, SHAPES, args.trials, random.Random(rng.getrandbits(63)))
            _, n, d = run_race(aa_names, launcher, SHAPES, aa_rule)
            aa_spent.append(n)
            separated = any(b.leader is not None and not b.tied for b in d.boards)
            elim += bool(d.eliminated)
            false_pos += bool(d.eliminated) or separated
        lo, hi = wilson_interval(false_pos, args.aa)
        print(f"\nA/A: {args.aa} races of 8 identical candidates x {k} shapes: declared different in {false_pos} "
              f"({false_pos / args.aa:.1%}, 95% CI {lo:.1%}-{hi:.1%}); with an elimination: {elim}; "
              f"median launches {statistics.median(aa_spent):.0f} of {aa_rule.max_launches}")
        results["aa"] = {"races": args.aa, "declared_different": false_pos, "with_elimination": elim,
                         "launches_median": statistics.median(aa_spent)}
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--aa", type=int, default=200, help="A/A races (8 identical candidates)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--tie-pct", type=float, default=2.0)
    ap.add_argument("--max-launches", type=int, default=None, help="race budget (default 3 per candidate)")
    ap.add_argument("--launch-sigma", type=float, default=None, help="override speed_model.toml's launch_sigma")
    ap.add_argument("--relaunch-s", type=float, default=46.0)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--slots", type=int, nargs="?", const=4, default=None,
                    help="the slots section with N parallel slots (4 when given alone)")
    ap.add_argument("--slot-bias", type=float, default=0.04, help="how much slower the last slot is (0.04 = 4%%)")
    ap.add_argument("--no-grid", action="store_true", help="skip the race-vs-grid section (e.g. with --slots)")
    args = ap.parse_args()
    if args.slots is not None and args.slots < 2:
        ap.error(f"--slots must be at least 2 (got {args.slots}); --slots 1 is the comparison it runs")
    if not 0 <= args.slot_bias < 1:
        ap.error(f"--slot-bias must be in [0, 1) (got {args.slot_bias})")

    params = load_params()
    if args.launch_sigma is not None:
        params["launch_sigma"] = args.launch_sigma
    space = candidates()
    names = list(space)
    truth = true_speeds(space, params, SHAPES)
    budget = args.max_launches or 3 * len(names)
    rule = RaceRule(confidence=args.confidence, tie_pct=args.tie_pct, max_launches=budget)
    print(f"space: {len(names)} candidates x {len(SHAPES)} shapes, launch_sigma {params['launch_sigma']}, "
          f"noise_sigma {params['noise_sigma']}, {args.trials} trials per launch per shape")
    for s in SHAPES:
        best = max(truth[s.name], key=truth[s.name].__getitem__)
        near = sorted(c for c, v in truth[s.name].items() if v >= (1 - TOLERANCE) * truth[s.name][best])
        print(f"  {s.name:6} true best {best} {truth[s.name][best]:.1f} tok/s/stream; within 2%: {', '.join(near)}")
    print(f"race rule: confidence {rule.confidence}, tie {rule.tie_pct}%, budget {budget} launches")

    rng = random.Random(args.seed)
    results: dict[str, Any] = {}
    if not args.no_grid:
        results.update(grid_section(args, space, params, truth, rule, rng))
    if args.slots is not None:
        results["slots"] = slot_section(args, space, params, truth, rule, rng)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
