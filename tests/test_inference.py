"""Intervals across seeds and paired comparisons: coverage proved by simulation, verdicts on synthetic
paired samples of known difference. Run: .venv/bin/python -m pytest tests/test_inference.py -q

Every simulated study has a known truth and a fixed test set scored by every seed, as a real study's
seeds are: per-seed success rates vary around a known mean (a Beta distribution), and the puzzles of
the test set differ in difficulty (a fixed latent per puzzle shared by all seeds). The truth is the
expected score of the training recipe over seeds on that test set.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from analysis.tables import aggregate
from stats import (DECLINED, SEED_METHOD, chi2_quantile, clopper_pearson, learned_share, seed_interval, t_quantile,
                   wilson)

N_STUDIES = 2000  # per setting: the coverage estimate's standard error is 0.5 points


def _evals(values: np.ndarray, n: int, rate: bool, per_seed_ci: list[tuple[float, float]] | None = None,
           metric: str | None = None) -> pd.DataFrame:
    """An evals table (the columns aggregate reads) of len(values) studies x S seeds: one model per study."""
    studies, S = values.shape
    metric = metric or ("vpr" if rate else "nll")
    rows = []
    for j in range(studies):
        key = json.dumps({"model.K": 1, "study": j})
        for s in range(S):
            v = float(values[j, s])
            lo, hi = wilson(v * n, n) if rate else per_seed_ci[j * S + s]
            rows.append({"task": "sudoku", "task_variant": "sim", "K": 1, "L_t": 1, "schedule": "fixed", "loss": "all",
                         "d_model": 16, "heads": 2, "lr": 1e-3, "batch": 8, "steps": 10, "model_key": key,
                         "T": 1, "L_s": 1, "sampler": "confidence", "split": "test", "metric": metric,
                         "run_id": f"r{j}_{s}", "value": v, "n_examples": n, "ci_low": lo, "ci_high": hi,
                         "n_params": 1, "n_params_non_embedding": 1, "flops_per_forward": 1, "forward_passes": 1,
                         "forward_passes_mean": 1.0})
    return pd.DataFrame(rows)


def _rate_studies(S: int, n: int, mu: float, k: float, rho: float, seed: int) -> tuple[float, np.ndarray]:
    """(truth, seed values [N_STUDIES, S]): per-seed rate p ~ Beta(mu k, (1 - mu) k); puzzle i solved by a
    seed when Phi(sqrt(rho) g_i + sqrt(1 - rho) e) < p, g_i fixed for the test set, e fresh per seed."""
    g = torch.Generator().manual_seed(seed)
    beta = torch.distributions.Beta(torch.tensor(mu * k, dtype=torch.float64), torch.tensor((1 - mu) * k, dtype=torch.float64))
    torch.manual_seed(seed)
    puzzles = torch.randn(n, generator=g, dtype=torch.float64)
    p = beta.sample((N_STUDIES, S))
    z = math.sqrt(rho) * puzzles + math.sqrt(1 - rho) * torch.randn(N_STUDIES, S, n, generator=g, dtype=torch.float64)
    solved = (torch.special.ndtr(z) < p[..., None]).double()
    # the truth on this test set: E_p[mean_i P(solved_i | p)], by Monte Carlo over 20,000 seeds
    pp = beta.sample((20000,)).clamp(1e-12, 1 - 1e-12)
    if rho > 0:
        truth = torch.special.ndtr((torch.special.ndtri(pp)[:, None] - math.sqrt(rho) * puzzles) / math.sqrt(1 - rho))
        truth = float(truth.mean())
    else:
        truth = float(pp.mean())
    return truth, solved.mean(-1).numpy()


def _mean_studies(S: int, n: int, mu: float, sd_seed: float, sd_puzzle: float, sd_noise: float, seed: int):
    """(truth, seed means, per-seed normal intervals): score = mu + seed effect + fixed puzzle effect + noise."""
    rng = np.random.default_rng(seed)
    b = sd_puzzle * rng.standard_normal(n)
    y = (mu + sd_seed * rng.standard_normal((N_STUDIES, S, 1)) + b + sd_noise * rng.standard_normal((N_STUDIES, S, n)))
    m, sd = y.mean(-1), y.std(-1, ddof=1)
    ci = [(a - 1.96 * e, a + 1.96 * e) for a, e in zip(m.ravel(), (sd / math.sqrt(n)).ravel())]
    return mu + b.mean(), m, ci


def _coverage(agg: pd.DataFrame, truth: float) -> float:
    """Coverage over the studies given an interval; a declined one ("not estimable", NaN) is not counted,
    and at most 5% are declined in these ordinary settings (seeds that tie exactly are rare)."""
    declined = agg["ci_method"].str.startswith("not estimable")
    assert (agg.loc[declined, "ci_low"].isna() & agg.loc[declined, "ci_high"].isna()).all()
    assert declined.mean() < 0.05
    ok = agg[~declined]
    return float(((ok["ci_low"] <= truth) & (truth <= ok["ci_high"])).mean())


def _holds(given: float, declined: float, high: float = 0.97) -> bool:
    """The coverage rule: of the intervals given, at least 93% hold the truth, and of all studies (a decline
    counted as not holding it) at most 97% do: declining must not buy width, nor width buy coverage."""
    return given >= 0.93 and given * (1 - declined) <= high


RATE_SETTINGS = [(0.6, 30, 0.3, 200), (0.3, 20, 0.0, 100)]  # (mean rate, Beta concentration, puzzle share, n)
MEAN_SETTINGS = [(0.1, 0.5, 1.0), (0.3, 0.3, 1.0)]  # (seed s.d., puzzle s.d., per-example noise s.d.), n = 200


@pytest.mark.parametrize("S", [2, 3, 5])
def test_seed_intervals_cover_the_truth_95_percent_for_rates(S):
    for i, (mu, k, rho, n) in enumerate(RATE_SETTINGS):
        truth, vals = _rate_studies(S, n, mu, k, rho, seed=100 * S + i)
        agg = aggregate(_evals(vals, n, rate=True))
        assert len(agg) == N_STUDIES and (agg["n_seeds"] == S).all()
        declined = float(agg["ci_method"].str.startswith("not estimable").mean())
        cov = _coverage(agg, truth)
        assert _holds(cov, declined), (S, mu, k, rho, cov, declined)
        # the old interval, Wilson on the count pooled over seeds x puzzles, fails this test
        k_pooled = vals.sum(1) * n
        pooled = np.array([wilson(kk, n * S) for kk in k_pooled])
        old = float(((pooled[:, 0] <= truth) & (truth <= pooled[:, 1])).mean())
        assert old < 0.85, (S, old)


@pytest.mark.parametrize("S", [2, 3, 5])
def test_seed_intervals_cover_the_truth_95_percent_for_means(S):
    for i, (sd_seed, sd_puzzle, sd_noise) in enumerate(MEAN_SETTINGS):
        truth, m, ci = _mean_studies(S, 200, 2.0, sd_seed, sd_puzzle, sd_noise, seed=200 * S + i)
        agg = aggregate(_evals(m, 200, rate=False, per_seed_ci=ci))
        cov = _coverage(agg, truth)
        assert 0.93 <= cov <= 0.97, (S, sd_seed, cov)
    # the old interval, mean +- 1.96 s.d. / sqrt(n_seeds), covers 70% with two seeds
    truth, m, ci = _mean_studies(2, 200, 2.0, *MEAN_SETTINGS[1], seed=7)
    half = 1.96 * m.std(1, ddof=1) / math.sqrt(2)
    old = float((np.abs(m.mean(1) - truth) <= half).mean())
    assert old < 0.8, old


# ---- rates at the edges: near 0 or 1, and seeds that learn the task or not ------------------------------
# Truth: the recipe mean of the per-seed true rates (E p). A study's seeds draw p from a Beta of that mean
# and the between-seed s.d. given, then score Binomial(n, p) on the test examples (no puzzle term: the
# edge is what is tested here; the settings above keep it). All-or-nothing: each seed learns the task
# (n/n) with probability q, else scores 0/n; truth q.
EDGE_SETTINGS = ([("ceiling", S, n, 0.9, sd) for S in (2, 3, 5) for n in (50, 500) for sd in (0.10, 0.15)]
                 + [("floor", S, 500, 0.1, 0.15) for S in (2, 3, 5)]
                 + [("edge", 5, n, mu, sd) for mu in (0.02, 0.98) for n, sd in ((500, 0.01), (50, 0.02), (500, 0.02),
                                                                                (500, 0.03))]
                 + [("all-or-nothing", S, 40, q, None) for S in (2, 3) for q in (0.3, 0.5, 0.8)])


# where the interval is knowingly conservative: 5 seeds near 0 or 1 at n = 500 cover 97.2-97.7% (the logit
# s.d.'s upper bound that keeps n = 50 at 93% widens these too); allowed up to 98%, never below 93%
CONSERVATIVE = {("ceiling", 5, 500, 0.9, 0.10), ("ceiling", 5, 500, 0.9, 0.15), ("edge", 5, 500, 0.02, 0.02),
                ("edge", 5, 500, 0.98, 0.02)}


def _edge_studies(S: int, n: int, mu: float, sd: float | None, seed: int) -> np.ndarray:
    """Seed values [N_STUDIES, S] of one EDGE_SETTINGS row (vectorised, seeded)."""
    rng = np.random.default_rng(seed)
    if sd is None:
        return (rng.random((N_STUDIES, S)) < mu).astype(float)
    conc = mu * (1 - mu) / sd ** 2 - 1  # a Beta(mu c, (1 - mu) c) has s.d. sqrt(mu (1 - mu) / (c + 1))
    return rng.binomial(n, rng.beta(mu * conc, (1 - mu) * conc, size=(N_STUDIES, S))) / n


def _edge_coverage(vals: np.ndarray, n: int, truth: float, method=None) -> tuple[float, float, float]:
    """(coverage of the intervals given, decline rate, coverage counting a decline as a miss) of
    stats.seed_interval (or `method`, same signature) over the studies; a decline must come as NaN."""
    method = method or seed_interval
    hit = declined = 0
    nan = [math.nan] * vals.shape[1]
    for row in vals.tolist():
        lo, hi, how = method(row, True, [n] * len(row), nan, nan)
        if how in DECLINED:
            assert math.isnan(lo) and math.isnan(hi) and SEED_METHOD[how].startswith("not estimable")
            declined += 1
            continue
        assert lo <= math.fsum(row) / len(row) <= hi
        hit += lo <= truth <= hi
    given = len(vals) - declined
    return hit / max(given, 1), declined / len(vals), hit / len(vals)


@pytest.mark.parametrize("i", range(len(EDGE_SETTINGS)), ids=lambda i: "-".join(map(str, EDGE_SETTINGS[i])))
def test_seed_intervals_hold_at_the_edges_or_decline(i):
    kind, S, n, mu, sd = EDGE_SETTINGS[i]
    vals = _edge_studies(S, n, mu, sd, seed=1000 + i)
    given, declined, overall = _edge_coverage(vals, n, mu)
    high = 0.98 if EDGE_SETTINGS[i] in CONSERVATIVE else 0.97
    assert _holds(given, declined, high), (kind, S, n, mu, sd, given, declined)
    # it declines exactly where every seed scored the same value, and nowhere else
    tied = float((vals.max(1) == vals.min(1)).mean())
    assert declined == tied and declined < 1, (declined, tied)
    print(f"{kind} S={S} n={n} mean={mu} sd={sd}: coverage {given:.3f} of the intervals given, declined {declined:.3f}")


def _old_seed_interval(values, rate, n_examples, lows, highs):
    """The interval before: t over the raw seed values (clipped), pooled Wilson when the seeds agree."""
    s, m = len(values), math.fsum(values) / len(values)
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in values) / (s - 1))
    if sd > 0:
        half = t_quantile(0.975, s - 1) * sd / math.sqrt(s)
        return (max(m - half, 0.0), min(m + half, 1.0), "t")
    return (*wilson(m * n_examples[0] * s, n_examples[0] * s), "agree-pooled")


@pytest.mark.parametrize("kind,S,n,mu,sd", [("ceiling", 5, 500, 0.9, 0.15), ("ceiling", 3, 50, 0.9, 0.15),
                                            ("edge", 5, 500, 0.98, 0.03), ("all-or-nothing", 3, 40, 0.5, None),
                                            ("all-or-nothing", 2, 40, 0.3, None)])
def test_the_old_seed_interval_fails_the_edge_simulation(kind, S, n, mu, sd):
    vals = _edge_studies(S, n, mu, sd, seed=77)
    given, declined, _ = _edge_coverage(vals, n, mu, _old_seed_interval)
    assert declined == 0 and given < 0.9, (kind, S, given)


def test_the_value_lies_inside_its_interval_and_one_seed_keeps_its_evaluation_interval():
    # two seeds at 0/40 and 40/40: the old pooled Wilson said [0.393, 0.607] around 0.5
    agg = aggregate(_evals(np.array([[0.0, 1.0]]), 40, rate=True))
    assert (agg.value.iloc[0], agg.ci_low.iloc[0], agg.ci_high.iloc[0]) == pytest.approx((0.5, 0.0, 1.0))
    # n = 200 at 0.10 and n = 10 at 0.90: value 0.5 (the mean of the seeds), inside its interval
    e = pd.concat([_evals(np.array([[0.1]]), 200, rate=True), _evals(np.array([[0.9]]), 10, rate=True)])
    e["run_id"] = ["a", "b"]
    r = aggregate(e).iloc[0]
    assert r.value == pytest.approx(0.5) and r.ci_low <= 0.5 <= r.ci_high and r.n_seeds == 2
    # by hand: t over the logit rates (20.5 / 180.5 and 9.5 / 1.5), E expit(m + tau Z) by a fine grid over Z
    y = np.log([20.5 / 180.5, 9.5 / 1.5])
    c, s_y = y.mean(), y.std(ddof=1)
    half = t_quantile(0.975, 1) * s_y / math.sqrt(2)
    z = np.linspace(-12, 12, 200001)
    w = np.exp(-z * z / 2) / np.exp(-z * z / 2).sum()
    mean_rate = lambda m, tau: float((w / (1 + np.exp(-(m + tau * z)))).sum())
    taus = (s_y, s_y * math.sqrt(1 / chi2_quantile(0.15, 1)))
    assert chi2_quantile(0.15, 1) == pytest.approx(0.035766, abs=1e-6)  # tables: chi2_{0.15, 1} = 0.0358
    want = (min(mean_rate(c - half, t) for t in taus), max(mean_rate(c + half, t) for t in taus))
    assert (r.ci_low, r.ci_high) == pytest.approx(want, abs=1e-6) and r.ci_method.startswith("t over seed logit")
    # one seed: the evaluation's own interval, and the method says so
    one = aggregate(_evals(np.array([[0.35]]), 100, rate=True)).iloc[0]
    assert (one.ci_low, one.ci_high) == pytest.approx(wilson(35, 100)) and one.ci_method.startswith("1 seed")
    # seeds that agree exactly (all 0/40): no interval is honest (a fourth seed may learn the task), so none
    # is given; the old pooled Wilson said [0, 0.029], as if 120 independent examples had been scored
    z = aggregate(_evals(np.array([[0.0, 0.0, 0.0]]), 40, rate=True)).iloc[0]
    assert math.isnan(z.ci_low) and math.isnan(z.ci_high) and z.value == 0.0
    assert z.ci_method == SEED_METHOD["agree"] and z.ci_method.startswith("not estimable: every seed scored the same")
    # a perfect or zero score lies inside its own interval, exactly (Wilson at k = n gave 0.9999999999999999)
    for v, n in ((1.0, 100), (1.0, 500), (1.0, 1500), (0.0, 1500)):
        one = aggregate(_evals(np.array([[v]]), n, rate=True)).iloc[0]
        assert one.ci_low <= one.value <= one.ci_high, (v, n, one.ci_low, one.ci_high)
    two = aggregate(_evals(np.array([[1.0, 0.98]]), 500, rate=True)).iloc[0]
    assert two.ci_low <= two.value <= two.ci_high <= 1.0
    # random studies: the value is inside its interval every time
    rng = np.random.default_rng(3)
    vals = rng.integers(0, 41, size=(300, 3)) / 40
    agg = aggregate(_evals(vals, 40, rate=True))
    assert ((agg.ci_low <= agg.value + 1e-12) & (agg.value <= agg.ci_high + 1e-12)).all()


# ---- paired comparisons -----------------------------------------------------------------------
def _paired_examples(n: int, pa: float, pb: float, rho: float, rng: np.random.Generator):
    """Two models on one freshly drawn test set: example i solved by A when Phi(sqrt(rho) g_i +
    sqrt(1 - rho) e) < pa, by B likewise with its own e: shared difficulty makes them correlated."""
    g = rng.standard_normal(n)
    za = torch.special.ndtr(torch.from_numpy(math.sqrt(rho) * g + math.sqrt(1 - rho) * rng.standard_normal(n)))
    zb = torch.special.ndtr(torch.from_numpy(math.sqrt(rho) * g + math.sqrt(1 - rho) * rng.standard_normal(n)))
    return (za.numpy() < pa).astype(float), (zb.numpy() < pb).astype(float)


def test_paired_interval_over_examples_covers_a_known_difference():
    from stats import paired_difference

    rng = np.random.default_rng(11)
    for pa, pb in [(0.6, 0.4), (0.5, 0.5), (0.9, 0.8)]:
        hit = 0
        for _ in range(1000):
            a, b = _paired_examples(300, pa, pb, 0.5, rng)
            d, lo, hi, how, used = paired_difference({0: a.mean()}, {0: b.mean()}, True, {0: a}, {0: b})
            assert how == "examples" and used == 1 and lo <= d <= hi
            hit += lo <= pa - pb <= hi
        assert 0.93 <= hit / 1000 <= 0.97, (pa, pb, hit)


def test_paired_t_over_matched_seeds_covers_a_known_difference():
    from stats import paired_difference

    rng = np.random.default_rng(12)
    for S in (2, 3, 5):
        hit = 0
        for _ in range(1000):
            base = rng.normal(0.0, 0.05, S)  # what a seed does to both models (shared data order, puzzles)
            a = 0.7 + base + rng.normal(0, 0.03, S)
            b = 0.6 + base + rng.normal(0, 0.03, S)
            d, lo, hi, how, used = paired_difference(dict(enumerate(a)), dict(enumerate(b)), True)
            assert how == "seeds" and used == S and lo <= d <= hi
            hit += lo <= 0.1 <= hi
        assert 0.93 <= hit / 1000 <= 0.97, (S, hit)


def test_verdicts_follow_the_stated_rule():
    from stats import verdict

    assert verdict(0.01, 0.2) == "ahead" and verdict(-0.2, -0.01) == "behind"
    assert verdict(-0.01, 0.2) == "no detectable difference"
    assert verdict(-0.3, -0.1, lower_is_better=True) == "ahead"  # a lower NLL is better
    assert verdict(0.1, 0.3, lower_is_better=True) == "behind"


def test_no_verdict_rests_on_a_declined_interval():
    from stats import NO_VERDICT, paired_difference, verdict

    # every seed of each model agrees (A: 1.0 twice, B: 0.9 twice; seeds not matched, no per-example scores):
    # each model's seed interval is declined, and the comparison built on them says so instead of judging
    a_lo, a_hi, how_a = seed_interval([1.0, 1.0], True, [50, 50], [0.93, 0.93], [1.0, 1.0])
    b_lo, b_hi, how_b = seed_interval([0.9, 0.9], True, [50, 50], [0.79, 0.79], [0.96, 0.96])
    assert how_a in DECLINED and how_b in DECLINED
    d, lo, hi, how, _ = paired_difference({0: 1.0, 1: 1.0}, {2: 0.9, 3: 0.9}, True,
                                          a_interval=(a_lo, a_hi), b_interval=(b_lo, b_hi))
    assert d == pytest.approx(0.1) and how == "unpaired"
    assert verdict(lo, hi) == NO_VERDICT == "not estimable: no interval"
    assert verdict(math.nan, math.nan, lower_is_better=True) == NO_VERDICT
    # one seed of a mean metric stored without its interval: declined and said why (it was NaN labelled "1 seed")
    lo, hi, how = seed_interval([2.5], False, [100], [None], [None])
    assert math.isnan(lo) and math.isnan(hi) and how in DECLINED and SEED_METHOD[how].startswith("not estimable: 1 seed")


def _paired_store(root: str, delta: float, n: int = 400, seeds=(0,)):
    """A study of (1 x 2) and its iso-parameter partner (1 x 1), per-example scores for every example in
    the samples files, A solving (0.5 + delta) and B 0.5 of the same puzzles in expectation."""
    from store import Store
    from test_analysis_data import eval_row, run_row
    from tests.helpers import full_row

    store = Store(root, "paired")
    rng = np.random.default_rng(5)
    tp = {"n": 9, "mask_rate": 0.3}
    for seed in seeds:
        draws = {T: _paired_examples(n, 0.5 + delta, 0.5, 0.5, rng) for T in (1, 2)}
        for i, (K, L) in enumerate([(1, 2), (1, 1)]):
            run = run_row("paired", "sudoku", tp, K, L, seed=seed)
            store.write_rows("runs", [run], f"{run['run_id']}.parquet")
            store.write_config(run["run_id"], {"run_id": run["run_id"], "model": {"K": K, "L": L}})
            for T, ab in draws.items():
                y = ab[i]
                ev = eval_row(run, T, L, "vpr", float(y.mean()))
                ev.update(n_examples=n, ci_low=wilson(y.sum(), n)[0], ci_high=wilson(y.sum(), n)[1])
                store.write_rows("evals", [ev], run["run_id"], f"{ev['eval_key']}.parquet")
                store.write_rows("samples", [full_row("samples", run_id=run["run_id"], eval_key=ev["eval_key"], T=T,
                                                       L_s=L, example=j, input=None, output=None, reference=None,
                                                       score=float(v), scores=json.dumps({"vpr": float(v)}))
                                             for j, v in enumerate(y)], run["run_id"], f"{ev['eval_key']}.parquet")
    return store


@pytest.mark.parametrize("delta,expected", [(0.2, "ahead"), (0.0, "no detectable difference"), (-0.2, "behind")])
def test_report_compares_paired_samples_of_known_difference(tmp_path, delta, expected):
    from analysis.compare import compare
    from analysis.load import load_study

    _paired_store(str(tmp_path), delta)
    c = compare(load_study(str(tmp_path), "paired"))
    assert len(c) == 2 and list(c["T"]) == [1, 2]
    r = c.iloc[0]
    assert (r.comparison, r.A, r.B, r["T"]) == ("iso-parameter", "(1 x 2)", "(1 x 1)", 1)
    assert r.method.startswith("paired over test examples") and r.seeds == "1 / 1 (1 paired)"
    assert r.ci_low <= delta <= r.ci_high and r.ci_low <= r.difference <= r.ci_high
    # one seed each: the verdict is about seed 0's pair, never the recipe (issue 29)
    assert r.verdict == (f"{expected} on seed 0" if expected.startswith("no") else f"{expected} on seed 0 only") + \
        " (one seed pair; not a claim about the recipe)"
    # pairing makes the interval narrower than the two Wilson intervals combined would be
    data = load_study(str(tmp_path), "paired")
    ev = data.evals[data.evals["T"] == 1].set_index("L_t")
    unpaired = math.hypot(*(ev.loc[L, "ci_high"] - ev.loc[L, "ci_low"] for L in (1, 2))) / 2
    assert (r.ci_high - r.ci_low) / 2 < unpaired


def test_study_report_prints_comparisons_and_names_a_pair(tmp_path):
    from tests.helpers import study

    store = _paired_store(str(tmp_path), 0.2, seeds=(0, 1, 2))
    runs = sorted(store.read("runs")["run_id"])
    out = study("report", "--results", str(tmp_path), "--study", "paired", "--figure", "iso-param",
                "--compare", f"{runs[0]}:{runs[-1]}")
    assert out.returncode == 0, out.stderr
    from tests.helpers import unwrapped

    lines = [l for l in unwrapped(out.stdout.splitlines()) if "vs" in l and "T=1" in l]
    assert any(l.strip().startswith("iso-parameter") and "seeds 3 / 3 (3 paired): ahead" in l for l in lines), out.stdout
    assert any(l.strip().startswith("named") for l in lines), out.stdout
    bad = study("report", "--results", str(tmp_path), "--study", "paired", "--figure", "iso-param",
                "--compare", "nope:also-nope")
    assert bad.returncode == 2 and "no run 'nope'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_reproduction_verdicts_are_generated_from_the_store(tmp_path):
    import importlib.util

    from tests.helpers import ROOT

    spec = importlib.util.spec_from_file_location("reproduction_tables", f"{ROOT}/docs/reproduction_tables.py")
    rt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rt)
    _paired_store(str(tmp_path), 0.2, seeds=(0, 1, 2))
    text = rt.verdicts(str(tmp_path), ["paired"])
    rows = [l for l in text.splitlines() if l.startswith("| iso-parameter")]
    assert len(rows) == 2 and all("**ahead**" in l and "3 / 3 (3 paired)" in l for l in rows), text
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{rt.BEGIN}\nstale\n{rt.END}\nafter\n")
    rt.write_between_markers(str(doc), text)
    got = doc.read_text()
    assert "stale" not in got and got.startswith("before\n") and got.endswith("after\n") and "**ahead**" in got
    # the block is in docs/REPRODUCTION.md
    assert rt.BEGIN in open(f"{ROOT}/docs/REPRODUCTION.md").read()


@pytest.mark.parametrize("S", [4, 5])
def test_the_stated_limit_seeds_that_all_learned_cannot_show_a_recipe_that_sometimes_fails(S):
    """Issue 42, the limit docs/DESIGN.md states: each seed learns (Binomial(40, 0.9) / 40) with probability 0.8,
    else scores 0, truth 0.72 (1,000 studies). Studies with a failing seed among the S are covered (>= 95%);
    those where every seed learned (0.8^S of them: 41% at 4, 33% at 5) are not (11-29%), as no interval from
    those seeds alone can tell that recipe from one that always learns."""
    rng = np.random.default_rng(30 + S)
    learn = rng.random((1000, S)) < 0.8
    vals = np.where(learn, rng.binomial(40, 0.9, (1000, S)) / 40, 0.0)
    hit = {True: [], False: []}
    for row, every in zip(vals.tolist(), learn.all(1)):
        lo, hi, how = seed_interval(row, True, [40] * S, [math.nan] * S, [math.nan] * S)
        if how not in DECLINED:
            hit[bool(every)].append(lo <= 0.72 <= hi)
    print(f"\nS={S}: a seed failed: coverage {np.mean(hit[False]):.3f} ({len(hit[False])} studies); every seed "
          f"learned: {np.mean(hit[True]):.3f} ({len(hit[True])})")
    assert np.mean(hit[False]) >= 0.95 and np.mean(hit[True]) < 0.4


# ---- seeds that learn or not: the share that learned, and the 'split' mixture (issue 42, item 4) ----------------
SPLIT_SETTINGS = [(S, q) for S in (4, 5, 8) for q in (0.3, 0.5, 0.8)]  # seeds, P(a seed learns)


@pytest.mark.parametrize("S", [2, 3, 4, 5])
def test_the_learned_share_covers_the_chance_that_a_seed_learns(S):
    """All-or-nothing seeds (each 40/40 with probability q, else 0/40), 2,000 studies per q (Monte-Carlo SE of a
    95% coverage: 0.5 points): the table's learned share k/S and its Clopper-Pearson interval hold q in >= 95%
    of studies, those where every seed learned included (5 of 5 still allows a failing share up to 52%)."""
    for q in (0.3, 0.5, 0.8, 0.95):
        vals = (np.random.default_rng(500 + S).random((N_STUDIES, S)) < q).astype(float)
        shares = [learned_share(row) for row in vals.tolist()]
        assert [k for k, _, _ in shares] == vals.sum(1).astype(int).tolist()
        cov = np.mean([lo <= q <= hi for _, lo, hi in shares])
        assert cov >= 0.95, (S, q, cov)
    assert learned_share([0.9] * 5)[1:] == pytest.approx((0.478176, 1.0), abs=1e-6)  # tables: 0.025^(1/5)
    agg = aggregate(_evals(np.array([[0.0, 0.9, 0.85, 0.0, 0.95]]), 40, rate=True)).iloc[0]
    assert agg.learned == "3/5" and (agg.learned_low, agg.learned_high) == pytest.approx(clopper_pearson(3, 5))
    assert agg.ci_method == SEED_METHOD["split"] and agg.ci_low <= agg.value <= agg.ci_high
    # `study run`'s result table says k/S in a cell whose seeds split, and only there
    from analysis.summary import _cell

    every = aggregate(_evals(np.array([[0.9, 0.85]]), 40, rate=True)).iloc[0]
    assert _cell(agg, "").endswith("] 3/5") and _cell(every, "").endswith("]") and every.learned == "2/2"


@pytest.mark.parametrize("S, q", SPLIT_SETTINGS, ids=lambda v: str(v))
def test_the_split_interval_covers_seeds_that_learn_or_not(S, q):
    """Each seed learns with probability q and then scores Binomial(40, 0.9) / 40, else 0/40; truth 0.9 q (2,000
    studies, SE 0.5 points at 95%). Where the seeds split (two or more learned, not all), the interval is the
    mixture q r ('split'): it covers 0.99-1.00 (measured: 1.000 at 4-5 seeds, 0.998-1.000 at 8; k of 4-5 seeds
    says little about q, and two 97.5% factors together are conservative), mean width 0.89-0.93 at 4 seeds,
    0.81-0.87 at 5, 0.65-0.71 at 8."""
    rng = np.random.default_rng(40 + S)
    learn = rng.random((N_STUDIES, S)) < q
    vals = np.where(learn, rng.binomial(40, 0.9, (N_STUDIES, S)) / 40, 0.0)
    hit, width = [], []
    for row, k in zip(vals.tolist(), learn.sum(1).tolist()):
        lo, hi, how = seed_interval(row, True, [40] * S, [math.nan] * S, [math.nan] * S)
        assert (how == "split") == (2 <= k < S and len({v for v in row if v > 0}) > 1), (row, how)
        if how == "split":
            assert lo <= math.fsum(row) / S <= hi
            hit.append(lo <= 0.9 * q <= hi)
            width.append(hi - lo)
    print(f"\nS={S} q={q}: split in {len(hit)} studies, coverage {np.mean(hit):.3f}, mean width {np.mean(width):.3f}")
    assert len(hit) >= 200 and 0.95 <= np.mean(hit) <= 1.0 and np.mean(width) < {4: 0.95, 5: 0.9, 8: 0.75}[S], S
