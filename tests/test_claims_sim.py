"""The sequential claims rule (stats/sequential.py) by simulation: seed-level differences drawn from a
known truth, many repetitions, the tool's own looks (min 2, max 8, batch 1). Under a true difference of 0
(and, for the margin claims, at the margin) it decides wrongly at most 5% of the time plus Monte-Carlo
error; the naive rule (stop at the first ordinary 95% t interval that excludes 0) is shown to fail the same
bound in the same test. Power and mean seeds used are printed (docs/DESIGN.md, "Claims", records them)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from stats import t_quantile
from stats.sequential import decide, design, looks_of, settles, simulate

REPS = 4000
BOUND = 0.05 + 3 * math.sqrt(0.05 * 0.95 / REPS)  # 5% plus three Monte-Carlo standard errors (~6.0%)


def naive_wrong(x: np.ndarray, looks) -> float:
    """Share of rows where some look's ordinary 95% t interval excludes 0 (the naive stopping rule)."""
    wrong = 0
    for row in x:
        for n in looks:
            d = row[:n]
            half = t_quantile(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
            if abs(d.mean()) > half:
                wrong += 1
                break
    return wrong / len(x)


def test_beats_under_no_difference_sequential_holds_and_naive_fails():
    d = design(2, 8, 1)
    rng = np.random.default_rng(7)
    x = rng.normal(0.0, 0.03, (REPS, 8))
    wrong = sum(decide(row, d, "beats").decision != "undecided" for row in x) / REPS
    naive = naive_wrong(x, d.looks)
    print(f"\ntrue difference 0: sequential wrong {wrong:.3f}, naive wrong {naive:.3f} (bound {BOUND:.3f})")
    assert wrong <= BOUND
    assert naive > BOUND  # the naive rule's inflated rate, in the same draws: the test can fail


@pytest.mark.parametrize("kind", ["matches", "matches_or_beats"])
def test_margin_claims_at_the_margin(kind):
    margin = 0.02
    d = design(2, 8, 1)
    rng = np.random.default_rng(11)
    truth = margin if kind == "matches" else -margin  # the edge of what the claim says
    x = rng.normal(truth, 0.02, (REPS, 8))
    wrong = sum(decide(row, d, kind, margin).decision == "supported" for row in x) / REPS
    # the naive rule: support at the first ordinary 95% t interval inside the claim's region
    naive = 0
    for row in x:
        for n in d.looks:
            r = row[:n]
            half = t_quantile(0.975, n - 1) * r.std(ddof=1) / math.sqrt(n)
            if settles(kind, r.mean() - half, r.mean() + half, margin) == "supported":
                naive += 1
                break
    naive /= REPS
    print(f"\n{kind} at the margin: sequential wrong {wrong:.3f}, naive wrong {naive:.3f}")
    assert wrong <= BOUND
    assert naive > wrong
    assert naive > BOUND  # the naive rule's inflated rate at the margin too (7.4% and 9.1% in these draws)


def test_heavy_tailed_seed_differences_still_hold():
    """Not normal: t with 3 df (heavy tails) under a true difference of 0."""
    d = design(2, 8, 1)
    x = np.random.default_rng(3).standard_t(3, (REPS, 8))
    wrong = sum(decide(row, d, "beats").decision != "undecided" for row in x) / REPS
    assert wrong <= BOUND


def test_power_and_seeds_used_printed():
    d = design(2, 8, 1)
    lines = []
    for eff in (0.5, 1.0, 1.5, 2.5):  # true mean difference in units of the seed s.d.
        r = simulate(d, "beats", None, eff, 1.0, 2000, seed=5)
        lines.append(f"effect {eff} sd: supported {r['supported']:.3f}, mean seeds {r['mean_seeds']:.2f}")
    print("\n" + "\n".join(lines))
    big = simulate(d, "beats", None, 2.5, 1.0, 2000, seed=5)
    assert big["supported"] > 0.95 and big["mean_seeds"] < 6  # a large effect is decided early


def test_design_and_decision_rules():
    assert looks_of(2, 8, 3) == (2, 5, 8)
    with pytest.raises(ValueError):
        looks_of(1, 8)
    d = design(2, 8, 1)
    assert all(a > b for a, b in zip(d.crit, d.crit[1:]))  # O'Brien-Fleming: strict early, looser late
    assert d.crit[-1] > t_quantile(0.975, 7)  # the last look pays for the earlier ones
    r = decide([0.01, 0.01, 0.01], d, "beats")  # no spread: nothing to decide on
    assert r.decision == "undecided" and "spread" in r.why
    r = decide([0.1], d, "beats")
    assert r.decision == "undecided" and not r.final
    assert settles("matches", -0.01, 0.01, 0.02) == "supported"
    assert settles("matches", 0.03, 0.05, 0.02) == "refuted"
    with pytest.raises(ValueError):
        settles("matches", -0.01, 0.01, None)


# ---- issue 42: the decision path the tool uses (design_of + decide with the metric's resolution and the arms) --
def _seed_rates(rng, n: int, p: float, shape: str, seeds: int, tau: float = 0.3):
    """One model's rates on n examples at `seeds` seeds: logit rate logit(p) + a seed effect (normal, t with 3 df
    scaled to the same s.d., or bimodal: +-tau), each scored as Binomial(n, rate) / n."""
    from scipy.special import expit, logit

    if shape == "normal":
        e = rng.normal(0.0, tau, seeds)
    elif shape == "heavy":
        e = tau * rng.standard_t(3, seeds) / math.sqrt(3)
    else:
        e = tau * rng.choice([-1.0, 1.0], seeds)
    return rng.binomial(n, expit(logit(p) + e)) / n


def null_error(n: int, p: float, shape: str, reps: int, seed: int = 1) -> tuple[int, float]:
    """(wrong decisions, mean seeds) of `reps` simulated studies of one beats claim whose two models are the same
    recipe (every decision is wrong), seeds 2..8, decided as analysis/claims.py's evaluate decides."""
    d = design(2, 8, 1)
    rng = np.random.default_rng(seed)
    wrong = used = 0
    for _ in range(reps):
        a, b = _seed_rates(rng, n, p, shape, 8), _seed_rates(rng, n, p, shape, 8)
        r = decide(a - b, d, "beats", None, 1.0 / n, (a, b))
        wrong += r.decision != "undecided"
        used += r.seeds
    return wrong, used / reps


SETTINGS = [(n, p, shape) for n in (24, 40, 100, 500) for p in (0.5, 0.97) for shape in ("normal", "heavy", "bimodal")]


def _null_per_claim(settings, reps: int):
    total = 0
    for n, p, shape in settings:
        wrong, used = null_error(n, p, shape, reps)
        bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)
        print(f"n={n} rate {p} {shape}: wrong {wrong / reps:.4f} (bound {bound:.4f}, {reps} studies), seeds {used:.2f}")
        assert wrong / reps <= bound, (n, p, shape, wrong / reps)
        total += wrong
    pooled = len(settings) * reps
    # pooled over the settings: 5% + 3 Monte-Carlo SE of the pooled count (ties decided on float noise gave
    # 6.5-7.9% at n = 24-40, issue 42)
    assert total / pooled <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / pooled), total / pooled


def test_null_error_per_claim_rates_sizes_and_shapes():
    """Under a true null, wrong decisions per claim <= 5% + 3 SE at n = 24 and 500 (300 studies per setting,
    SE 1.3%; pooled over the 12 settings, 3,600 studies, SE 0.36%); all 24 settings at 4,000: the slow test."""
    _null_per_claim([s for s in SETTINGS if s[0] in (24, 500)], 300)


@pytest.mark.slow
def test_null_error_per_claim_every_setting_slow():
    """n = 24, 40, 100, 500 x rates 0.5, 0.97 x normal, heavy-tailed, bimodal seeds: 4,000 studies each (SE 0.34%;
    measured 2.5-5.4%, 96,000 studies pooled; 80 s on a loaded 2-core machine)."""
    _null_per_claim(SETTINGS, 4000)


def family_error(alpha: str, reps: int, seed: int = 2) -> float:
    """Share of null studies of grids/cpu/claims.yaml's four claims (VPR on 500 puzzles; (1 x 2) vs (1 x 1) equal
    at T = 1, 2; (1 x 2) 0.02 below (2 x 1) at T = 4, 8: the margin's edge) with at least one wrong decision."""
    import yaml
    from scipy.special import expit, logit

    from analysis.claims import design_of
    from study.spec.grid import expand
    from tests.helpers import ROOT

    raw = yaml.safe_load(open(f"{ROOT}/grids/cpu/claims.yaml"))
    spec = expand({**raw, "claims_alpha": alpha}, "claims.yaml").claims.spec()
    d, n = design_of(spec), 500
    assert len(spec["claims"]) == 4
    rng = np.random.default_rng(seed)
    rate = lambda p: rng.binomial(n, expit(logit(p) + rng.normal(0.0, 0.3, 8))) / n  # noqa: E731
    bad = 0
    for _ in range(reps):
        wrong = False
        for c in spec["claims"]:
            if c["kind"] == "beats":
                a, b = rate(0.4), rate(0.4)
            else:
                b = rate(0.9)
                a = np.round((b - c["margin"]) * n) / n
            r = decide(a - b, d, c["kind"], c["margin"], 1.0 / n, (a, b))
            wrong |= r.decision == "supported" if c["kind"] != "beats" else r.decision != "undecided"
        bad += wrong
    return bad / reps


def test_family_wise_error_of_the_four_cpu_claims():
    """Family-wise by default: <= 5% + 3 SE (1,000 studies, SE 0.7%); the per-claim design, in the same draws,
    is wrong about 10% of the time (the test can fail)."""
    reps = 1000
    fam, per = family_error("family", reps), family_error("per-claim", reps)
    print(f"\nfamily-wise error: {fam:.3f} (family), {per:.3f} (per-claim), {reps} studies")
    assert fam <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)
    assert per > 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)


def test_design_md_critical_values_are_the_codes():
    """docs/DESIGN.md's c_k for looks 2..8 (per claim, and for the four claims of grids/cpu/claims.yaml) are
    design()'s, as printed there (the first with a thousands comma, the others to 3 significant digits)."""
    import re

    from tests.helpers import ROOT

    text = " ".join(open(f"{ROOT}/docs/DESIGN.md").read().split())
    for alpha, pattern in ((0.05, r"the c_k are ([\d,]+) \(2 seeds[^)]*\), ([^a]+) and ([\d.]+) at 8 seeds"),
                           (0.0125, r"grids/cpu/claims.yaml` the c_k are ([\d,]+), ([^a]+) and ([\d.]+)\.")):
        m = re.search(pattern, text)
        assert m, pattern
        said = [m.group(1)] + m.group(2).split(", ") + [m.group(3)]
        crit = design(2, 8, 1, alpha=alpha).crit
        assert said == [f"{crit[0]:,.0f}"] + [f"{c:.3g}" for c in crit[1:]], (said, crit)
