"""Interval statistics shared by the tasks (per-evaluation intervals) and the analysis (seed
aggregation). A leaf module: it imports nothing from the project, so every layer may use it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

Z95 = 1.96  # two-sided 95% normal quantile


def wilson(k: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial rate k/n (95% for z = 1.96); (nan, nan) when n <= 0."""
    if n <= 0:
        return (float("nan"), float("nan"))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    # max(., 0): k slightly above n from float rounding must not take the root of a negative number
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_ci(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """(mean, low, high): the normal interval mean +- z * s.d. / sqrt(n), s.d. with n - 1.

    One value: the interval is that value (no spread to estimate); none: (nan, nan, nan).
    """
    n = len(values)
    if n == 0:
        nan = float("nan")
        return (nan, nan, nan)
    m = math.fsum(values) / n
    if n < 2:
        return (m, m, m)
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))
    return (m, *mean_ci_from_sd(m, sd, n, z))


def mean_ci_from_sd(mean: float, sd: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The same interval from a mean, a sample s.d. and a count (for aggregated tables)."""
    if n < 2:
        return (mean, mean)
    half = z * sd / math.sqrt(n)
    return (mean - half, mean + half)


# ---- Student t ------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (df > 0, not necessarily whole)."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (0.5 < p < 1), by bisection on t_cdf: 12.706 for (0.975, 1)."""
    if not 0.5 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df > 0, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def t_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student t interval mean +- t_{n-1} * s.d. / sqrt(n) (n >= 2 values)."""
    n = len(values)
    m = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return (m, m - half, m + half)


# ---- intervals across seeds ------------------------------------------------------------------
# How a model's number is summarised over its seeds (every seed scored on the same test examples):
# the value is the mean of the seed values, and the 95% interval is Student's t over those seed
# means (n_seeds - 1 degrees of freedom). Each seed mean already carries its own test-set noise, so
# the spread of the seed means measures both sources: which seed was trained, and which examples
# were drawn. With one seed the interval is that evaluation's own (Wilson for rates). When every
# seed scored exactly the same value the spread is 0 and says nothing, so the interval falls back to
# the evaluation noise alone: Wilson on the pooled count for rates, the pooled normal interval
# otherwise. A coverage simulation in tests/test_inference.py checks 93-97% for 2, 3 and 5 seeds.
SEED_METHOD = {
    "one": "1 seed: the evaluation's interval over its examples",
    "t": "t over seed means (n_seeds - 1 df)",
    "agree": "seeds agree exactly: pooled over examples",
}


def seed_interval(values: Sequence[float], rate: bool, n_examples: Sequence[int],
                  eval_lows: Sequence[float], eval_highs: Sequence[float]) -> tuple[float, float, str]:
    """(low, high, method key of SEED_METHOD) of the mean of `values` (one per seed).

    rate: 0/1 scores per example (the interval is clipped to [0, 1]); n_examples, eval_lows, eval_highs:
    each seed's evaluation size and its stored interval (used with one seed, or when seeds agree).
    """
    s = len(values)
    m = math.fsum(values) / s
    known = [(l, h) for l, h in zip(eval_lows, eval_highs) if _num(l) and _num(h)]
    if s == 1:
        if known:
            return (float(known[0][0]), float(known[0][1]), "one")
        # an evaluation stored without its interval: a rate's is Wilson of its count; a mean's is unknown
        return (*wilson(m * n_examples[0], int(n_examples[0])), "one") if rate else (math.nan, math.nan, "one")
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in values) / (s - 1))
    if sd > 0:
        half = t_quantile(0.975, s - 1) * sd / math.sqrt(s)
        lo, hi = m - half, m + half
        return ((max(lo, 0.0), min(hi, 1.0)) if rate else (lo, hi)) + ("t",)
    if rate:
        n = int(sum(n_examples))
        return (*wilson(m * n, n), "agree")
    if len(known) < s:
        return (math.nan, math.nan, "agree")
    # the seeds' evaluation half-widths, averaged in variance, for the mean of s evaluations
    half = math.sqrt(math.fsum(((h - l) / 2) ** 2 for l, h in known) / s) / math.sqrt(s)
    return (m - half, m + half, "agree")


def _num(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and not math.isnan(x)
