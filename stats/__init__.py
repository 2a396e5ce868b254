"""Interval statistics shared by the tasks (per-evaluation intervals) and the analysis (seed
aggregation). A leaf module: it imports nothing from the project, so every layer may use it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

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
