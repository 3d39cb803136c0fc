"""The statistics of parallel slots: each slot's speed effect with its interval, the A/A across slots, the values
adjusted for it, and which candidate to launch on which free slot (pure: no I/O, no clock, deterministic).

A *slot* is one of the disjoint GPU sets a `tunedash tune --slots N` runs candidates on at once; slots are not all
equal (a pair behind a slower link runs a few % slower), so the slot is a blocking factor
(docs/decisions.md, "Tune: slots as a blocking factor").

The model, on the log of a launch's mean at a shape (y, higher = better):

    y[c, s, launch] = mu[c, s] + e[slot(launch)] + noise,      sum over slots of e = 0

two-way additive without interaction: the candidate-at-shape effect mu and one slot effect e common to every
candidate and shape; a slot's *factor* is exp(e), its speed relative to the geometric mean of all slots.

The unit is the launch, as everywhere in the tune: one launch's noise (its launch factor) is shared by every shape
it measures, so its shapes are not independent observations of the slot. A launch is therefore one observation,
z = the mean over the shapes it has a value at of y, and its block is (candidate, those shapes): z = m[block] +
e[slot] + noise, where m[block] is the mean of that candidate's mu over those shapes. When every launch of a
candidate measures the same shapes (the usual case) this is exactly the least-squares fit of the model above
(averaging over shapes within a candidate is then a sufficient reduction); a launch that missed a shape is compared
only with that candidate's launches that missed the same ones.

The estimator is least squares, solved in closed form as the intrablock analysis of an incomplete block design:
eliminating the block means leaves the S x S system  C e = q  with

    C = sum over blocks of  diag(n_b) - n_b n_b^T / |b|        (n_b[j]: the block's launches on slot j)
    q = sum over blocks of  t_b - n_b * (sum of the block's z) / |b|     (t_b[j]: the sum of its z on slot j)

C is singular along the all-ones vector (the constraint sum e = 0 picks the solution); it has rank S - 1 exactly
when the slots are linked, i.e. connected by blocks that ran on two of them. Unlinked slots: the effects are not
estimable (every factor 1, `estimated` False). Linked: e = C+ q with C+ = (C + J/S)^-1 - J/S (J the all-ones
matrix), the residual variance s^2 = RSS / df with df = launches - blocks - (S - 1), Var(e_j) = s^2 C+[j, j], and
each slot's interval exp(e_j ± t(1 - 0.05/(2S), df) sd(e_j)): 95% simultaneous over the S slots (Bonferroni), so the
A/A across slots ("some slot's interval excludes 1", `significant`) claims a slot difference among equal slots in at
most 5% of tunes, at one look.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from app.core.measure.stats import t_quantile
from app.core.tune.obs import Obs

CONFIDENCE = 0.95  # simultaneous over the slots


@dataclass(frozen=True)
class SlotEffect:
    """One slot: factor = its multiplicative speed relative to the geometric mean of all slots (1.0 = average;
    0.96 = 4% slower); ci: its interval, simultaneous with the other slots' at 95% (None without residual degrees
    of freedom or when not estimable); launches: the launches with a value on it."""

    slot: int
    factor: float
    ci: tuple[float, float] | None
    launches: int


@dataclass(frozen=True)
class SlotEffects:
    """Every slot's effect, the A/A across slots as one sentence, and whether some slot differs (its interval
    excludes 1). estimated: False while the slots are not linked by candidates that ran on two of them (the
    factors are then 1.0); residual_df: the degrees of freedom of the residual spread the intervals use; cov: the
    covariance of the log effects' estimates (s^2 C+, rows in `effects` order; () without residual df)."""

    effects: tuple[SlotEffect, ...]
    aa_text: str
    significant: bool
    estimated: bool = True
    residual_df: int = 0
    cov: tuple[tuple[float, ...], ...] = ()

    def mix_variance(self, a: Sequence[int], b: Sequence[int]) -> float:
        """The variance that the effects' estimation error adds to log(mean of `b`'s launches / mean of `a`'s), both
        adjusted, from the slots their launches ran on: (w_b - w_a)' cov (w_b - w_a), w = each slot's share of the
        launches (0 without cov or launches; slots the estimate does not know count as unadjusted)."""
        if not self.cov or not a or not b:
            return 0.0
        pos = {e.slot: i for i, e in enumerate(self.effects)}
        w = [0.0] * len(self.effects)
        for slots, sign in ((b, 1.0), (a, -1.0)):
            for s in slots:
                if s in pos:
                    w[pos[s]] += sign / len(slots)
        return max(0.0, sum(w[i] * self.cov[i][j] * w[j] for i in range(len(w)) for j in range(len(w))))

    def factor(self, slot: int | None) -> float:
        """The factor of `slot` (1.0 for None or a slot not in the estimate)."""
        for e in self.effects:
            if e.slot == slot:
                return e.factor
        return 1.0


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """a x = b by Gaussian elimination with partial pivoting (a is small and, here, positive definite)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        p = m[col][col]
        for r in range(col + 1, n):
            f = m[r][col] / p
            if f:
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _inverse(a: list[list[float]]) -> list[list[float]]:
    n = len(a)
    cols = [_solve(a, [1.0 if i == j else 0.0 for i in range(n)]) for j in range(n)]
    return [[cols[j][i] for j in range(n)] for i in range(n)]


def _linked(slots: list[int], blocks: Collection[list[tuple[int, float]]]) -> list[list[int]]:
    """The groups of slots linked by blocks that ran on more than one of them (union-find), in slot order."""
    parent = {s: s for s in slots}

    def root(s: int) -> int:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    for rows in blocks:
        used = sorted({j for j, _ in rows})
        for j in used[1:]:
            parent[root(j)] = root(used[0])
    groups: dict[int, list[int]] = {}
    for s in slots:
        groups.setdefault(root(s), []).append(s)
    return sorted(groups.values())


def _pct(x: float) -> float:
    return abs(1.0 - x) * 100


def _aa_text(effects: list[SlotEffect], significant: bool) -> str:
    k = len(effects)
    if significant:
        outside = [e for e in effects if e.ci is not None and (e.ci[0] > 1.0 or e.ci[1] < 1.0)]
        worst = max(outside, key=lambda e: (abs(math.log(e.factor)), -e.slot))
        assert worst.ci is not None
        lo, hi = sorted((_pct(worst.ci[0]), _pct(worst.ci[1])))
        word = "slower" if worst.factor < 1 else "faster"
        more = f"; {len(outside)} of {k} slots differ" if len(outside) > 1 else ""
        return (f"slots differ: slot {worst.slot} is {_pct(worst.factor):.1f}% {word} than the average slot "
                f"(95% CI {lo:.1f}-{hi:.1f}%, simultaneous over {k} slots){more}")
    if any(e.ci is None for e in effects):
        return (f"slot effects not yet bounded: {sum(e.launches for e in effects)} launches on {k} slots leave no "
                "residual degree of freedom")
    bound = max(max(_pct(e.ci[0]), _pct(e.ci[1])) for e in effects if e.ci is not None)
    return f"no slot effect found: all {k} slots within ±{bound:.1f}% of their average (95%, simultaneous)"


def estimate_slot_effects(obs: Sequence[Obs]) -> SlotEffects | None:
    """The slot effects of the module docstring's model from every observation with a slot and a value; None when
    fewer than 2 distinct slots occur in `obs`."""
    slots = sorted({o.slot for o in obs if o.slot is not None})
    if len(slots) < 2:
        return None
    per_launch: dict[tuple[str, int], dict[str, float]] = {}
    slot_of: dict[tuple[str, int], int] = {}
    for o in obs:
        if o.slot is None or not o.values:
            continue
        mean = statistics.fmean(o.values)
        if mean <= 0:
            continue
        per_launch.setdefault((o.candidate, o.launch), {})[o.shape] = math.log(mean)
        slot_of[(o.candidate, o.launch)] = o.slot
    blocks: dict[tuple[str, tuple[str, ...]], list[tuple[int, float]]] = {}
    for key in sorted(per_launch):
        ys = per_launch[key]
        shapes = tuple(sorted(ys))
        blocks.setdefault((key[0], shapes), []).append((slot_of[key], statistics.fmean(ys.values())))
    counts = {s: sum(1 for rows in blocks.values() for j, _ in rows if j == s) for s in slots}
    groups = _linked(slots, list(blocks.values()))
    if len(groups) > 1:
        parts = " | ".join(", ".join(str(s) for s in g) for g in groups)
        return SlotEffects(tuple(SlotEffect(s, 1.0, None, counts[s]) for s in slots),
                           f"slot effects not estimable yet: no candidate has run on slots that link all "
                           f"{len(slots)} slots (linked: {parts})", False, estimated=False)
    k = len(slots)
    pos = {s: i for i, s in enumerate(slots)}
    c = [[0.0] * k for _ in range(k)]
    q = [0.0] * k
    for rows in blocks.values():
        size = len(rows)
        n = [0.0] * k
        t = [0.0] * k
        for j, z in rows:
            n[pos[j]] += 1
            t[pos[j]] += z
        total = sum(t)
        for a in range(k):
            q[a] += t[a] - n[a] * total / size
            c[a][a] += n[a]
            for b in range(k):
                c[a][b] -= n[a] * n[b] / size
    inv = _inverse([[c[a][b] + 1.0 / k for b in range(k)] for a in range(k)])
    cplus = [[inv[a][b] - 1.0 / k for b in range(k)] for a in range(k)]
    e = [sum(cplus[a][b] * q[b] for b in range(k)) for a in range(k)]
    rss = 0.0
    for rows in blocks.values():
        m = statistics.fmean(z - e[pos[j]] for j, z in rows)
        rss += sum((z - m - e[pos[j]]) ** 2 for j, z in rows)
    launches = sum(len(rows) for rows in blocks.values())
    df = launches - len(blocks) - (k - 1)
    effects: list[SlotEffect] = []
    cov: tuple[tuple[float, ...], ...] = ()
    if df >= 1:
        sd = math.sqrt(rss / df)
        cov = tuple(tuple(sd * sd * cplus[a][b] for b in range(k)) for a in range(k))
        t_q = t_quantile(1 - (1 - CONFIDENCE) / (2 * k), df)
        for s in slots:
            half = t_q * sd * math.sqrt(max(cplus[pos[s]][pos[s]], 0.0))
            es = e[pos[s]]
            effects.append(SlotEffect(s, math.exp(es), (math.exp(es - half), math.exp(es + half)), counts[s]))
    else:
        effects = [SlotEffect(s, math.exp(e[pos[s]]), None, counts[s]) for s in slots]
    significant = any(x.ci is not None and (x.ci[0] > 1.0 or x.ci[1] < 1.0) for x in effects)
    return SlotEffects(tuple(effects), _aa_text(effects, significant), significant, True, max(df, 0), cov)


def adjust_for_slots(obs: Sequence[Obs], effects: SlotEffects) -> list[Obs]:
    """Every value divided by its slot's factor (what it would have measured on the average slot); observations
    without a slot, or on a slot the estimate does not know, unchanged."""
    out: list[Obs] = []
    for o in obs:
        f = effects.factor(o.slot)
        out.append(o if f == 1.0 else replace(o, values=tuple(v / f for v in o.values)))
    return out


def pick_slot_assignment(next: Sequence[str], free_slots: Sequence[int], history: Mapping[str, Sequence[int]],
                         in_flight: Collection[str]) -> list[tuple[str, int]]:
    """Which candidate of the rule's `next` (in that order of priority) to launch on which free slot.

    history: per candidate the slots its launches ran on (include the launches in flight, so that balance counts
    them). Each candidate at most once per call, each free slot at most once; pairs in candidate priority order.
    (a) A candidate whose launches all ran on one slot is never put on that slot again while another slot is known
    (free or in any history): its second launch goes to a slot it has not used, or waits (the slot is left to
    others or idle) — what makes the slot effect estimable and a candidate measured on at least two slots.
    (b) First pass: each candidate only on one of its fewest-used slots, as many candidates as possible in
    priority order (augmenting paths: an earlier candidate keeps a slot unless a later one can be moved to give
    both one); then the slots left go to the candidates left on their least-used free slot (ties: lowest slot).
    (c) Candidates in `in_flight` come only after every other one asked for, on the slots still free. (d)
    Deterministic: the same input gives the same pairs."""
    free = list(dict.fromkeys(free_slots))
    asked = list(dict.fromkeys(next))
    known = set(free) | {s for slots in history.values() for s in slots}

    def used(c: str, s: int) -> int:
        return sum(1 for x in history.get(c, ()) if x == s)

    def allowed(c: str, s: int) -> bool:
        distinct = set(history.get(c, ()))
        return not (len(distinct) == 1 and s in distinct and len(known) > 1)

    def fewest(c: str) -> list[int]:
        least = min(used(c, s) for s in known) if known else 0
        return [s for s in sorted(free) if used(c, s) == least and allowed(c, s)]

    taken: dict[int, str] = {}  # slot -> candidate
    placed: dict[str, int] = {}

    def augment(c: str, seen: set[int]) -> bool:
        options = fewest(c)
        for s in [x for x in options if x not in taken] + [x for x in options if x in taken]:  # a free one first
            if s in seen:
                continue
            seen.add(s)
            if s not in taken or augment(taken[s], seen):
                taken[s] = c
                placed[c] = s
                return True
        return False

    waiting = [c for c in asked if c not in in_flight]
    for c in waiting:
        augment(c, set())
    for group in (waiting, [c for c in asked if c in in_flight]):
        for c in group:
            if c in placed:
                continue
            options = [s for s in free if s not in taken and allowed(c, s)]
            if options:
                s = min(options, key=lambda x: (used(c, x), x))
                taken[s] = c
                placed[c] = s
    return [(c, placed[c]) for c in asked if c in placed]
