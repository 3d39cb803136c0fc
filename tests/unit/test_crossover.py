"""The crossover statistics of `ab --slots 2` (app.core.measure.crossover) on hand-computed inputs."""

from __future__ import annotations

import math

import pytest

from app.core.measure.crossover import SlotLaunch, crossover_rounds, crossover_stats, crossover_verdict
from app.core.measure.stats import launch_ratio_stats


def _arm(*pairs: tuple[int, float]) -> list[SlotLaunch]:
    return [SlotLaunch(slot, [value]) for slot, value in pairs]


def test_rounds_alternate_the_slots():
    assert crossover_rounds(4) == [(0, 1), (1, 0), (0, 1), (1, 0)]
    assert crossover_rounds(1) == [(0, 1)]


def test_a_constant_slot_bias_cancels_exactly():
    # B is truly 10% faster, slot 1 truly 4% slower, no other noise: A 100 on slot 0, 96 on slot 1
    a = _arm((0, 100.0), (1, 96.0), (0, 100.0), (1, 96.0))
    b = _arm((1, 105.6), (0, 110.0), (1, 105.6), (0, 110.0))
    st = crossover_stats(a, b)
    assert st.ratio == pytest.approx(1.1, abs=1e-12)
    assert st.slot_ratio == pytest.approx(0.96, abs=1e-12)
    assert st.df == 5 and st.launches_on == ((2, 2), (2, 2))
    assert st.ratio_ci == pytest.approx((1.1, 1.1))  # no residual at all: the interval is the point


def test_an_odd_launch_count_still_removes_the_bias():
    # A == B, slot 1 4% slower, 3 launches each: A on 0 1 0, B on 1 0 1; the plain ratio is biased by 0.96^(1/3)
    a = _arm((0, 100.0), (1, 96.0), (0, 100.0))
    b = _arm((1, 96.0), (0, 100.0), (1, 96.0))
    st = crossover_stats(a, b)
    assert st.naive_ratio == pytest.approx(0.96 ** (1 / 3))
    assert launch_ratio_stats([[100.0], [96.0], [100.0]], [[96.0], [100.0], [96.0]]).ratio == pytest.approx(
        st.naive_ratio)
    assert st.ratio == pytest.approx(1.0, abs=1e-12)
    assert st.slot_ratio == pytest.approx(0.96, abs=1e-12)
    assert st.launches_on == ((2, 1), (1, 2))
    assert "odd launch count" in crossover_verdict(st)


def test_the_estimates_and_intervals_by_hand():
    # logs: A slot 0 [0, .02], slot 1 [-.04, -.02]; B slot 0 [.10, .12], slot 1 [.06, .04]
    # c_A = -.03 - .01 = -.04, c_B = .05 - .11 = -.06, w = 1 each: s = -.05
    # within-cell SS 4 x .0002 = .0008, interaction 1 x .01^2 x 2 = .0002: RSS .001, df 8 - 3 = 5, sigma^2 .0002
    # d = .08 - (-.01) = .09, se_d = sqrt(.0002 x (1/4 + 1/4)) = .01; se_s = sqrt(.0002 / 2) = .01; t(.975, 5) 2.5706
    e = math.exp
    a = _arm((0, e(0.0)), (1, e(-0.04)), (0, e(0.02)), (1, e(-0.02)))
    b = _arm((1, e(0.06)), (0, e(0.10)), (1, e(0.04)), (0, e(0.12)))
    st = crossover_stats(a, b)
    t = 2.570582
    assert st.df == 5
    assert math.log(st.slot_ratio or 0) == pytest.approx(-0.05)
    assert math.log(st.ratio or 0) == pytest.approx(0.09)
    assert st.slot_ci == pytest.approx((e(-0.05 - t * 0.01), e(-0.05 + t * 0.01)), rel=1e-6)
    assert st.ratio_ci == pytest.approx((e(0.09 - t * 0.01), e(0.09 + t * 0.01)), rel=1e-6)
    assert st.slot_significant and st.significant
    verdict = crossover_verdict(st)
    assert verdict.startswith("B is 9.4% faster than A") and "slot 1 runs 4.9% slower than slot 0" in verdict


def test_equal_slots_and_arms_claim_nothing():
    e = math.exp
    a = _arm((0, e(0.01)), (1, e(-0.01)), (0, e(-0.02)), (1, e(0.015)))
    b = _arm((1, e(0.0)), (0, e(0.02)), (1, e(-0.015)), (0, e(0.005)))
    st = crossover_stats(a, b)
    assert not st.slot_significant and not st.significant
    verdict = crossover_verdict(st)
    assert verdict.startswith("no difference detectable") and "no slot difference detectable" in verdict


def test_trials_floor_the_spread():
    # launch means agree exactly, but each launch's own two trials spread: the interval is not a point
    a = [SlotLaunch(0, [99.0, 101.0]), SlotLaunch(1, [95.0, 97.0]), SlotLaunch(0, [99.0, 101.0]),
         SlotLaunch(1, [95.0, 97.0])]
    b = [SlotLaunch(1, [95.0, 97.0]), SlotLaunch(0, [99.0, 101.0]), SlotLaunch(1, [95.0, 97.0]),
         SlotLaunch(0, [99.0, 101.0])]
    st = crossover_stats(a, b)
    assert st.ratio == pytest.approx(1.0) and st.ratio_ci is not None and st.ratio_ci[0] < 0.99


def test_not_estimable_without_both_slots():
    st = crossover_stats(_arm((0, 100.0), (0, 101.0)), _arm((1, 96.0), (1, 97.0)))
    assert st.slot_ratio is None and st.ratio is None and st.naive_ratio is not None
    assert "cannot be told apart" in crossover_verdict(st)
    assert crossover_stats([], _arm((0, 1.0))).naive_ratio is None
