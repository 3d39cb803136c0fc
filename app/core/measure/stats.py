"""Statistics of an A/B experiment: per-arm mean, spread and 95% interval; the B/A ratio with its interval; verdicts.

Per arm: the mean of the trial values (output tok/s of each trial), the sample standard deviation, and
the 95% interval mean ± t(0.975, n-1) · s / sqrt(n) (Student's t, because three to five trials is the
usual count and the normal quantile would claim ~40% too much certainty at n = 3).

The ratio B/A uses the delta method on the log of the ratio, with Welch-Satterthwaite degrees of freedom:

    log R = log(mean_B) - log(mean_A)
    se²   = s_B² / (n_B · mean_B²) + s_A² / (n_A · mean_A²)       (squared relative standard errors)
    df    = se⁴ / (v_B² / (n_B - 1) + v_A² / (n_A - 1))          with v = s² / (n · mean²)
    CI    = exp(log R ± t(0.975, df) · se)

Why this method: throughputs are positive and a speed-up is multiplicative, so the interval is built on
the log scale and comes back asymmetric and always positive; it needs no equal-variance assumption
(Welch); it is closed form and deterministic, so an export reproduces exactly. Fieller's interval is the
exact alternative but becomes unbounded when A's mean is not clearly away from zero (never our case) and
is harder to explain; a bootstrap is degenerate at the 2-5 trials an experiment has (three values have
only ten distinct resamples). The coefficient of variation of tok/s trials is a few percent, where the
delta method's first-order approximation is accurate.

The t quantile is computed here (regularised incomplete beta by continued fraction, then safeguarded Newton), so
the runtime needs no scipy; tests check it against printed table values.

Launches as the unit (what an A/B's verdict comes from; docs/decisions.md#ab-launches-as-the-unit): an arm
runs L launches of T trials each. One observation per launch: y = log(mean of the launch's trials). Two
launches of one config differ by more than two trials of one launch do (CUDA graphs, memory layout, clocks),
so only launches can tell a config's effect from a launch's luck. The B/A interval is the pooled two-sample
t interval on the y's:

    d   = mean(y_B) - mean(y_A)                        (B/A = exp(d), the ratio of geometric means)
    sp² = (Σ(y_A - ȳ_A)² + Σ(y_B - ȳ_B)²) / (L_A + L_B - 2)
    CI  = exp(d ± t(0.975, L_A + L_B - 2) · sp · sqrt(1/L_A + 1/L_B))

This is the exact test of the balanced two-level (launches within arms) model: the launch means' variance is
σ_launch² + σ_trial²/T, the same for both arms when the launch noise is multiplicative, so pooling is valid and
gives df = 2 at L = 2 (t = 4.30) where Welch's df would fall between 1 and 2 (t up to 12.7) and lose the power.
The second level sets a floor: a launch mean cannot vary less than its own trials allow, σ_trial²/T, and
σ_trial is estimated with L·(T-1) df per arm where sp has only 2, so sp is replaced by
max(sp, s_within / sqrt(T)) (s_within: the pooled within-launch sd of the log trials, T their harmonic mean
count). That only widens the interval, and only when two launches happened to agree better than their own
trials do (an sp estimated from 2 df is often tiny by chance). The df stay L_A + L_B - 2.
"More launches would resolve X%": the L per arm with t(0.975, 2L-2) · sp · sqrt(2/L) <= log(1+X).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95


# ---- Student's t ---------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom."""
    if df <= 0:
        raise ValueError("degrees of freedom must be positive")
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def _t_pdf(t: float, df: float) -> float:
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (|error| < 1e-10).

    Safeguarded Newton on t_cdf from the Cornish-Fisher start: a Newton step that leaves the bracket
    [low, high] known to hold the answer is replaced by bisection.
    """
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(p)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
        if high > 1e12:
            return math.inf
    z = statistics.NormalDist().inv_cdf(p)
    t = z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df * df)
    if not low < t < high:
        t = (low + high) / 2.0
    for _ in range(100):
        err = t_cdf(t, df) - p
        if err < 0:
            low = t
        else:
            high = t
        step = err / max(_t_pdf(t, df), 1e-300)
        nxt = t - step
        if not low < nxt < high:
            nxt = (low + high) / 2.0
        if abs(nxt - t) < 1e-12 * max(1.0, abs(t)) or high - low < 1e-12:
            return nxt
        t = nxt
    return t


# ---- per arm -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArmStats:
    """Mean, spread and 95% interval of one arm's trial values. stdev/ci95 are None below two trials."""

    n: int
    mean: float | None
    stdev: float | None
    ci95: tuple[float, float] | None

    @property
    def cv(self) -> float | None:
        """Relative spread (stdev / mean)."""
        if self.stdev is None or not self.mean:
            return None
        return self.stdev / self.mean


def arm_stats(values: list[float]) -> ArmStats:
    n = len(values)
    if n == 0:
        return ArmStats(0, None, None, None)
    mean = statistics.fmean(values)
    if n < 2:
        return ArmStats(1, mean, None, None)
    sd = statistics.stdev(values)
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    return ArmStats(n, mean, sd, (mean - half, mean + half))


# ---- B / A ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RatioStats:
    """B/A with its 95% interval (None when either arm has fewer than two trials)."""

    ratio: float | None
    ci95: tuple[float, float] | None
    df: float | None

    @property
    def significant(self) -> bool:
        """The interval excludes 1: a difference is claimed."""
        return self.ci95 is not None and (self.ci95[0] > 1.0 or self.ci95[1] < 1.0)


def ratio_stats(a: list[float], b: list[float]) -> RatioStats:
    sa, sb = arm_stats(a), arm_stats(b)
    if not sa.mean or not sb.mean or sa.mean <= 0 or sb.mean <= 0:
        return RatioStats(None, None, None)
    ratio = sb.mean / sa.mean
    if sa.stdev is None or sb.stdev is None:
        return RatioStats(ratio, None, None)
    va = sa.stdev**2 / (sa.n * sa.mean**2)
    vb = sb.stdev**2 / (sb.n * sb.mean**2)
    se2 = va + vb
    if se2 == 0.0:  # no noise at all: the interval is the point
        return RatioStats(ratio, (ratio, ratio), math.inf)
    df = se2**2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
    half = t_quantile(0.5 + CONFIDENCE / 2, df) * math.sqrt(se2)
    log_r = math.log(ratio)
    return RatioStats(ratio, (math.exp(log_r - half), math.exp(log_r + half)), df)


def _pct(x: float) -> str:
    return f"{abs(x - 1) * 100:.0f}%"


# ---- launches as the unit ------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchArmStats:
    """One arm at launch level: its launch means (the observations) and both spreads.

    launch_values: the mean of each launch's successful trials (launches without one left out);
    mean: their mean; ci95: t(L-1) interval of the launch means (None below two launches);
    launch_cv: stdev / mean of the launch means; trial_cv: the pooled within-launch stdev of the trials over
    the mean (None when no launch has two trials).
    """

    launch_values: list[float]
    trials: int
    mean: float | None
    ci95: tuple[float, float] | None
    launch_cv: float | None
    trial_cv: float | None

    @property
    def launches(self) -> int:
        return len(self.launch_values)


def launch_arm_stats(launches: list[list[float]]) -> LaunchArmStats:
    kept = [vals for vals in launches if vals]
    means = [statistics.fmean(vals) for vals in kept]
    trials = sum(len(vals) for vals in kept)
    if not means:
        return LaunchArmStats([], 0, None, None, None, None)
    st = arm_stats(means)
    launch_cv = st.cv
    ss = sum(sum((v - m) ** 2 for v in vals) for vals, m in zip(kept, means, strict=True))
    within_df = trials - len(kept)
    trial_cv = math.sqrt(ss / within_df) / st.mean if within_df > 0 and st.mean else None
    return LaunchArmStats(means, trials, st.mean, st.ci95, launch_cv, trial_cv)


def _logs(launches: list[list[float]]) -> list[float] | None:
    means = launch_arm_stats(launches).launch_values
    if not means or any(m <= 0 for m in means):
        return None
    return [math.log(m) for m in means]


def _pooled_sd(*ys: list[float]) -> float | None:
    """The pooled sd of several groups' values about their own means (df = sum of len - 1); None at df 0."""
    df = sum(len(y) - 1 for y in ys if y)
    if df < 1:
        return None
    ss = 0.0
    for y in ys:
        if y:
            m = statistics.fmean(y)
            ss += sum((v - m) ** 2 for v in y)
    return math.sqrt(ss / df)


@dataclass(frozen=True)
class LaunchSpread:
    """The sd of one log launch mean pooled over several configs (floored by their trials), with its df."""

    sd: float
    df: float


def pooled_launch_spread(arms: list[list[list[float]]]) -> LaunchSpread | None:
    """One launch-to-launch spread for many configs measured the same way: the pooled sd of their log launch means
    (df = sum of L_i - 1, configs with one launch add none), never below the trials' floor; None at df 0.

    The same assumption launch_ratio_stats makes between two arms (multiplicative launch noise of one size for
    every config), extended to k configs: the one-way ANOVA error term on the log scale."""
    logs = [y for y in (_logs(a) for a in arms) if y]
    sp = _pooled_sd(*logs)
    if sp is None:
        return None
    floor = _trial_floor_sd([launch for a in arms for launch in a])
    return LaunchSpread(sp if floor is None else max(sp, floor), float(sum(len(y) - 1 for y in logs)))


def _trial_floor_sd(launches: list[list[float]]) -> float | None:
    """The least standard deviation a log launch mean can have: the within-launch spread of the log trials
    (pooled over the launches) over sqrt(T), T the harmonic mean of trials per launch. None without within df."""
    kept = [vals for vals in launches if vals]
    if not kept or any(v <= 0 for vals in kept for v in vals):
        return None
    within_df = sum(len(vals) - 1 for vals in kept)
    if within_df < 1:
        return None
    ss = 0.0
    for vals in kept:
        logs = [math.log(v) for v in vals]
        m = statistics.fmean(logs)
        ss += sum((y - m) ** 2 for y in logs)
    harmonic_t = len(kept) / sum(1 / len(vals) for vals in kept)
    return math.sqrt(ss / within_df / harmonic_t)


def _launch_sd(a: list[list[float]], b: list[list[float]], ya: list[float], yb: list[float]) -> float | None:
    """The sd of one log launch mean: the pooled between-launch sd, never below the trials' floor."""
    sp = _pooled_sd(ya, yb)
    if sp is None:
        return None
    floor = _trial_floor_sd(a + b)
    return sp if floor is None else max(sp, floor)


def launch_ratio_stats(a: list[list[float]], b: list[list[float]], *, confidence: float = CONFIDENCE,
                       spread: LaunchSpread | None = None) -> RatioStats:
    """B/A from launch means (geometric), with the pooled t interval on their logs (df = L_A + L_B - 2).

    `confidence`: the two-sided level of the interval (0.95 by default; the racing rule of app.core.tune asks
    for 2c - 1 to read a one-sided bound at c). The field is still called ci95 whatever the level.
    `spread`: a launch spread pooled over more configs (pooled_launch_spread) to use instead of the two arms'
    own, with its df."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    ya, yb = _logs(a), _logs(b)
    if ya is None or yb is None:
        return RatioStats(None, None, None)
    d = statistics.fmean(yb) - statistics.fmean(ya)
    ratio = math.exp(d)
    if spread is not None:
        sp: float | None = spread.sd
        df = spread.df
    else:
        sp = _launch_sd(a, b, ya, yb)
        df = float(len(ya) + len(yb) - 2)
    if sp is None:
        return RatioStats(ratio, None, None)
    se = sp * math.sqrt(1 / len(ya) + 1 / len(yb))
    if se == 0.0:
        return RatioStats(ratio, (ratio, ratio), df)
    half = t_quantile(0.5 + confidence / 2, df) * se
    return RatioStats(ratio, (math.exp(d - half), math.exp(d + half)), df)


MAX_LAUNCHES_SUGGESTED = 100


def launches_to_resolve(a: list[list[float]], b: list[list[float]], effect: float) -> int | None:
    """Launches per arm (total) for a 95% interval of log(B/A) narrower than log(1 + effect), at this spread."""
    ya, yb = _logs(a), _logs(b)
    if ya is None or yb is None or effect <= 0:
        return None
    sp = _launch_sd(a, b, ya, yb)
    if sp is None:
        return None
    target = math.log1p(effect)
    for n in range(2, MAX_LAUNCHES_SUGGESTED + 1):
        if t_quantile(0.975, 2 * n - 2) * sp * math.sqrt(2 / n) <= target:
            return n
    return None


def launch_verdict(a: list[list[float]], b: list[list[float]], *, a_name: str = "A", b_name: str = "B") -> str:
    """The verdict from launches: "B is 31% faster than A (95% CI 27-35%)", or why nothing can be claimed."""
    ra = launch_ratio_stats(a, b)
    if ra.ratio is None:
        return f"no verdict: {a_name} or {b_name} has no successful trial"
    la, lb = launch_arm_stats(a).launches, launch_arm_stats(b).launches
    if ra.ci95 is None:
        return (f"{b_name}/{a_name} = {ra.ratio:.3f} from one launch per arm: no interval (trials of one launch "
                "measure that launch's noise only); run at least 2 launches per arm for a verdict")
    low, high = ra.ci95
    if ra.significant:
        word = "faster" if ra.ratio > 1 else "slower"
        lo_pct, hi_pct = sorted((abs(low - 1) * 100, abs(high - 1) * 100))
        return f"{b_name} is {_pct(ra.ratio)} {word} than {a_name} (95% CI {lo_pct:.0f}-{hi_pct:.0f}%)"
    effect = max(abs(ra.ratio - 1.0), 0.01)
    needed = launches_to_resolve(a, b, effect)
    n_now = min(la, lb)
    if needed is None:
        more = (f"more than {MAX_LAUNCHES_SUGGESTED} launches per arm would be needed to resolve "
                f"{effect * 100:.0f}%")
    else:
        more = (f"about {max(needed - n_now, 1)} more launches per arm (not more trials) would resolve "
                f"{effect * 100:.0f}%")
    return (f"no difference detectable with this launch-to-launch spread ({b_name}/{a_name} = {ra.ratio:.3f}, "
            f"95% CI {low:.3f}-{high:.3f}); {more}")


def energy_clause(a: list[list[float]], b: list[list[float]], *, a_name: str = "A", b_name: str = "B") -> str:
    """The energy half of a verdict from launch-level J/token values: "uses 18% less energy per token"."""
    ra = launch_ratio_stats(a, b)
    if ra.ratio is None:
        return "energy per token not measured"
    word = "less" if ra.ratio < 1 else "more"
    if ra.ci95 is None:
        return f"uses {_pct(ra.ratio)} {word} energy per token (one launch per arm: no interval)"
    low, high = ra.ci95
    if ra.significant:
        lo_pct, hi_pct = sorted((abs(low - 1) * 100, abs(high - 1) * 100))
        return f"uses {_pct(ra.ratio)} {word} energy per token (95% CI {lo_pct:.0f}-{hi_pct:.0f}%)"
    return (f"energy per token {b_name}/{a_name} = {ra.ratio:.3f} (95% CI {low:.3f}-{high:.3f}), "
            "no difference detectable")


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a binomial proportion: for "k of n experiments claimed"."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n > 0 (got {successes} of {n})")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
