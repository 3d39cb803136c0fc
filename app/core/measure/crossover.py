"""A/B on two slots as a crossover: the launch schedule (which arm on which slot in each round) and the statistics
that estimate the slot effect and take it out of B/A (pure: no I/O, no clock).

`tunedash ab --slots 2` runs A and B at the same time on two disjoint GPU sets (app.core.measure.slots). Two slots
are not equal (a GPU pair behind a slower link), so the slot is a blocking factor: in launch round r, A runs on
slot r % 2 and B on the other, so each arm gets half its launches on each slot (docs/decisions.md, "A/B on two
slots: a crossover").

The model, on y = log(the mean of one launch's trials), the launch being the unit as in app.core.measure.stats:

    y = mu[arm] + s * [slot == 1] + noise          s: log(slot 1 / slot 0), one for both arms

fitted by least squares with the arms as blocks. Within arm a (n0 launches on slot 0, n1 on slot 1, n = n0 + n1):

    c_a = mean(y on slot 1) - mean(y on slot 0),  w_a = n0 * n1 / n           (w_a = 0 when a slot is missing)
    s   = sum_a w_a c_a / sum_a w_a                                              Var(s) = sigma^2 / sum_a w_a
    d   = (mean(y_B) - p_B s) - (mean(y_A) - p_A s),  p_a = n1 / n              (B/A with the slot removed)
    Var(d) = sigma^2 (1/n_A + 1/n_B + (p_B - p_A)^2 / sum_a w_a)

(an arm's mean and its within-arm contrast are uncorrelated, hence the sum). sigma^2 is the residual mean square,
RSS / (N - 3) with RSS = the spread of the launches within each (arm, slot) cell plus sum_a w_a (c_a - s)^2, and is
never taken below the trials' floor (stats: a launch mean cannot vary less than its own trials allow). Intervals
are t(0.975, N - 3). Balanced (L even): p_A = p_B = 1/2, so d is the plain difference of the arms' mean logs and a
constant slot bias cancels exactly; L odd: one arm has one launch more on slot 0 and d still removes the bias
through s, at a wider interval. The slot's interval is the A/A across slots: it excludes 1 when the slots differ.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.measure.stats import CONFIDENCE, _trial_floor_sd, t_quantile

SLOTS = 2
SLOT_KEY = "slot"  # a launch row's flags name its slot under this key


def slot_flags(flags: dict[str, Any], index: int, gpus: Sequence[int], port: int) -> dict[str, Any]:
    """A launch row's flags with its slot, {"slot": {"index", "gpus", "port"}}, next to the profile's flags (the
    one place that writes the slot into the store; `stored_slot` reads it back)."""
    return {**flags, SLOT_KEY: {"index": index, "gpus": list(gpus), "port": port}}


def stored_slot(flags: dict[str, Any]) -> int | None:
    """The slot index a launch row's flags name (`slot_flags`), None for a launch not on a slot."""
    slot = flags.get(SLOT_KEY)
    index = slot.get("index") if isinstance(slot, dict) else None
    return index if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < SLOTS else None


def crossover_rounds(launches: int) -> list[tuple[int, int]]:
    """(A's slot, B's slot) for each launch round: (0, 1), (1, 0), (0, 1), ..."""
    return [(r % SLOTS, (r + 1) % SLOTS) for r in range(launches)]


@dataclass(frozen=True)
class SlotLaunch:
    """One launch of an arm: the slot it ran on and its successful trials' values."""

    slot: int
    trials: Sequence[float]


@dataclass(frozen=True)
class CrossoverStats:
    """The slot effect and B/A with it removed, each with its 95% interval (None without residual df).

    slot_ratio: slot 1 / slot 0 (0.96: slot 1 runs 4% slower); None when no arm ran on both slots.
    ratio: B/A adjusted for the slot; naive_ratio: B/A of the plain launch means, for comparison.
    launches_on: per arm, how many launches on slot 0 and on slot 1."""

    slot_ratio: float | None
    slot_ci: tuple[float, float] | None
    ratio: float | None
    ratio_ci: tuple[float, float] | None
    naive_ratio: float | None
    df: int
    launches_on: tuple[tuple[int, int], ...]

    @property
    def slot_significant(self) -> bool:
        return self.slot_ci is not None and (self.slot_ci[0] > 1.0 or self.slot_ci[1] < 1.0)

    @property
    def significant(self) -> bool:
        return self.ratio_ci is not None and (self.ratio_ci[0] > 1.0 or self.ratio_ci[1] < 1.0)


def _logs(arm: Sequence[SlotLaunch]) -> list[tuple[int, float]]:
    out = []
    for launch in arm:
        vals = [v for v in launch.trials if v > 0]
        if vals and len(vals) == len(launch.trials):
            out.append((launch.slot, math.log(statistics.fmean(vals))))
    return out


def crossover_stats(a: Sequence[SlotLaunch], b: Sequence[SlotLaunch], *,
                    confidence: float = CONFIDENCE) -> CrossoverStats:
    """The fit above for arms A and B (launches without a successful trial, or with a non-positive one, left out)."""
    arms = [_logs(a), _logs(b)]
    counts = tuple((sum(1 for s, _ in y if s == 0), sum(1 for s, _ in y if s == 1)) for y in arms)
    if not arms[0] or not arms[1]:
        return CrossoverStats(None, None, None, None, None, 0, counts)
    means = [statistics.fmean(v for _, v in y) for y in arms]
    naive = math.exp(means[1] - means[0])
    weights, contrasts, within = [], [], 0.0
    for y in arms:
        cells = [[v for s, v in y if s == slot] for slot in range(SLOTS)]
        for cell in cells:
            if cell:
                m = statistics.fmean(cell)
                within += sum((v - m) ** 2 for v in cell)
        if cells[0] and cells[1]:
            weights.append(len(cells[0]) * len(cells[1]) / len(y))
            contrasts.append(statistics.fmean(cells[1]) - statistics.fmean(cells[0]))
        else:
            weights.append(0.0)
            contrasts.append(0.0)
    total_w = sum(weights)
    if total_w == 0.0:  # no arm ran on both slots: the slot and the arm cannot be told apart
        return CrossoverStats(None, None, None, None, naive, 0, counts)
    s = sum(w * c for w, c in zip(weights, contrasts, strict=True)) / total_w
    share = [n1 / (n0 + n1) for n0, n1 in counts]
    d = (means[1] - share[1] * s) - (means[0] - share[0] * s)
    df = len(arms[0]) + len(arms[1]) - 3
    if df < 1:
        return CrossoverStats(math.exp(s), None, math.exp(d), None, naive, 0, counts)
    rss = within + sum(w * (c - s) ** 2 for w, c in zip(weights, contrasts, strict=True))
    sigma = math.sqrt(rss / df)
    floor = _trial_floor_sd([list(x.trials) for x in (*a, *b) if x.trials])
    if floor is not None:
        sigma = max(sigma, floor)
    t = t_quantile(0.5 + confidence / 2, df)
    se_s = sigma / math.sqrt(total_w)
    se_d = sigma * math.sqrt(1 / len(arms[0]) + 1 / len(arms[1]) + (share[1] - share[0]) ** 2 / total_w)
    return CrossoverStats(math.exp(s), (math.exp(s - t * se_s), math.exp(s + t * se_s)), math.exp(d),
                          (math.exp(d - t * se_d), math.exp(d + t * se_d)), naive, df, counts)


def _pct(x: float) -> str:
    return f"{abs(x - 1) * 100:.1f}%"


def slot_clause(st: CrossoverStats) -> str:
    """The slot effect in words: 'slot 1 runs 4.0% slower than slot 0 (95% CI 0.950-0.970)', or why not known."""
    if st.slot_ratio is None:
        return "slot effect not estimable (no arm ran on both slots)"
    if st.slot_ci is None:
        return f"slot 1 / slot 0 {st.slot_ratio:.3f} (no interval: too few launches)"
    lo, hi = st.slot_ci
    ci = f"95% CI {lo:.3f}-{hi:.3f}"
    if not st.slot_significant:
        return f"no slot difference detectable (slot 1 / slot 0 {st.slot_ratio:.3f}, {ci})"
    word = "slower" if st.slot_ratio < 1 else "faster"
    return f"slot 1 runs {_pct(st.slot_ratio)} {word} than slot 0 ({ci}), removed from B/A"


def crossover_verdict(st: CrossoverStats, *, a_name: str = "A", b_name: str = "B") -> str:
    """B/A with the slot removed, then the slot effect: both in one sentence."""
    if st.ratio is None:
        speed = "no B/A: " + ("an arm has no successful launch" if st.naive_ratio is None
                               else "no arm ran on both slots, so the slot and the arm cannot be told apart")
    elif st.ratio_ci is None:
        speed = f"{b_name}/{a_name} {st.ratio:.3f} with the slot removed (no interval: too few launches)"
    else:
        lo, hi = st.ratio_ci
        ci = f"95% CI {lo:.3f}-{hi:.3f}, slot removed"
        if not st.significant:
            speed = f"no difference detectable between {b_name} and {a_name} ({b_name}/{a_name} {st.ratio:.3f}, {ci})"
        else:
            word = "faster" if st.ratio > 1 else "slower"
            speed = f"{b_name} is {_pct(st.ratio)} {word} than {a_name} ({ci})"
    imbalance = [n0 - n1 for n0, n1 in st.launches_on]
    odd = "; an odd launch count puts one launch more of each arm on one slot" if any(imbalance) else ""
    return f"{speed}; {slot_clause(st)}{odd}"
