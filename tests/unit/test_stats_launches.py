"""Launch-level A/B statistics on known inputs (app.core.measure.stats): launch means, both spreads, the pooled
t interval on log launch means, the launches-to-resolve suggestion, verdicts; A/A rate and power of the model."""

from __future__ import annotations

import math
import random

import pytest

from app.core.measure.stats import (
    energy_clause,
    launch_arm_stats,
    launch_ratio_stats,
    launch_verdict,
    launches_to_resolve,
    t_quantile,
)

A = [[100.0, 102.0], [96.0, 98.0]]  # launch means 101, 97
B = [[130.0, 132.0], [124.0, 126.0]]  # launch means 131, 125


def test_arm_at_launch_level_on_known_values():
    st = launch_arm_stats(A)
    assert st.launch_values == [101.0, 97.0] and st.launches == 2 and st.trials == 4 and st.mean == 99.0
    # launch CV: stdev(101, 97) = 2 * sqrt(2), over 99; trial CV: within-launch SS 4 over 2 df = sqrt(2), over 99
    assert st.launch_cv == pytest.approx(2 * math.sqrt(2) / 99)
    assert st.trial_cv == pytest.approx(math.sqrt(2) / 99)
    half = 12.7062 * 2 * math.sqrt(2) / math.sqrt(2)  # t(0.975, 1) * s / sqrt(L)
    assert st.ci95 == pytest.approx((99 - half, 99 + half), abs=1e-3)
    # a launch with no successful trial is no observation; one trial per launch has no trial spread
    one = launch_arm_stats([[50.0], [], [52.0]])
    assert one.launch_values == [50.0, 52.0] and one.trial_cv is None
    assert launch_arm_stats([]).mean is None


def test_ratio_is_the_pooled_t_interval_on_log_launch_means():
    r = launch_ratio_stats(A, B)
    # by hand: d = mean log B - mean log A; each arm's SS of two logs is (difference)^2 / 2; pooled over 2 df
    d = 0.5 * math.log(131 * 125 / (101 * 97))
    sp = math.sqrt((math.log(101 / 97) ** 2 / 2 + math.log(131 / 125) ** 2 / 2) / 2)
    half = 4.302653 * sp * math.sqrt(1 / 2 + 1 / 2)
    assert r.ratio == pytest.approx(math.exp(d)) and r.ratio == pytest.approx(1.29284, abs=1e-5)
    assert r.df == 2.0
    assert r.ci95 == pytest.approx((math.exp(d - half), math.exp(d + half)), rel=1e-7)
    assert r.ci95 == pytest.approx((1.13166, 1.47698), abs=1e-5)
    assert r.significant


def test_trials_do_not_shrink_the_launch_interval():
    """Ten times the trials with the same launch means give the same interval: the launch is the unit."""
    many_a = [[101.0 + e for e in (-1, 1) * 5], [97.0 + e for e in (-1, 1) * 5]]
    many_b = [[131.0 + e for e in (-1, 1) * 5], [125.0 + e for e in (-1, 1) * 5]]
    assert launch_ratio_stats(many_a, many_b).ci95 == pytest.approx(launch_ratio_stats(A, B).ci95)


def test_one_launch_per_arm_has_no_interval_and_says_what_to_do():
    r = launch_ratio_stats([[100.0, 101.0, 99.0]], [[120.0, 121.0, 119.0]])
    assert r.ratio == pytest.approx(1.2) and r.ci95 is None
    text = launch_verdict([[100.0, 101.0, 99.0]], [[120.0, 121.0, 119.0]])
    assert "one launch per arm" in text and "at least 2 launches" in text
    assert "no successful trial" in launch_verdict([], B)
    # three launches in all is already one degree of freedom: an interval, wide (t = 12.7)
    assert launch_ratio_stats([[100.0]], [[120.0], [124.0]]).df == 1.0


def test_verdicts_faster_slower_and_more_launches():
    assert launch_verdict(A, B) == "B is 29% faster than A (95% CI 13-48%)"
    assert launch_verdict(B, A).startswith("B is 23% slower than A (95% CI")
    same = [[99.0, 101.0], [100.0, 98.0]]
    text = launch_verdict(A, same)
    assert text.startswith("no difference detectable with this launch-to-launch spread (B/A = 1.005")
    assert "more launches per arm (not more trials) would resolve 1%" in text


def test_launches_to_resolve_is_the_first_count_that_narrows_enough():
    same = [[99.0, 101.0], [100.0, 98.0]]
    n = launches_to_resolve(A, same, 0.02)
    assert n is not None and n > 2
    ya = [math.log(101), math.log(97)]
    yb = [math.log(100), math.log(99)]
    sp = math.sqrt((sum((y - sum(ya) / 2) ** 2 for y in ya) + sum((y - sum(yb) / 2) ** 2 for y in yb)) / 2)
    assert t_quantile(0.975, 2 * n - 2) * sp * math.sqrt(2 / n) <= math.log(1.02)
    assert t_quantile(0.975, 2 * n - 4) * sp * math.sqrt(2 / (n - 1)) > math.log(1.02)
    assert launches_to_resolve(A, same, 0.0) is None


def test_energy_clause_from_launch_level_j_per_token():
    a = [[0.50], [0.52]]
    b = [[0.41], [0.42]]
    text = energy_clause(a, b)
    assert text == "uses 19% less energy per token (95% CI 10-26%)"  # sqrt(.41 * .42 / (.50 * .52)) = 0.814
    assert energy_clause(a, [[0.51], [0.50]]).endswith("no difference detectable")
    assert energy_clause([], b) == "energy per token not measured"


def _two_level(rng: random.Random, mean: float, launches: int, trials: int, sigma_launch: float,
               sigma_trial: float) -> list[list[float]]:
    out = []
    for _ in range(launches):
        launch = mean * math.exp(rng.gauss(0, sigma_launch))
        out.append([launch * (1 + rng.gauss(0, sigma_trial)) for _ in range(trials)])
    return out


def _flat(launches: list[list[float]]) -> list[float]:
    return [v for launch in launches for v in launch]


def test_a_a_false_positive_rate_with_launch_noise_is_about_five_percent():
    """Launch noise 3% (the simulator's default) three times the trial noise: 2 launches x 3 trials per arm."""
    rng = random.Random(11)
    runs = 2000
    claims = sum(launch_ratio_stats(_two_level(rng, 50, 2, 3, 0.03, 0.01),
                                    _two_level(rng, 50, 2, 3, 0.03, 0.01)).significant for _ in range(runs))
    assert 0.03 <= claims / runs <= 0.07
    # the trial-level interval on the same data claims far more: why the launch is the unit
    from app.core.measure.stats import ratio_stats
    rng = random.Random(11)
    flat = sum(ratio_stats(_flat(_two_level(rng, 50, 2, 3, 0.03, 0.01)),
                           _flat(_two_level(rng, 50, 2, 3, 0.03, 0.01))).significant for _ in range(runs))
    assert flat / runs > 0.2


def test_power_on_the_steps_1_vs_3_gap_with_two_launches():
    rng = random.Random(5)
    runs = 1000
    found = sum(launch_ratio_stats(_two_level(rng, 37.5, 2, 3, 0.03, 0.01),
                                   _two_level(rng, 54.0, 2, 3, 0.03, 0.01)).significant for _ in range(runs))
    assert found / runs >= 0.97


def test_wilson_interval_on_printed_values():
    from app.core.measure.stats import wilson_interval

    assert wilson_interval(4, 40) == pytest.approx((0.03958, 0.23052), abs=1e-5)
    assert wilson_interval(0, 40) == pytest.approx((0.0, 0.08762), abs=1e-5)
    assert wilson_interval(20, 20) == pytest.approx((0.83887, 1.0), abs=1e-5)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_two_launches_that_agree_too_well_get_the_trials_floor():
    """Launch means 100, 100 and 110, 110: sp = 0, yet each launch's trials spread 8-10%; the floor holds."""
    a = [[95.0, 105.0], [96.0, 104.0]]
    b = [[105.0, 115.0], [106.0, 114.0]]
    ss = sum((math.log(x) - math.log(y)) ** 2 / 2 for x, y in ((105, 95), (104, 96), (115, 105), (114, 106)))
    floor = math.sqrt(ss / 4 / 2)  # within-launch variance of the logs (4 df) over T = 2
    d = math.log(110 / 100)
    r = launch_ratio_stats(a, b)
    assert r.ratio == pytest.approx(1.1) and r.df == 2.0
    assert r.ci95 == pytest.approx((math.exp(d - 4.302653 * floor), math.exp(d + 4.302653 * floor)), rel=1e-6)
    assert not r.significant  # the plain pooled sd (0) would have given the point (1.1, 1.1) and a claim
    # where the launches spread more than their trials allow, the floor changes nothing (the figures above)
    assert launch_ratio_stats(A, B).ci95 == pytest.approx((1.13166, 1.47698), abs=1e-5)
