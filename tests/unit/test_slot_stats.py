"""The statistics of parallel slots (app.core.tune.slots_stats) and the racing rule's slot blocking: hand-computed
slot effects, a simulated slow slot, the A/A across slots, and which candidate goes to which free slot."""

from __future__ import annotations

import math
import random

import pytest

from app.core.measure.stats import t_quantile
from app.core.tune.race import Obs, RaceError, RaceRule, decide
from app.core.tune.slots_stats import adjust_for_slots, estimate_slot_effects, pick_slot_assignment


def test_two_candidates_two_slots_hand_computed() -> None:
    # a: 100 on slot 0, 96 on slot 1; b: 200 and 194. Least squares: e1 - e0 = d = mean(ln .96, ln .97), centred:
    # e0 = -d/2, e1 = d/2. Residuals ±u, u = (ln .97 - ln .96)/4, df = 4 launches - 2 blocks - 1 = 1, s = 2u;
    # C = [[1, -1], [-1, 1]], C+ = C/4, sd(e1) = s/2 = u; interval exp(d/2 ± t(1 - 0.05/4, 1) u).
    obs = [Obs("a", "s", 0, (100.0,), 0), Obs("a", "s", 1, (96.0,), 1),
           Obs("b", "s", 0, (200.0,), 0), Obs("b", "s", 1, (194.0,), 1)]
    fx = estimate_slot_effects(obs)
    assert fx is not None and fx.estimated and fx.residual_df == 1
    d = (math.log(0.96) + math.log(0.97)) / 2
    u = (math.log(0.97) - math.log(0.96)) / 4
    half = t_quantile(1 - 0.05 / 4, 1) * u
    e0, e1 = fx.effects
    assert (e0.slot, e1.slot, e0.launches, e1.launches) == (0, 1, 2, 2)
    assert e0.factor == pytest.approx(math.exp(-d / 2), rel=1e-12)
    assert e1.factor == pytest.approx((0.96 * 0.97) ** 0.25, rel=1e-12)
    assert e1.ci == pytest.approx((math.exp(d / 2 - half), math.exp(d / 2 + half)), rel=1e-9)
    assert not fx.significant and fx.aa_text.startswith("no slot effect found: all 2 slots within ±")
    # cov = s^2 C+ = u^2 [[1, -1], [-1, 1]]: slot 1 against slot 0 adds (-1, 1) cov (-1, 1)' = 4 u^2; same mix: 0
    assert [x for row in fx.cov for x in row] == pytest.approx([u * u, -u * u, -u * u, u * u], rel=1e-9)
    assert fx.mix_variance([0], [1]) == pytest.approx(4 * u * u, rel=1e-9)
    assert fx.mix_variance([0, 1], [1, 0]) == pytest.approx(0.0, abs=1e-18)
    adjusted = adjust_for_slots(obs, fx)
    assert adjusted[1].values[0] == pytest.approx(96.0 / e1.factor) and adjusted[1].slot == 1
    assert adjusted[0].values[0] == pytest.approx(100.0 / e0.factor)


def test_a_launch_is_one_observation_whatever_its_shapes() -> None:
    # the same design measured at two shapes with the same values: a launch's noise is shared by its shapes, so
    # it stays one observation (df 1, the same interval), not two
    one = [Obs("a", "s", 0, (100.0,), 0), Obs("a", "s", 1, (96.0,), 1),
           Obs("b", "s", 0, (200.0,), 0), Obs("b", "s", 1, (194.0,), 1)]
    two = one + [Obs(o.candidate, "t", o.launch, o.values, o.slot) for o in one]
    fx1, fx2 = estimate_slot_effects(one), estimate_slot_effects(two)
    assert fx1 is not None and fx2 is not None and fx2.residual_df == 1
    assert fx2.effects == fx1.effects


def test_fewer_than_two_slots_or_unlinked_slots() -> None:
    assert estimate_slot_effects([Obs("a", "s", 0, (1.0,))]) is None
    assert estimate_slot_effects([Obs("a", "s", 0, (1.0,), 2), Obs("b", "s", 0, (1.0,), 2)]) is None
    # a only on slot 0, b only on slot 1: nothing links the slots
    fx = estimate_slot_effects([Obs("a", "s", 0, (1.0,), 0), Obs("a", "s", 1, (1.1,), 0),
                                Obs("b", "s", 0, (2.0,), 1)])
    assert fx is not None and not fx.estimated and not fx.significant
    assert [e.factor for e in fx.effects] == [1.0, 1.0]
    assert "not estimable yet" in fx.aa_text and "linked: 0 | 1" in fx.aa_text


def simulate(rng: random.Random, candidates: int, slots: list[float], rounds: int, launch_sigma: float,
             shapes: tuple[str, ...] = ("a", "b", "c")) -> list[Obs]:
    """Each candidate's launches rotate over the slots (candidate i starts at slot i); a launch factor shared by
    its shapes, a little trial noise on top."""
    obs: list[Obs] = []
    for c in range(candidates):
        true = {s: 50.0 + 10 * c + 5 * i for i, s in enumerate(shapes)}
        for launch in range(rounds):
            slot = (c + launch) % len(slots)
            lf = math.exp(rng.gauss(0, launch_sigma))
            for s in shapes:
                vals = tuple(true[s] * slots[slot] * lf * math.exp(rng.gauss(0, 0.002)) for _ in range(2))
                obs.append(Obs(f"c{c}", s, launch, vals, slot))
    return obs


def test_a_simulated_slow_slot_is_found_within_one_percent() -> None:
    obs = simulate(random.Random(5), candidates=24, slots=[1.0, 1.0, 1.0, 0.96], rounds=4, launch_sigma=0.005)
    fx = estimate_slot_effects(obs)
    assert fx is not None and fx.significant
    factors = {e.slot: e.factor for e in fx.effects}
    others = math.exp(sum(math.log(factors[s]) for s in (0, 1, 2)) / 3)
    assert factors[3] / others == pytest.approx(0.96, rel=0.01)
    assert math.prod(factors.values()) == pytest.approx(1.0, rel=1e-12)  # relative to the geometric mean
    assert fx.aa_text.startswith("slots differ: slot 3 is ") and "slower than the average slot" in fx.aa_text


def test_aa_across_slots() -> None:
    equal = simulate(random.Random(11), candidates=8, slots=[1.0] * 4, rounds=4, launch_sigma=0.015)
    fx = estimate_slot_effects(equal)
    assert fx is not None and fx.residual_df == 32 - 8 - 3 and not fx.significant
    assert fx.aa_text.startswith("no slot effect found")
    slow = simulate(random.Random(11), candidates=8, slots=[1.0, 1.0, 1.0, 0.96], rounds=4, launch_sigma=0.015)
    fx_slow = estimate_slot_effects(slow)
    assert fx_slow is not None and fx_slow.significant


def test_aa_rate_across_slots_is_within_the_stated_five_percent() -> None:
    rng = random.Random(2026)
    hits = 0
    for _ in range(300):
        fx = estimate_slot_effects(simulate(rng, candidates=6, slots=[1.0] * 4, rounds=3, launch_sigma=0.03,
                                            shapes=("a",)))
        assert fx is not None
        hits += fx.significant
    assert hits <= 0.05 * 300 + 6  # 5% stated; 6 = about two binomial sd at n = 300


def slow_slot_race() -> list[Obs]:
    """a (true 100) ran 3 of its 4 launches on the 4% slower slot 1, b (true 98.5) 3 of 4 on slot 0; r1, r2 (90)
    link the slots. Raw geometric means: a 97.0, b 97.5: without blocking b looks ahead."""
    slot_speed = {0: 1.0, 1: 0.96}
    plan = {"a": (100.0, [1, 1, 1, 0]), "b": (98.5, [0, 0, 0, 1]), "r1": (90.0, [0, 1]), "r2": (90.0, [1, 0])}
    wiggle = [1.002, 0.998, 1.001, 0.999]
    obs = []
    for c, (true, slots) in plan.items():
        for i, slot in enumerate(slots):
            obs.append(Obs(c, "s", i, (true * slot_speed[slot] * wiggle[i],), slot))
    return obs


def test_blocking_stops_a_slow_slot_from_crowning_the_wrong_winner() -> None:
    names = ["a", "b", "r1", "r2"]
    d = decide(names, ["s"], slow_slot_race(), RaceRule())
    assert d.slots is not None and d.slots.estimated
    assert d.slots.factor(1) / d.slots.factor(0) == pytest.approx(0.96, rel=0.005)
    board = d.boards[0]
    assert board.front == "a" and board.leader == "a" and "b" in d.eliminated and d.done
    unblocked = decide(names, ["s"], slow_slot_race(), RaceRule(slot_blocking=False))
    assert unblocked.boards[0].front == "b" and "b" not in unblocked.eliminated  # what blocking prevents
    assert unblocked.slots is not None  # still reported


def test_no_slots_no_change_and_one_launch_one_slot() -> None:
    obs = [Obs("a", "s", 0, (100.0,)), Obs("a", "s", 1, (101.0,)), Obs("b", "s", 0, (90.0,))]
    assert decide(["a", "b"], ["s"], obs, RaceRule()).slots is None
    with pytest.raises(RaceError, match="one launch, one slot"):
        decide(["a"], ["s", "t"], [Obs("a", "s", 0, (1.0,), 0), Obs("a", "t", 0, (1.0,), 1)], RaceRule())
    with pytest.raises(RaceError, match="slot must be an integer >= 0"):
        decide(["a"], ["s"], [Obs("a", "s", 0, (1.0,), -1)], RaceRule())


def test_second_launch_goes_to_a_new_slot_or_waits() -> None:
    assert pick_slot_assignment(["a"], [0, 1], {"a": [0]}, ()) == [("a", 1)]
    assert pick_slot_assignment(["a", "b"], [0], {"a": [0], "x": [1]}, ()) == [("b", 0)]
    assert pick_slot_assignment(["a"], [0], {"a": [0], "x": [1]}, ()) == []  # waits for slot 1
    assert pick_slot_assignment(["a"], [0], {"a": [0]}, ()) == [("a", 0)]  # one slot known: nothing to wait for


def test_balance_fewest_used_slot_first() -> None:
    history = {"a": [0, 1, 2, 0, 1, 2, 3]}
    assert pick_slot_assignment(["a"], [0, 1, 2, 3], history, ()) == [("a", 3)]
    # b can only use slot 1 (fewest used); a, fresh, first takes 1 then moves to 2 so that both get one
    assert pick_slot_assignment(["a", "b"], [1, 2], {"b": [0, 2]}, ()) == [("a", 2), ("b", 1)]
    # more asked than free: the first in the rule's order
    assert pick_slot_assignment(["c", "d", "e"], [0, 1], {}, ()) == [("c", 0), ("d", 1)]


def test_in_flight_only_when_nothing_else_is_asked() -> None:
    history = {"a": [0, 1], "b": [0, 1]}
    assert pick_slot_assignment(["a", "b"], [2], history, {"a"}) == [("b", 2)]
    assert pick_slot_assignment(["a", "b"], [2, 3], history, {"a"}) == [("a", 3), ("b", 2)]
    assert pick_slot_assignment(["a"], [1], {"a": [0]}, {"a"}) == [("a", 1)]


def test_assignment_is_deterministic() -> None:
    history = {"a": [0, 1], "b": [2], "c": [], "d": [3, 3, 1]}
    first = pick_slot_assignment(["d", "a", "b", "c"], [3, 1, 0, 2], history, {"c"})
    assert first == pick_slot_assignment(["d", "a", "b", "c"], [3, 1, 0, 2], history, {"c"})
    assert first == pick_slot_assignment(["d", "a", "b", "c"], [0, 1, 2, 3], history, {"c"})
    assert sorted(s for _, s in first) == [0, 1, 2, 3] and len({c for c, _ in first}) == 4


def test_slots_differ_flag_is_simultaneous_over_the_slots_hand_computed() -> None:
    # The 2 x 2 case of the first test: a on slots 0/1 at log ratio ra, b at rb; d = (ra + rb)/2, u = |rb - ra|/4,
    # df 1, and each slot's |t| = (|d|/2)/u = |ra + rb| / |rb - ra|. The flag uses t(1 - 0.05/(2*2), 1) = 25.45
    # (Bonferroni over the 2 slots, df = 4 launches - 2 blocks - 1), not t(0.975, 1) = 12.71: |t| = 19 is no claim,
    # |t| = 39 is one.
    assert t_quantile(0.975, 1) < 19 < t_quantile(1 - 0.05 / 4, 1) < 39

    def two_by_two(ra: float, rb: float) -> list[Obs]:
        return [Obs("a", "s", 0, (100.0,), 0), Obs("a", "s", 1, (100.0 * math.exp(ra),), 1),
                Obs("b", "s", 0, (200.0,), 0), Obs("b", "s", 1, (200.0 * math.exp(rb),), 1)]

    inside = estimate_slot_effects(two_by_two(-0.040, -0.036))
    assert inside is not None and inside.residual_df == 1 and not inside.significant
    lo, hi = inside.effects[1].ci or (0.0, 0.0)
    half = t_quantile(1 - 0.05 / 4, 1) * 0.001  # u = 0.004 / 4
    assert (lo, hi) == pytest.approx((math.exp(-0.019 - half), math.exp(-0.019 + half)), rel=1e-9)
    assert lo < 1.0 < hi
    outside = estimate_slot_effects(two_by_two(-0.040, -0.038))
    assert outside is not None and outside.significant
    half = t_quantile(1 - 0.05 / 4, 1) * 0.0005  # u = 0.002 / 4, e1 = d/2 = -0.0195
    assert outside.effects[1].ci == pytest.approx((math.exp(-0.0195 - half), math.exp(-0.0195 + half)), rel=1e-9)
    assert outside.aa_text.startswith("slots differ: slot ")  # slot 0 1.9% faster or slot 1 1.9% slower: a tie
    assert "1.9%" in outside.aa_text and outside.aa_text.endswith("simultaneous over 2 slots); 2 of 2 slots differ")
