"""Statistics of A/B runs on known inputs: t quantiles, arm intervals, the B/A interval, verdict sentences."""

import math
import random

import pytest

from app.core.measure.stats import arm_stats, ratio_stats, t_cdf, t_quantile


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (30, 2.0423), (1000, 1.9623)],
)
def test_t_quantile_matches_printed_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_t_quantile_is_symmetric_and_inverts_the_cdf():
    assert t_quantile(0.5, 3) == 0.0
    assert t_quantile(0.025, 5) == pytest.approx(-t_quantile(0.975, 5))
    for df in (1.5, 2.7, 12.3):
        assert t_cdf(t_quantile(0.9, df), df) == pytest.approx(0.9, abs=1e-9)


def test_arm_interval_on_known_values():
    st = arm_stats([10.0, 11.0, 12.0])
    assert st.mean == 11.0 and st.stdev == 1.0
    half = 4.3027 / math.sqrt(3)
    assert st.ci95 == pytest.approx((11 - half, 11 + half), abs=1e-3)
    assert st.cv == pytest.approx(1 / 11)


def test_one_trial_has_a_mean_but_no_interval():
    st = arm_stats([5.0])
    assert (st.n, st.mean, st.stdev, st.ci95) == (1, 5.0, None, None)
    assert arm_stats([]).mean is None


def test_ratio_interval_by_log_delta_method():
    a, b = [100.0, 102.0, 98.0], [131.0, 129.0, 133.0]
    r = ratio_stats(a, b)
    assert r.ratio == pytest.approx(1.31)
    # by hand: relative variances 4/(3*100^2) and 4/(3*131^2), Welch df, t quantile, exp of log ratio +- half
    va, vb = 4 / 3 / 100**2, 4 / 3 / 131**2
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    assert r.df == pytest.approx(df)
    assert r.ci95 == pytest.approx((1.31 * math.exp(-half), 1.31 * math.exp(half)))
    assert r.significant


def test_a_a_false_positive_rate_is_about_five_percent():
    """The interval's coverage on pure noise: A/A claims a difference in ~5% of experiments."""
    rng = random.Random(7)
    claims = 0
    runs = 1000
    for _ in range(runs):
        a = [50 * (1 + rng.gauss(0, 0.03)) for _ in range(3)]
        b = [50 * (1 + rng.gauss(0, 0.03)) for _ in range(3)]
        claims += ratio_stats(a, b).significant
    assert 0.025 <= claims / runs <= 0.075


def test_a_b_power_with_three_trials_on_a_45_percent_gap():
    rng = random.Random(3)
    for _ in range(100):
        a = [37.5 * (1 + rng.gauss(0, 0.03)) for _ in range(3)]
        b = [54.0 * (1 + rng.gauss(0, 0.03)) for _ in range(3)]
        assert ratio_stats(a, b).ci95[0] > 1.0  # type: ignore[index]
