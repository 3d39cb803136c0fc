"""The racing rule (app.core.tune.race) on hand-computed inputs: eliminations, ties, budget, warm-up, order."""

from __future__ import annotations

import math

import pytest

from app.core.tune.race import LEADER, NO_DATA, OPEN, OUT, TIED, WORSE, Obs, RaceError, RaceRule, decide

T95_DF3 = 2.353363  # one-sided 95% Student t, 3 df (printed tables)
T95_DF4 = 2.131847


def launches(cand: str, shape: str, means: list[float], start: int = 0) -> list[Obs]:
    """One trial per launch (no within-launch spread, so no trial floor): the launch mean is the value."""
    return [Obs(cand, shape, start + i, (m,)) for i, m in enumerate(means)]


E2 = math.exp(0.02)
A3 = [100 * E2, 100.0, 100 / E2]  # log launch means ln100 + (0.02, 0, -0.02): ss = 0.0008
B2 = [80 * E2, 80 / E2]  # ln80 + (0.02, -0.02): ss = 0.0008


def test_clear_loser_is_eliminated_with_the_hand_computed_bound() -> None:
    # sp^2 = (0.0008 + 0.0008) / (3 + 2 - 2); se = sp * sqrt(1/3 + 1/2); high = exp(ln 0.8 + t(0.95, 3) * se)
    sp = math.sqrt(0.0016 / 3)
    high = math.exp(math.log(0.8) + T95_DF3 * sp * math.sqrt(1 / 3 + 1 / 2))
    assert high == pytest.approx(0.84073, abs=1e-4)
    obs = launches("a", "s", A3) + launches("b", "s", B2)
    d = decide(["a", "b"], ["s"], obs, RaceRule())
    assert "b" in d.eliminated and "20.0% below a" in d.eliminated["b"]
    assert f"at most {abs(1 - high) * 100:.1f}% below" in d.eliminated["b"]
    board = d.boards[0]
    assert [r.candidate for r in board.rows] == ["a", "b"]
    assert board.rows[1].state == OUT and not board.rows[1].alive
    assert board.leader == "a" and board.tied == ()
    assert d.done and d.why_done == "every shape separated" and d.next == ()
    assert d.launches_spent == 5


def test_worse_at_one_shape_only_is_not_eliminated() -> None:
    # b is 20% worse at s1 but 25% better at s2: it stays, s2 has b in front and a open/worse there
    obs = launches("a", "s1", A3) + launches("b", "s1", B2)
    obs += launches("a", "s2", [100 * E2, 100.0, 100 / E2]) + launches("b", "s2", [125 * E2, 125 / E2])
    d = decide(["a", "b"], ["s1", "s2"], obs, RaceRule())
    assert dict(d.eliminated) == {}
    s1, s2 = d.boards
    assert s1.front == "a" and s1.rows[1].state == WORSE
    assert s2.front == "b" and s2.rows[1].candidate == "a" and s2.rows[1].state == WORSE
    assert d.done and s1.leader == "a" and s2.leader == "b"


def test_confidence_decides_the_elimination() -> None:
    # b 4% below a: high = exp(ln 0.96 + t * se) with se = 0.021082: t(0.95, 3) gives 1.0088 (not worse), so
    # not separated at 95%; at 80% (t(0.80, 3) = 0.978472) high = 0.9800 < 1: worse
    se = math.sqrt(0.0016 / 3) * math.sqrt(1 / 3 + 1 / 2)
    assert math.exp(math.log(0.96) + T95_DF3 * se) == pytest.approx(1.0088, abs=1e-4)
    assert math.exp(math.log(0.96) + 0.978472 * se) == pytest.approx(0.9800, abs=1e-4)
    obs = launches("a", "s", A3) + launches("b", "s", [96 * E2, 96 / E2])
    d95 = decide(["a", "b"], ["s"], obs, RaceRule(confidence=0.95))
    assert d95.boards[0].rows[1].state == TIED  # 1 <= 1.0007 < 1.02: cannot beat a by 2%
    d95_no_tie = decide(["a", "b"], ["s"], obs, RaceRule(confidence=0.95, tie_pct=0.0))
    assert d95_no_tie.boards[0].rows[1].state == OPEN and not d95_no_tie.done
    assert set(d95_no_tie.next) == {"a", "b"}
    d80 = decide(["a", "b"], ["s"], obs, RaceRule(confidence=0.80, tie_pct=0.0))
    assert "b" in d80.eliminated and d80.done


def test_identical_candidates_end_in_a_tie() -> None:
    # the same launch means for both: d = 0, sp = 0.001, se = 0.001 * sqrt(2/3), high = exp(t(0.95, 4) * se)
    means = [100 * math.exp(0.001), 100.0, 100 * math.exp(-0.001)]
    high = math.exp(T95_DF4 * 0.001 * math.sqrt(2 / 3))
    assert 1.0 < high < 1.02
    obs = launches("a", "s", means) + launches("b", "s", means)
    d = decide(["a", "b"], ["s"], obs, RaceRule())
    board = d.boards[0]
    assert board.rows[0].candidate == "a" and board.rows[0].state == LEADER  # equal means: candidate order
    assert board.rows[1].state == TIED and board.rows[1].vs_front_high == pytest.approx(high, rel=1e-9)
    assert board.leader == "a" and board.tied == ("a", "b")
    assert d.done and d.why_done == "every shape separated or tied within 2%"
    assert dict(d.eliminated) == {}


def test_one_launch_each_decides_nothing_and_asks_for_the_duel() -> None:
    obs = launches("a", "s", [100.0]) + launches("b", "s", [50.0]) + launches("c", "s", [99.0])
    d = decide(["a", "b", "c"], ["s"], obs, RaceRule())
    assert not d.done and dict(d.eliminated) == {}
    assert d.boards[0].leader is None and d.boards[0].front == "a"
    assert set(d.boards[0].open) == {"b", "c"}
    # no interval yet (no candidate has two launches): the challenger is the closest mean, c; a and c have one
    # launch each, so the challenger goes first; then the rest, all at one launch (odd): reversed order
    assert d.next == ("c", "b", "a")
    pairwise = decide(["a", "b", "c"], ["s"], obs, RaceRule(pool_spread=False))
    assert pairwise.next == ("c", "b", "a") and not pairwise.done


def test_warm_up_first_then_fewest_launches_first() -> None:
    assert decide(["a", "b", "c"], ["s"], [], RaceRule()).next == ("a", "b", "c")
    # min_launches 2: b is 20% down on a with a at 3 launches, but b and c have 1: no elimination yet
    obs = launches("a", "s", A3) + launches("b", "s", [80.0]) + launches("c", "s", [90.0])
    d = decide(["a", "b", "c"], ["s"], obs, RaceRule(min_launches=2))
    assert dict(d.eliminated) == {} and d.next == ("c", "b")  # count 1 (odd): reversed order
    obs += launches("b", "s", [80.0 / E2], start=1) + launches("c", "s", [90 * E2], start=1)
    d2 = decide(["a", "b", "c"], ["s"], obs, RaceRule(min_launches=2))
    assert set(d2.eliminated) == {"b", "c"}  # c: 9.1% below a, at most 5.5% below
    assert d2.done and d2.boards[0].leader == "a"


def test_next_is_the_duel_then_fewest_launches_first_in_abba_order() -> None:
    # a (3 launches, arithmetic mean 100.013) in front; b, c, d (2 each) have geometric means 99.995, 99.980 and
    # 99.9987 and the same standard error against a, so d has the highest upper bound: the challenger. a has more
    # launches than d, so d is launched first; then the rest fewest first: b, c (two: candidate order), a.
    obs = launches("a", "s", A3) + launches("b", "s", [99.0, 101.0]) + launches("c", "s", [98.0, 102.0])
    obs += launches("d", "s", [99.5, 100.5])
    d = decide(["a", "b", "c", "d"], ["s"], obs, RaceRule(tie_pct=0.0))
    assert d.boards[0].front == "a" and set(d.boards[0].open) == {"b", "c", "d"}
    assert d.next == ("d", "b", "c", "a")
    obs += launches("b", "s", [100.0], start=2)
    d = decide(["a", "b", "c", "d"], ["s"], obs, RaceRule(tie_pct=0.0))
    assert d.next == ("d", "c", "b", "a")  # d still the challenger; b and a at three (odd): reversed among them


def test_bonferroni_splits_the_error_over_the_comparisons() -> None:
    # b 4% below a (the bound hand-computed above: 1.0088 at 95% with 3 df); with two more candidates far below,
    # the per-comparison level is 1 - 0.05 / 3: t(0.98333, 3) = 3.7405 (scipy t.ppf): high = exp(ln 0.96 + t se)
    se = math.sqrt(0.0016 / 3) * math.sqrt(1 / 3 + 1 / 2)
    obs = launches("a", "s", A3) + launches("b", "s", [96 * E2, 96 / E2])
    obs += [Obs("c", "s", 0, (10.0,)), Obs("d", "s", 0, (10.0,))]  # one launch each: add no spread
    d = decide(["a", "b", "c", "d"], ["s"], obs, RaceRule())
    row_b = next(r for r in d.boards[0].rows if r.candidate == "b")
    assert row_b.vs_front_high == pytest.approx(math.exp(math.log(0.96) + 3.7405 * se), rel=1e-4)
    assert row_b.state == OPEN  # 1.0388 >= 1.02
    plain = decide(["a", "b", "c", "d"], ["s"], obs, RaceRule(bonferroni=False))
    assert next(r for r in plain.boards[0].rows if r.candidate == "b").state == TIED


def test_budget_stops_and_truncates() -> None:
    obs = launches("a", "s", [100.0]) + launches("b", "s", [99.0]) + launches("c", "s", [98.0])
    d = decide(["a", "b", "c"], ["s"], obs, RaceRule(max_launches=3))
    assert d.done and d.why_done == "budget spent: 3 of 3 launches" and d.next == ()
    d4 = decide(["a", "b", "c"], ["s"], obs, RaceRule(max_launches=4))
    assert not d4.done and d4.next == ("b",)  # the challenger closest to the front, a
    # the warm-up is cut by the budget too
    assert decide(["a", "b", "c"], ["s"], [], RaceRule(max_launches=2)).next == ("a", "b")


def test_failed_launches_count_and_drop_the_candidate() -> None:
    obs = [Obs("b", "s", 0, ()), Obs("b", "s", 1, ()), *launches("a", "s", A3)]
    d = decide(["a", "b"], ["s"], obs, RaceRule())
    assert d.eliminated["b"] == "2 launches gave no trial value at any shape"
    assert d.launches_spent == 5 and d.done and d.boards[0].leader == "a"
    d1 = decide(["a", "b"], ["s"], obs[1:], RaceRule())  # one failed launch: b gets another
    assert "b" not in d1.eliminated and "b" in d1.next


def test_bad_input_names_what_is_wrong() -> None:
    with pytest.raises(RaceError, match="confidence must be in"):
        RaceRule(confidence=1.5)
    with pytest.raises(RaceError, match="min_launches"):
        RaceRule(min_launches=0)
    with pytest.raises(RaceError, match="candidate 'x', shape 's', launch 0: unknown candidate"):
        decide(["a"], ["s"], [Obs("x", "s", 0, (1.0,))], RaceRule())
    with pytest.raises(RaceError, match="observed twice"):
        decide(["a"], ["s"], [Obs("a", "s", 0, (1.0,)), Obs("a", "s", 0, (2.0,))], RaceRule())
    with pytest.raises(RaceError, match="finite and > 0"):
        decide(["a"], ["s"], [Obs("a", "s", 0, (float("nan"),))], RaceRule())
    with pytest.raises(RaceError, match="given twice"):
        decide(["a", "a"], ["s"], [], RaceRule())


def test_a_candidate_failing_at_one_shape_stops_blocking_it() -> None:
    # b gives values at s1 only: after 2 launches without a value at s2 it is "no data" there, not open
    obs = launches("a", "s1", A3) + launches("a", "s2", A3)
    obs += [*launches("b", "s1", B2), Obs("b", "s2", 0, ()), Obs("b", "s2", 1, ())]
    d = decide(["a", "b"], ["s1", "s2"], obs, RaceRule())
    s2 = d.boards[1]
    assert next(r for r in s2.rows if r.candidate == "b").state == NO_DATA
    assert s2.leader == "a" and s2.open == ()
    assert "b" not in d.eliminated  # not worse at s2: it has no value there
    assert d.done and d.why_done == "every shape separated"


def test_nothing_to_launch_when_no_candidate_ever_gave_a_value_at_a_shape() -> None:
    obs = launches("a", "s1", A3) + [Obs("a", "s2", i, ()) for i in range(3)]
    d = decide(["a"], ["s1", "s2"], obs, RaceRule())
    assert d.done and d.why_done == "no launch can change the decision: no value at s2 from any candidate"
    assert d.next == () and d.boards[0].leader == "a" and d.boards[1].leader is None
