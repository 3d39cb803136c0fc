"""The racing rule of `tunedash tune`: from launches measured so far, who is out, what to launch next, when to stop.

Pure: observations in, a Decision out; no I/O, no clock, deterministic. The unit is the launch: one launch of a
candidate measures every request shape once (a shape needs no relaunch), and its value at a shape is the mean of
that launch's trials there (app.core.measure.stats.launch_arm_stats). Comparisons are the project's launch-level
ratio (launch_ratio_stats: the t interval on log launch means, floored by the trials' own spread), with one
launch-to-launch spread per shape pooled over every candidate (`pool_spread`; stats.pooled_launch_spread) and the
error split over the k - 1 comparisons with the front (`bonferroni`).

The rule (docs/decisions.md, "Tune: the racing rule"):
- warm-up: every candidate gets `min_launches` launches before anything is decided;
- at each shape the *front* is the alive candidate with the highest mean; every other alive candidate c is
  compared with it: `high` = the one-sided upper bound of c/front at `confidence` (1 - (1 - confidence) / (k - 1)
  with `bonferroni`, k the alive candidates). c is *worse* there when
  high < 1, *tied* when 1 <= high < 1 + tie_pct/100 (it cannot beat the front by more than tie_pct), *open*
  otherwise (also when no interval exists yet, e.g. one launch each);
- c is eliminated once it is worse at every shape (an intersection-union test: no correction across shapes);
- a shape is resolved when no candidate is open there; its leader is then the front (None before);
- next: at each unresolved shape the duel of the front with its strongest challenger (highest upper bound), the
  one with fewer launches; these first, then the other fronts and open candidates, fewest launches first; equal
  counts go in candidate order on even counts and reversed on odd ones (ABBA), so no candidate is always launched
  early in a round and a drift cannot pick the winner;
- done when every shape is resolved, or when `max_launches` launches are spent (counted over all candidates,
  failed launches included).
A candidate whose first `max_failed_launches` launches all gave no trial value anywhere is eliminated for that;
one that keeps failing at one shape only stops blocking that shape after as many launches without a value there.
Slots (`tunedash tune --slots N`, docs/decisions.md "Tune: slots as a blocking factor"): when the launches ran on
two or more slots and `slot_blocking` is set, the slots' effects are estimated (app.core.tune.slots_stats) and the
rule races on every value divided by its slot's factor (once the effects have a residual degree of freedom); each
shape's pooled spread then has S - 1 fewer degrees of freedom (S slots: the effects were fitted from the same
residuals), and each comparison with the front is widened by the variance the effects' estimation error adds over
the two candidates' slot mixes (SlotEffects.mix_variance; 0 when both ran on the same slots). The boards' means
and intervals are then those of the adjusted values (what each candidate would measure on the average slot), so
whoever rebuilds a decision from stored launches must pass their slots too. Decision.slots carries the effects and
the A/A across slots whenever the launches ran on two or more slots (blocking or not).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from app.core.errors import TunedashError
from app.core.measure.stats import LaunchSpread, launch_arm_stats, launch_ratio_stats, pooled_launch_spread
from app.core.tune.obs import Obs
from app.core.tune.slots_stats import SlotEffects, adjust_for_slots, estimate_slot_effects

# A Standing's state at its shape.
LEADER = "leader"  # the front: highest mean among alive candidates (the leader once the shape is resolved)
WORSE = "worse"  # below the front with the rule's confidence
TIED = "tied"  # cannot beat the front by more than tie_pct, with the rule's confidence
OPEN = "open"  # could still be the best by more than tie_pct: more launches can change the decision
NO_DATA = "no data"  # launched max_failed_launches times without a value at this shape: not waited for
OUT = "out"  # eliminated (why in Standing.why_out)


class RaceError(TunedashError):
    """Observations or a rule the racing rule cannot use (names the candidate, shape and launch)."""

    title = "tune: bad race input"


@dataclass(frozen=True)
class RaceRule:
    """What the race needs to decide: the confidence per elimination, the tie margin and the launch budget."""

    confidence: float = 0.95  # per elimination / per tie bound (one-sided)
    tie_pct: float = 2.0  # "within X% of each other" = a tie, stop separating
    max_launches: int | None = None  # total budget (None: no cap)
    min_launches: int = 1  # each candidate gets this many before any elimination
    max_failed_launches: int = 2  # launches without any value before a candidate is dropped for failing
    pool_spread: bool = True  # one launch-to-launch spread per shape, pooled over every candidate (else pairwise)
    bonferroni: bool = True  # split 1 - confidence over the comparisons with the front at a shape (alive - 1)
    slot_blocking: bool = True  # obs on >= 2 slots: race on values adjusted for the slots' effects (slots_stats)

    def __post_init__(self) -> None:
        problems = []
        if not 0.5 < self.confidence < 1.0:
            problems.append(f"confidence must be in (0.5, 1) (got {self.confidence})")
        if not (math.isfinite(self.tie_pct) and self.tie_pct >= 0):
            problems.append(f"tie_pct must be a finite number >= 0 (got {self.tie_pct})")
        if self.min_launches < 1:
            problems.append(f"min_launches must be >= 1 (got {self.min_launches})")
        if self.max_launches is not None and self.max_launches < 1:
            problems.append(f"max_launches must be >= 1 or None (got {self.max_launches})")
        if self.max_failed_launches < 1:
            problems.append(f"max_failed_launches must be >= 1 (got {self.max_failed_launches})")
        if problems:
            raise RaceError("race rule: " + "; ".join(problems))


@dataclass(frozen=True)
class Standing:
    """One candidate at one shape.

    launches: launches with a value at this shape; mean: the mean of its launch means (None without one);
    ci: the 95% interval of that mean over launches (None below two); alive: not eliminated; why_out: the
    elimination's sentence ("" while alive); state: LEADER / WORSE / TIED / OPEN / NO_DATA / OUT at this shape;
    vs_front: its geometric-mean ratio to the shape's front; vs_front_high: the one-sided upper bound of that
    ratio at the rule's confidence (None for the front itself or without an interval)."""

    candidate: str
    launches: int
    mean: float | None
    ci: tuple[float, float] | None
    alive: bool
    why_out: str
    state: str = OPEN
    vs_front: float | None = None
    vs_front_high: float | None = None


@dataclass(frozen=True)
class ShapeBoard:
    """Per shape: rows best first (by mean; no mean last). leader: None while unresolved. tied: when resolved and
    some candidates could not be separated from the leader, the leader then those, best first (else ())."""

    shape: str
    rows: tuple[Standing, ...]
    leader: str | None
    tied: tuple[str, ...]
    front: str | None = None  # the provisional best (highest mean among alive candidates), even unresolved
    open: tuple[str, ...] = ()  # candidates that can still change this shape's decision


@dataclass(frozen=True)
class Decision:
    """The race's state after the observations given: boards per shape, eliminations, what to launch next."""

    boards: tuple[ShapeBoard, ...]
    eliminated: Mapping[str, str]  # candidate -> why (human sentence)
    next: tuple[str, ...]  # candidates to launch next, in order (interleaved; empty when done)
    done: bool
    why_done: str  # "every shape separated" / "budget spent: 40 of 40 launches" / ... ("" while not done)
    launches_spent: int = 0
    slots: SlotEffects | None = None  # the slots' effects and A/A when obs ran on >= 2 slots (else None)


@dataclass(frozen=True)
class _Compare:
    state: str
    ratio: float | None
    high: float | None


def _pct(ratio: float) -> str:
    return f"{abs(1.0 - ratio) * 100:.1f}%"


def _check(candidates: Sequence[str], shapes: Sequence[str], obs: Sequence[Obs]) -> None:
    problems: list[str] = []
    for kind, names in (("candidate", candidates), ("shape", shapes)):
        if not names:
            problems.append(f"no {kind}s given")
        seen: set[str] = set()
        for name in names:
            if not isinstance(name, str) or not name:
                problems.append(f"a {kind} name must be a non-empty string (got {name!r})")
            elif name in seen:
                problems.append(f"{kind} {name!r} is given twice")
            seen.add(name)
    known_c, known_s = set(candidates), set(shapes)
    keys: set[tuple[str, str, int]] = set()
    slot_of: dict[tuple[str, int], int | None] = {}
    for o in obs:
        where = f"candidate {o.candidate!r}, shape {o.shape!r}, launch {o.launch}"
        if o.candidate not in known_c:
            problems.append(f"{where}: unknown candidate")
        if o.shape not in known_s:
            problems.append(f"{where}: unknown shape")
        key = (o.candidate, o.shape, o.launch)
        if key in keys:
            problems.append(f"{where}: observed twice")
        keys.add(key)
        if o.slot is not None and (isinstance(o.slot, bool) or not isinstance(o.slot, int) or o.slot < 0):
            problems.append(f"{where}: slot must be an integer >= 0 or None (got {o.slot!r})")
        elif slot_of.setdefault((o.candidate, o.launch), o.slot) != o.slot:
            problems.append(f"{where}: slot {o.slot} but the same launch ran on slot "
                            f"{slot_of[(o.candidate, o.launch)]} at another shape (one launch, one slot)")
        bad = [v for v in o.values if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)]
        if bad:
            problems.append(f"{where}: trial values must be finite and > 0 (got {bad[:3]!r})")
    if problems:
        raise RaceError("; ".join(problems))


def _compare(front: list[list[float]], other: list[list[float]], rule: RaceRule,
             spread: LaunchSpread | None, level: float) -> _Compare:
    """`other` against the front at one shape: its state with the one-sided bound at `level`."""
    if rule.pool_spread and spread is None:  # no candidate has two launches yet: no interval
        st = launch_ratio_stats(front, other)
        return _Compare(OPEN, st.ratio, None)
    st = launch_ratio_stats(front, other, confidence=2 * level - 1, spread=spread)
    if st.ratio is None:
        return _Compare(OPEN, None, None)
    if st.ci95 is None:
        return _Compare(OPEN, st.ratio, None)
    high = st.ci95[1]
    if high < 1.0:
        state = WORSE
    elif high < 1.0 + rule.tie_pct / 100:
        state = TIED
    else:
        state = OPEN
    return _Compare(state, st.ratio, high)


def _order_key(index: dict[str, int], launches: dict[str, int]) -> Callable[[str], tuple[int, int]]:
    def key(c: str) -> tuple[int, int]:
        n = launches[c]
        return (n, index[c] if n % 2 == 0 else -index[c])
    return key


def _duels(boards: list[ShapeBoard], alive: list[str], need: set[str], launches: dict[str, int],
           key: Callable[[str], tuple[int, int]]) -> list[str]:
    """What to launch: at each unresolved shape the duel of its front with its strongest challenger (the open
    candidate with the highest upper bound; without intervals the closest mean), the one of the two with fewer
    launches (the challenger on a tie); these picks fewest launches first, then the rest of `need` the same way.
    A duel alternates its two candidates (drift hits both alike) and spends launches where the decision is."""
    picks: list[str] = []
    for b in boards:
        if b.leader is not None or b.front is None or not b.open:
            continue
        rows = {r.candidate: r for r in b.rows}
        challenger = max(b.open, key=lambda c: (rows[c].vs_front_high is None, rows[c].vs_front_high or 0.0,
                                                rows[c].vs_front or 0.0, -launches[c], -b.open.index(c)))
        pick = b.front if launches[b.front] < launches[challenger] else challenger
        if pick in alive and pick not in picks:
            picks.append(pick)
    picks.sort(key=key)
    return picks + sorted((need & set(alive)) - set(picks), key=key)


def decide(candidates: Sequence[str], shapes: Sequence[str], obs: Sequence[Obs], rule: RaceRule) -> Decision:
    """The racing rule applied to every observation so far (module docstring). Raises RaceError on bad input."""
    _check(candidates, shapes, obs)
    slot_fx = estimate_slot_effects(obs)  # None unless the launches ran on >= 2 slots
    blocking = slot_fx is not None and slot_fx.estimated and slot_fx.residual_df >= 1 and rule.slot_blocking
    df_lost = 0
    slots_of: dict[tuple[str, str], list[int]] = {}  # (shape, candidate) -> the slots of its launches with a value
    if blocking:
        assert slot_fx is not None
        obs = adjust_for_slots(obs, slot_fx)
        df_lost = len(slot_fx.effects) - 1
        for o in sorted(obs, key=lambda o: o.launch):
            if o.values and o.slot is not None:
                slots_of.setdefault((o.shape, o.candidate), []).append(o.slot)
    index = {c: i for i, c in enumerate(candidates)}
    by_launch: dict[tuple[str, str], dict[int, tuple[float, ...]]] = {}
    launch_ids: dict[str, set[int]] = {c: set() for c in candidates}
    succeeded: dict[str, set[int]] = {c: set() for c in candidates}
    for o in obs:
        by_launch.setdefault((o.shape, o.candidate), {})[o.launch] = o.values
        launch_ids[o.candidate].add(o.launch)
        if o.values:
            succeeded[o.candidate].add(o.launch)
    launches = {c: len(launch_ids[c]) for c in candidates}
    spent = sum(launches.values())

    def data(shape: str, c: str) -> list[list[float]]:
        got = by_launch.get((shape, c), {})
        return [list(got[k]) for k in sorted(got) if got[k]]

    def blank_launches(shape: str, c: str) -> int:
        got = by_launch.get((shape, c), {})
        return launches[c] - sum(1 for v in got.values() if v)

    eliminated: dict[str, str] = {}
    for c in candidates:
        if not succeeded[c] and launches[c] >= rule.max_failed_launches:
            eliminated[c] = f"{launches[c]} launches gave no trial value at any shape"
    alive = [c for c in candidates if c not in eliminated]
    warmup = [c for c in alive if launches[c] < rule.min_launches]

    fronts: dict[str, str | None] = {}
    compares: dict[str, dict[str, _Compare]] = {}
    spreads: dict[str, LaunchSpread | None] = {}
    for shape in shapes:
        spreads[shape] = pooled_launch_spread([data(shape, c) for c in candidates]) if rule.pool_spread else None
        spread = spreads[shape]
        if df_lost and spread is not None:  # the slot effects were fitted from these residuals too
            spreads[shape] = LaunchSpread(spread.sd, spread.df - df_lost) if spread.df > df_lost else None
        means = {c: launch_arm_stats(data(shape, c)).mean for c in alive}
        with_mean = [c for c in alive if means[c] is not None]
        front = max(with_mean, key=lambda c: (means[c], -index[c])) if with_mean else None
        fronts[shape] = front
        row: dict[str, _Compare] = {}
        level = rule.confidence
        if rule.bonferroni and len(alive) > 2:
            level = 1 - (1 - rule.confidence) / (len(alive) - 1)
        for c in alive:
            if c == front:
                continue
            if means[c] is None and blank_launches(shape, c) >= rule.max_failed_launches:
                row[c] = _Compare(NO_DATA, None, None)
            elif front is None:
                row[c] = _Compare(OPEN, None, None)
            else:
                pair_spread = spreads[shape]
                if blocking and pair_spread is not None:  # widened by the slot effects' error over the two mixes
                    assert slot_fx is not None
                    extra = slot_fx.mix_variance(slots_of.get((shape, front), []), slots_of.get((shape, c), []))
                    n_f, n_c = len(data(shape, front)), len(data(shape, c))
                    if extra > 0 and n_f and n_c:
                        sd = math.sqrt(pair_spread.sd ** 2 + extra / (1 / n_f + 1 / n_c))
                        pair_spread = LaunchSpread(sd, pair_spread.df)
                row[c] = _compare(data(shape, front), data(shape, c), rule, pair_spread, level)
        compares[shape] = row

    if not warmup:
        for c in alive:
            rows = [compares[s].get(c) for s in shapes]
            if all(r is not None and r.state == WORSE for r in rows):
                parts = []
                for s, r in zip(shapes, rows, strict=True):
                    assert r is not None and r.ratio is not None and r.high is not None
                    parts.append(f"{s}: {_pct(r.ratio)} below {fronts[s]} (at most {_pct(r.high)} below)")
                eliminated[c] = (f"worse than the leader at every shape with {rule.confidence:.0%} confidence: "
                                 + "; ".join(parts))
        alive = [c for c in alive if c not in eliminated]

    boards: list[ShapeBoard] = []
    need: set[str] = set()
    all_resolved = not warmup and bool(alive)
    any_tie = False
    for shape in shapes:
        front = fronts[shape]
        row = compares[shape]
        open_ = tuple(c for c in alive if c != front and row[c].state == OPEN)
        resolved = not warmup and front is not None and not open_
        if not resolved:
            all_resolved = False
            need.update(open_)
            if front is not None:
                need.add(front)
        tied_others = [c for c in alive if c != front and row[c].state == TIED]
        standings = []
        for c in candidates:
            st = launch_arm_stats(data(shape, c))
            if c in eliminated:
                state, ratio, high = OUT, None, None
            elif c == front:
                state, ratio, high = LEADER, 1.0, None
            else:
                cmp = row[c]
                state, ratio, high = cmp.state, cmp.ratio, cmp.high
            standings.append(Standing(c, st.launches, st.mean, st.ci95, c not in eliminated,
                                      eliminated.get(c, ""), state, ratio, high))
        standings.sort(key=lambda s: (s.mean is None, -(s.mean or 0.0), index[s.candidate]))
        tied: tuple[str, ...] = ()
        if resolved and front is not None and tied_others:
            any_tie = True
            order = {s.candidate: i for i, s in enumerate(standings)}
            tied = (front, *sorted(tied_others, key=order.__getitem__))
        boards.append(ShapeBoard(shape, tuple(standings), front if resolved else None, tied, front, open_))

    key = _order_key(index, launches)
    nxt = sorted(warmup, key=key) if warmup else _duels(boards, alive, need, launches, key)
    done, why = False, ""
    if not alive:
        done, why = True, "no candidate left: every one was eliminated"
    elif all_resolved:
        done = True
        why = (f"every shape separated or tied within {rule.tie_pct:g}%" if any_tie else "every shape separated")
    elif rule.max_launches is not None and spent >= rule.max_launches:
        done, why = True, f"budget spent: {spent} of {rule.max_launches} launches"
    if not done and not nxt:  # only shapes where no candidate ever gave a value are left
        blank = [b.shape for b in boards if b.front is None]
        done, why = True, f"no launch can change the decision: no value at {', '.join(blank)} from any candidate"
    if done:
        nxt = []
    elif rule.max_launches is not None:
        nxt = nxt[: rule.max_launches - spent]
    return Decision(tuple(boards), MappingProxyType(dict(eliminated)), tuple(nxt), done, why, spent, slot_fx)
