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
    # at k = 0 or k = n the bound is exactly 0 or 1 (centre -+ half loses that in the last bit: 2.2e-19 or
    # 0.9999999999999999 would put a perfect or zero score outside its own interval)
    low = 0.0 if k <= 0 else max(0.0, centre - half)
    high = 1.0 if k >= n else min(1.0, centre + half)
    return (low, high)


def mean_ci(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """(mean, low, high): the normal interval mean +- z * s.d. / sqrt(n), s.d. with n - 1.

    One value: the interval is that value (no spread to estimate); none: (nan, nan, nan).
    """
    n = len(values)
    if n == 0:
        return (math.nan,) * 3
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


# ---- Student t, chi-square, the logit-normal mean: scipy's special functions ---------------------------------
@lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (0.5 < p < 1): 12.706 for (0.975, 1)."""
    from scipy.special import stdtrit

    if not 0.5 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df > 0, got p={p}, df={df}")
    return float(stdtrit(df, p))


def t_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student t interval mean +- t_{n-1} * s.d. / sqrt(n) (n >= 2 values)."""
    n = len(values)
    m = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return (m, m - half, m + half)


@lru_cache(maxsize=256)
def chi2_quantile(p: float, df: float) -> float:
    """The p-quantile of chi-square with `df` degrees of freedom (0 < p < 1)."""
    from scipy.special import chdtri

    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"chi2_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    return float(chdtri(df, 1.0 - p))


@lru_cache(maxsize=8)
def _hermite(m: int):
    """(nodes, weights) of m-point Gauss-Hermite quadrature for E f(Z), Z standard normal (weights sum to 1)."""
    import numpy as np  # third-party, not the project: the module stays a leaf

    x, w = np.polynomial.hermite_e.hermegauss(m)
    return x, w / w.sum()


HERMITE_TOL = 1e-10  # logit_normal_mean's rule: nodes doubled from 32 until two rules agree within this


def logit_normal_mean(m: float, tau: float) -> float:
    """E expit(m + tau Z), Z standard normal: the mean rate of seeds whose logit rates are N(m, tau^2), by
    Gauss-Hermite rules of 32, 64, ... 256 nodes, the first that agrees with the one before within HERMITE_TOL
    (the 32-node rule alone was off by 3e-6 at tau = 2.6)."""
    from scipy.special import expit

    prev = None
    for k in (32, 64, 128, 256):
        x, w = _hermite(k)
        val = float(w @ expit(m + tau * x))
        if prev is not None and abs(val - prev) <= HERMITE_TOL:
            break
        prev = val
    return min(1.0, val)


# ---- intervals across seeds ------------------------------------------------------------------
# How a model's number is summarised over its seeds (every seed scored on the same test examples): the
# mean of the seed values, its 95% interval built from the seed values alone (seeds x examples are never
# pooled as independent trials). Each method (SEED_METHOD's keys), why and what it covers: docs/DESIGN.md,
# "Across seeds".
LOGIT_TAU_P = 0.15  # the lower chi-square quantile of the logit s.d.'s upper bound (an 85% one-sided bound)
SEED_METHOD = {
    "one": "1 seed: the evaluation's interval over its examples",
    "t": "t over seed means (n_seeds - 1 df)",
    "logit": "t over seed logit rates (n_seeds - 1 df), mapped to the mean rate",
    "split": "some seeds at 0 of n: share that learned (Clopper-Pearson) x their rate (logit), 97.5% each",
    "agree": "not estimable: every seed scored the same value (no spread between seeds to measure)",
    "unstored": "not estimable: 1 seed, stored without its interval (not a rate: no count to rebuild it from)",
}
SPLIT_LEVEL = 0.975  # each factor of a 'split' interval: two 97.5% intervals hold together >= 95%
DECLINED = frozenset({"agree", "unstored"})  # method keys whose interval is (nan, nan): no verdict may rest on them


def seed_interval(values: Sequence[float], rate: bool, n_examples: Sequence[int],
                  eval_lows: Sequence[float], eval_highs: Sequence[float],
                  bounds: tuple[float, float] | None = None) -> tuple[float, float, str]:
    """(low, high, method key of SEED_METHOD) of the mean of `values` (one per seed).

    rate: 0/1 scores per example (the 'logit' or 'split' interval, inside [0, 1]); n_examples, eval_lows, eval_highs:
    each seed's evaluation size and its stored interval (used with one seed). bounds: the metric's declared
    range (a mean of values in [0, 1] is clipped to it; rates are always in [0, 1]). A key in DECLINED comes
    with (nan, nan). Otherwise the mean lies inside [low, high], exactly.
    """
    s = len(values)
    m = math.fsum(values) / s
    bounds = (0.0, 1.0) if rate else bounds
    if s == 1:
        known = [(l, h) for l, h in zip(eval_lows, eval_highs) if _num(l) and _num(h)]
        if known:
            lo, hi = float(known[0][0]), float(known[0][1])
        elif rate:  # an evaluation stored without its interval: a rate's is Wilson of its count
            lo, hi = wilson(m * n_examples[0], int(n_examples[0]))
        else:
            return (math.nan, math.nan, "unstored")  # a mean's is unknown
        return (*_inside(lo, hi, m, bounds), "one")
    if max(values) - min(values) <= 1e-12:
        return (math.nan, math.nan, "agree")
    if rate and all(_num(n) and n > 0 for n in n_examples):
        learned = [(v, n) for v, n in zip(values, n_examples) if v > 0]
        if 2 <= len(learned) < s and max(learned)[0] - min(learned)[0] > 1e-12:
            q_lo, q_hi = clopper_pearson(len(learned), s, SPLIT_LEVEL)
            r_lo, r_hi = _logit_interval(*zip(*learned), level=SPLIT_LEVEL)
            return (*_inside(q_lo * r_lo, q_hi * r_hi, m, bounds), "split")
        return (*_inside(*_logit_interval(values, n_examples), m, bounds), "logit")
    return (*_inside(*t_ci(values)[1:], m, bounds), "t")


def _logit_interval(values: Sequence[float], n_examples: Sequence[int], level: float = 0.95) -> tuple[float, float]:
    """The 'logit' interval of SEED_METHOD for two or more seeds' rates (values[i] of n_examples[i])."""
    s = len(values)
    y = []
    for v, n in zip(values, n_examples):
        k = min(max(v * n, 0.0), float(n))
        y.append(math.log((k + 0.5) / (n - k + 0.5)))
    c = math.fsum(y) / s
    sd = math.sqrt(math.fsum((v - c) ** 2 for v in y) / (s - 1))
    half = t_quantile(0.5 + level / 2, s - 1) * sd / math.sqrt(s)
    taus = (sd, sd * math.sqrt((s - 1) / chi2_quantile(LOGIT_TAU_P, s - 1)))
    # E expit(m + tau Z) rises with m; with tau it falls above 1/2 and rises below: both taus at each end
    return (min(logit_normal_mean(c - half, t) for t in taus), max(logit_normal_mean(c + half, t) for t in taus))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial share k/n: 5 of 5 is [0.478, 1] at 95%."""
    a = (1 - level) / 2
    if k <= 0 or k >= n:  # closed forms at the ends (and scipy stays unimported where no seed split)
        return (0.0, 1.0 - a ** (1 / n)) if k <= 0 else (a ** (1 / n), 1.0)
    from scipy.special import betaincinv

    return (float(betaincinv(k, n - k + 1, a)), float(betaincinv(k + 1, n - k, 1 - a)))


def learned_share(values: Sequence[float]) -> tuple[int, float, float]:
    """(k, low, high): k of the seeds (rates) learned, scoring above 0 of n (the floor), with the 95%
    Clopper-Pearson interval of the share that learns: where all S learned, how many failures S seeds allow."""
    k = sum(v > 0 for v in values)
    return (k, *clopper_pearson(k, len(values)))


def _inside(lo: float, hi: float, m: float, bounds: tuple[float, float] | None) -> tuple[float, float]:
    """[lo, hi] clipped to the declared range and widened to hold the value m (exactly)."""
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return (min(lo, m), max(hi, m))


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
                "no verdict (not estimable) where no interval could be given; an interval from one seed of a "
                "model is about that seed (\"ahead on seed 0 only\"), never the recipe")
NO_VERDICT = "not estimable: no interval"
# the words of a verdict whose interval rests on one seed of a model (one seed pair): about those seeds only
ONE_SEED = "(one seed pair; not a claim about the recipe)"


def verdict(low: float, high: float, lower_is_better: bool = False, on: str | None = None,
            why: str = ONE_SEED) -> str:
    """'ahead', 'behind' or 'no detectable difference' for the interval of A - B (VERDICT_RULE); NO_VERDICT
    when the interval is missing (a declined seed interval, stats.DECLINED, leaves nothing to judge by).

    on: where the interval rests on one seed of a model, which ("seed 0", "seeds 0 / 1"): the words then
    say the verdict is about that seed pair only, `why` in parentheses ("ahead on seed 0 only (one seed
    pair; not a claim about the recipe)")."""
    if not (_num(low) and _num(high)):
        return NO_VERDICT
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


def paired_difference(a: dict, b: dict, rate: bool, *args, **kw) -> tuple[float, float, float, str, int]:
    """_paired's (difference, low, high, method, seeds), a rate's difference clipped to [-1, 1] (two seeds' t
    interval reached past it)."""
    diff, lo, hi, how, n = _paired(a, b, rate, *args, **kw)
    return (diff, max(lo, -1.0), min(hi, 1.0), how, n) if rate else (diff, lo, hi, how, n)


def _paired(a: dict, b: dict, rate: bool, a_scores: dict | None = None, b_scores: dict | None = None,
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
    ma, mb = mean(list(a.values())), mean(list(b.values()))
    diff = ma - mb
    if a_interval is None or b_interval is None:
        return (diff, math.nan, math.nan, "unpaired", min(len(a), len(b)))
    # each side's distance to its interval's ends, added in quadrature (A's low end with B's high end)
    down = math.hypot(ma - a_interval[0], b_interval[1] - mb)
    up = math.hypot(a_interval[1] - ma, mb - b_interval[0])
    return (diff, diff - down, diff + up, "unpaired", min(len(a), len(b)))
