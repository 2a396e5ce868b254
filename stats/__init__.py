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


# ---- paired comparisons ----------------------------------------------------------------------
PAIR_METHOD = {
    "seeds": "paired t over matched seeds (difference per seed, n - 1 df)",
    "welch": "Welch t over seed means (seeds not matched)",
    "examples": "paired over test examples within each seed pair",
    "unpaired": "unpaired: the two intervals combined (no per-example scores stored)",
}
VERDICT_RULE = ("ahead / behind: the whole 95% interval of the difference (A - B) lies on A's better / worse "
                "side of 0 (higher is better, except for losses and NLL); otherwise no detectable difference; "
                "an interval from one seed of a model is about that seed (\"ahead on seed 0 only\"), never the "
                "recipe")
# the words of a verdict whose interval rests on one seed of a model (one seed pair): about those seeds only
ONE_SEED = "(one seed pair; not a claim about the recipe)"


def verdict(low: float, high: float, lower_is_better: bool = False, on: str | None = None,
            why: str = ONE_SEED) -> str:
    """'ahead', 'behind' or 'no detectable difference' for the interval of A - B (VERDICT_RULE).

    on: where the interval rests on one seed of a model, which ("seed 0", "seeds 0 / 1"): the words then
    say the verdict is about that seed pair only, `why` in parentheses ("ahead on seed 0 only (one seed
    pair; not a claim about the recipe)")."""
    if not (_num(low) and _num(high)):
        word = "no detectable difference"
    else:
        if lower_is_better:
            low, high = -high, -low
        word = "ahead" if low > 0 else "behind" if high < 0 else "no detectable difference"
    if on is None:
        return word
    return f"{word} on {on} {why}" if word == "no detectable difference" else f"{word} on {on} only {why}"


def needs_examples(a: dict, b: dict) -> bool:
    """Whether paired_difference(a, b, ...) would use per-example scores (its "examples" method): one matched
    seed, one seed each, or two or more matched seeds whose differences are all equal (no spread to use)."""
    common = set(a) & set(b)
    if len(common) >= 2:
        return len({round(a[s] - b[s], 12) for s in common}) == 1
    return bool(common) or (len(a) == 1 and len(b) == 1)


def _examples_interval(pairs: list[tuple[Sequence[float], Sequence[float]]], rate: bool) -> tuple[float, float]:
    """95% interval of the mean over seed pairs of mean(a_i - b_i), a and b scored on the same examples.

    Rates: Agresti-Min's adjusted interval per seed pair (half a discordant pair added to each cell, so two
    models that agree on every example still get a width); other metrics: t over the per-example
    differences. Seed pairs are independent: their variances add, over k^2."""
    centres, variances = [], []
    for a, b in pairs:
        n = len(a)
        if rate:
            up = sum(1 for x, y in zip(a, b) if x > y) + 0.5
            down = sum(1 for x, y in zip(a, b) if x < y) + 0.5
            nn = n + 2
            centres.append((up - down) / nn)
            variances.append(((up + down) - (up - down) ** 2 / nn) / (nn * nn))
        else:
            d = [x - y for x, y in zip(a, b)]
            m = math.fsum(d) / n
            var = math.fsum((x - m) ** 2 for x in d) / (n - 1) / n if n > 1 else 0.0
            centres.append(m)
            variances.append(var * (t_quantile(0.975, n - 1) / Z95) ** 2 if n > 1 else 0.0)
    k = len(pairs)
    c = math.fsum(centres) / k
    half = Z95 * math.sqrt(math.fsum(variances)) / k
    return (c - half, c + half)


def paired_difference(a: dict, b: dict, rate: bool, a_scores: dict | None = None, b_scores: dict | None = None,
                      a_interval: tuple[float, float] | None = None,
                      b_interval: tuple[float, float] | None = None) -> tuple[float, float, float, str, int]:
    """(difference A - B, low, high, method key of PAIR_METHOD, seeds used) of two models scored on the
    same test examples. a, b: seed -> value; a_scores, b_scores: seed -> per-example scores (same example
    order for both models), or None where not stored; a_interval, b_interval: each model's own interval
    (the unpaired fallback).

    Two or more matched seeds: t over the per-seed differences (they vary with the seed and with the
    examples). Otherwise, where per-example scores exist: paired over examples within each seed pair
    (matched seeds, or the one seed of each). Seeds not matched, two or more each: Welch. Else unpaired.
    The difference always lies inside its interval."""
    common = sorted(set(a) & set(b))
    mean = lambda xs: math.fsum(xs) / len(xs)
    if len(common) >= 2:
        d = [a[s] - b[s] for s in common]
        diff = mean(d)
        if len({round(x, 12) for x in d}) > 1:
            _, lo, hi = t_ci(d)
            return (diff, lo, hi, "seeds", len(common))
        seed_pairs = [(s, s) for s in common]
    elif common:
        seed_pairs = [(common[0], common[0])]
    elif len(a) >= 2 and len(b) >= 2:
        va, vb = list(a.values()), list(b.values())
        ma, mb = mean(va), mean(vb)
        sa2 = math.fsum((x - ma) ** 2 for x in va) / (len(va) - 1) / len(va)
        sb2 = math.fsum((x - mb) ** 2 for x in vb) / (len(vb) - 1) / len(vb)
        se2 = sa2 + sb2
        if se2 > 0:
            df = se2 ** 2 / (sa2 ** 2 / (len(va) - 1) + sb2 ** 2 / (len(vb) - 1))
            half = t_quantile(0.975, df) * math.sqrt(se2)
            return (ma - mb, ma - mb - half, ma - mb + half, "welch", min(len(va), len(vb)))
        seed_pairs = []
    elif len(a) == 1 and len(b) == 1:
        seed_pairs = [(next(iter(a)), next(iter(b)))]
    else:
        seed_pairs = []
    used_a, used_b = [sa for sa, _ in seed_pairs], [sb for _, sb in seed_pairs]
    have = (seed_pairs and a_scores is not None and b_scores is not None
            and all(a_scores.get(sa) is not None and b_scores.get(sb) is not None
                    and len(a_scores[sa]) == len(b_scores[sb]) > 0 for sa, sb in seed_pairs))
    if have:
        diff = mean([a[s] for s in used_a]) - mean([b[s] for s in used_b])
        lo, hi = _examples_interval([(a_scores[sa], b_scores[sb]) for sa, sb in seed_pairs], rate)
        return (diff, min(lo, diff), max(hi, diff), "examples", len(seed_pairs))
    diff = mean(list(a.values())) - mean(list(b.values()))
    if a_interval is None or b_interval is None:
        return (diff, math.nan, math.nan, "unpaired", min(len(a), len(b)))
    ma, mb = mean(list(a.values())), mean(list(b.values()))
    # each side's distance to its interval's ends, added in quadrature (A's low end with B's high end)
    down = math.hypot(ma - a_interval[0], b_interval[1] - mb)
    up = math.hypot(a_interval[1] - ma, mb - b_interval[0])
    return (diff, diff - down, diff + up, "unpaired", min(len(a), len(b)))
