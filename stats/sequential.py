"""Claims decided with as few seeds as they need: a group-sequential t design for the mean of the matched
per-seed differences d_1, d_2, ... (A - B, one per seed), looked at after n_1 < n_2 < ... <= n_max seeds.

The method, its references and its guarantees: docs/DESIGN.md ("Claims": "Method", "Stopping undecided").
Repeated confidence intervals (Jennison & Turnbull) with the two-sided alpha spent over the looks by a
Lan-DeMets function (O'Brien-Fleming- or Pocock-type); the critical values c_k of the Student t statistics
themselves, found by simulating their joint law once (seeded, CALIBRATION_PATHS paths); differences equal
within the metric's resolution are tied; a claim stops undecided where its arms are constant or a decision
is futile (FUTILE).
tests/test_claims_sim.py checks the error rate by simulation.

A leaf module: numpy and scipy only, no project imports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

KINDS = ("beats", "matches_or_beats", "matches")
SPENDING = ("obrien-fleming", "pocock")
CALIBRATION_PATHS = 200_000
FUTILE = 0.01  # a claim whose chance of a decision by the last look is below this stops, undecided
METHOD = ("group-sequential repeated {level:g}% t intervals over the looks (Jennison & Turnbull), alpha spent "
          "by the Lan-DeMets {spending}-type function; critical values of the t statistics by simulation")


def _phi(x):
    from scipy.special import ndtr

    return ndtr(x)


def spent(t: float, alpha: float, spending: str) -> float:
    """The two-sided alpha spent by information fraction t (0 < t <= 1)."""
    from scipy.special import ndtri

    if spending == "obrien-fleming":
        return min(alpha, 2.0 - 2.0 * float(_phi(ndtri(1.0 - alpha / 2.0) / math.sqrt(t))))
    if spending == "pocock":
        return alpha * math.log(1.0 + (math.e - 1.0) * t)
    raise ValueError(f"spending must be one of {', '.join(SPENDING)} (got {spending!r})")


def looks_of(n_min: int, n_max: int, batch: int = 1) -> tuple[int, ...]:
    """The seed counts looked at: n_min, n_min + batch, ..., and n_max last."""
    if not (2 <= n_min <= n_max) or batch < 1:
        raise ValueError(f"need 2 <= min <= max and batch >= 1 (got min={n_min}, max={n_max}, batch={batch})")
    out = list(range(n_min, n_max + 1, batch))
    if out[-1] != n_max:
        out.append(n_max)
    return tuple(out)


@dataclass(frozen=True)
class Design:
    looks: tuple[int, ...]
    alpha: float
    spending: str
    crit: tuple[float, ...]  # c_k of look k: the interval is mean +- c_k * s / sqrt(n_k)

    @property
    def method(self) -> str:
        return METHOD.format(level=round(100 * (1 - self.alpha), 2), spending=self.spending)


@lru_cache(maxsize=64)
def design(n_min: int, n_max: int, batch: int = 1, alpha: float = 0.05, spending: str = "obrien-fleming",
           paths: int = CALIBRATION_PATHS, seed: int = 20210) -> Design:
    """The design of looks n_min, n_min + batch, ..., n_max at two-sided level alpha (cached)."""
    looks = looks_of(n_min, n_max, batch)
    spends = [spent(n / n_max, alpha, spending) for n in looks]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((paths, n_max))
    csum, csq = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    alive = np.ones(paths, dtype=bool)
    crit, before = [], 0.0
    for n, a in zip(looks, spends):
        mean = csum[:, n - 1] / n
        var = np.maximum(csq[:, n - 1] - n * mean * mean, 0.0) / (n - 1)
        t = np.abs(mean) * math.sqrt(n) / np.sqrt(var)
        m = int(round((a - before) * paths))  # paths allowed to cross first here
        cand = np.sort(t[alive])[::-1]
        c = float(cand[m]) if m < len(cand) else 0.0
        crit.append(c)
        alive &= t <= c
        before = a
    return Design(looks, alpha, spending, tuple(crit))


@dataclass(frozen=True)
class Decision:
    decision: str  # supported | refuted | undecided
    seeds: int  # seeds the decision used (the look it was taken at, or the last look reached)
    mean: float
    low: float
    high: float
    final: bool  # no more seeds can change it: decided, or the last look (n_max) reached undecided
    why: str = ""


def settles(kind: str, low: float, high: float, margin: float | None) -> str:
    """supported | refuted | undecided: what an interval [low, high] of A - B ("better" oriented) says of a claim."""
    m = margin or 0.0
    if kind == "beats":
        return "supported" if low > 0 else "refuted" if high < 0 else "undecided"
    if kind == "matches_or_beats":
        return "supported" if low > -m else "refuted" if high < -m else "undecided"
    if kind == "matches":
        if margin is None:
            raise ValueError("a matches claim needs its margin")
        return "supported" if -m < low and high < m else "refuted" if low > m or high < -m else "undecided"
    raise ValueError(f"claim kind must be one of {', '.join(KINDS)} (got {kind!r})")


def tied(values, resolution: float = 0.0) -> bool:
    """Whether `values` are all equal within half the metric's resolution (1/n for a rate over n examples), or
    within float noise (1e-9 of their size) where it has none."""
    v = np.asarray(values, dtype=float)
    return float(np.ptp(v)) <= max(resolution / 2, 1e-9 * max(1.0, float(np.abs(v).max())))


def interval_at(diffs, n: int, c: float, resolution: float = 0.0) -> tuple[float, float, float]:
    """(mean, low, high) of the first n differences, half-width c * s / sqrt(n); nan bounds when they are tied."""
    d = np.asarray(diffs[:n], dtype=float)
    mean = float(d.mean())
    if tied(d, resolution):  # every seed the same difference: no spread to estimate, nothing to decide on
        return mean, float("nan"), float("nan")
    half = c * float(d.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def chance(kind: str, margin: float | None, mean: float, s: float, n: int, d: Design) -> float:
    """P(the last look's interval settles the claim), were the seed differences N(mean, s^2): given the first n,
    the last look's mean is N(mean, s^2 (N - n) / N^2) and its half-width c_K s / sqrt(N)."""
    big_n = d.looks[-1]
    h, sd, m = d.crit[-1] * s / math.sqrt(big_n), s * math.sqrt(big_n - n) / big_n, margin or 0.0
    below = lambda x: float(_phi((x - mean) / sd))  # noqa: E731  P(last mean < x)
    if kind == "matches":
        return max(0.0, below(m - h) - below(h - m)) + below(-m - h) + 1 - below(m + h)
    edge = 0.0 if kind == "beats" else -m
    return below(edge - h) + 1 - below(edge + h)


def decide(diffs, d: Design, kind: str, margin: float | None = None, resolution: float = 0.0,
           arms: tuple | None = None) -> Decision:
    """The claim's decision from the per-seed differences in seed order, at the first look that settles it, or
    stops it: `arms` (A's and B's values per seed) constant, or a decision by the last look futile (FUTILE).
    resolution: the metric's (1/n for a rate over n examples), within which differences are tied."""
    nan = float("nan")
    reached = [(n, c) for n, c in zip(d.looks, d.crit) if n <= len(diffs)]
    if not reached:
        return Decision("undecided", len(diffs), float(np.mean(diffs)) if len(diffs) else nan, nan, nan, False,
                        f"fewer seeds than the first look ({d.looks[0]})")
    last = d.looks[-1]
    for n, c in reached:
        mean, lo, hi = interval_at(diffs, n, c, resolution)
        stop = f"stopped at {n} of {last} seeds" if n < last else f"all {last} seeds"
        if arms is not None and all(tied(x[:n], resolution) for x in arms):
            return Decision("undecided", n, mean, nan, nan, True, f"constant: every seed of A scored {arms[0][0]:.4g}"
                            f", of B {arms[1][0]:.4g}; {stop}")
        verdict = settles(kind, lo, hi, margin) if math.isfinite(lo) else "undecided"
        if verdict != "undecided":
            return Decision(verdict, n, mean, lo, hi, True)
        if math.isfinite(lo) and n < last:
            p = chance(kind, margin, mean, float(np.std(diffs[:n], ddof=1)), n, d)
            if p < FUTILE:
                return Decision("undecided", n, mean, lo, hi, True, f"futile: a {p:.0%} chance of a decision by "
                                f"{last} seeds; {stop}")
    why = "no spread among the seed differences" if not math.isfinite(lo) else ""
    return Decision("undecided", n, mean, lo, hi, n == last, why)


def simulate(d: Design, kind: str, margin: float | None, true_mean: float, sd: float, reps: int,
             seed: int = 0) -> dict:
    """Operating characteristics of a design by simulation from normal seed differences N(true_mean, sd):
    the share of each decision and the mean seeds used (for `study plan` and the docs)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(true_mean, sd, (reps, d.looks[-1]))
    counts = {"supported": 0, "refuted": 0, "undecided": 0}
    used = 0
    for row in x:
        r = decide(row, d, kind, margin)
        counts[r.decision] += 1
        used += r.seeds
    return {**{k: v / reps for k, v in counts.items()}, "mean_seeds": used / reps}
