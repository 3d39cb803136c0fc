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

"More trials would resolve X%": with the arms' relative variances (cv²) the number of trials per arm n
such that t(0.975, 2n-2) · sqrt((cv_A² + cv_B²) / n) <= log(1 + X); X is the observed difference, or
1% when the observed difference is smaller than that.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95
MAX_TRIALS_SUGGESTED = 1000


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


def trials_to_resolve(a: list[float], b: list[float], effect: float) -> int | None:
    """Trials per arm (total, not more) for a 95% interval of log(B/A) narrower than log(1 + effect)."""
    sa, sb = arm_stats(a), arm_stats(b)
    if sa.cv is None or sb.cv is None or effect <= 0:
        return None
    rel_var = sa.cv**2 + sb.cv**2
    target = math.log1p(effect)
    for n in range(2, MAX_TRIALS_SUGGESTED + 1):
        if t_quantile(0.975, 2 * n - 2) * math.sqrt(rel_var / n) <= target:
            return n
    return None


def _pct(x: float) -> str:
    return f"{abs(x - 1) * 100:.0f}%"


def verdict(a: list[float], b: list[float], *, a_name: str = "A", b_name: str = "B", unit: str = "") -> str:
    """A plain sentence: "B is 31% faster (27-35%)", or why nothing can be claimed."""
    ra = ratio_stats(a, b)
    if ra.ratio is None:
        return f"no verdict: {a_name} or {b_name} has no successful trial"
    if ra.ci95 is None:
        return (f"{b_name}/{a_name} = {ra.ratio:.3f} from single trials: no interval; "
                "run at least 2 trials per arm for a verdict")
    low, high = ra.ci95
    if ra.significant:
        word = "faster" if ra.ratio > 1 else "slower"
        lo_pct, hi_pct = sorted((abs(low - 1) * 100, abs(high - 1) * 100))
        return f"{b_name} is {_pct(ra.ratio)} {word} than {a_name} (95% CI {lo_pct:.0f}-{hi_pct:.0f}%)"
    effect = max(abs(ra.ratio - 1.0), 0.01)
    needed = trials_to_resolve(a, b, effect)
    n_now = min(len(a), len(b))
    if needed is None:
        more = f"more than {MAX_TRIALS_SUGGESTED} trials per arm would be needed to resolve {effect * 100:.0f}%"
    else:
        more = f"about {max(needed - n_now, 1)} more trials per arm would resolve {effect * 100:.0f}%"
    return (f"no difference detectable with this noise ({b_name}/{a_name} = {ra.ratio:.3f}, "
            f"95% CI {low:.3f}-{high:.3f}); {more}")
