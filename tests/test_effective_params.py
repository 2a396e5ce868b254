"""Effective parameters of recursion on a synthetic store (real Parquet through store.Store.write_rows):
single-pass models whose VPR is linear in log2(parameters), looped models built to equal a single-pass
model with m = L^0.8 its parameters. The fit must recover m and beta within their bootstrap intervals,
say "above the largest single-pass model" rather than extrapolate, and give a study with two single-pass
sizes the reason instead of a figure.
Run: .venv/bin/python -m pytest tests/test_effective_params.py -q
"""
from __future__ import annotations

import datetime as dt
import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis.effective import ABOVE, IN_RANGE, effective_params, invert, invert_columns, isotonic, isotonic_columns
from analysis.figures import FIGURES, Options
from analysis.load import MissingData, load_study
from store import Store
from tests.helpers import full_row
from test_analysis_data import _write, eval_row, run_row

BETA = 0.8
N = 1000  # examples per evaluation point
P1 = 1000  # parameters of the (1 x L) models
CURVE = {1: (0.20, 0.10), 2: (0.40, 0.12)}  # T -> (a, b): VPR = a + b * log2(params / P1)


def vpr(T: int, params: float) -> float:
    a, b = CURVE[T]
    return a + b * math.log2(params / P1)


def _run(study, K, L, seed=0):
    row = run_row(study, "sudoku", {"n": 9, "mask_rate": 0.3}, K, L, seed=seed)
    return {**row, "n_params": P1 * K, "created_at": dt.datetime(2026, 1, 1 + seed, tzinfo=dt.timezone.utc)}


def _point(run, T, L_s, value):
    k = round(value * N)  # a value a real evaluation of N examples can have
    return {**eval_row(run, T, L_s, "vpr", k / N), "n_examples": N, "eval_key": f"T{T}-Ls{L_s}-x"}


def write_study(root: str, study: str, single_K=(1, 2, 4, 8), samples_for=(1, 2)) -> None:
    """Single-pass (K x 1) at P1 * K parameters on the curve; (1 x 2) and (1 x 3), two seeds each
    (values +-0.01 around the curve, mean on it), equal to a single-pass model with L^0.8 x P1; (4 x 3)
    would need 4 * 3^0.8 x P1 = 9.6 P1, above the largest single-pass model (8 P1)."""
    store = Store(root, study)
    for K in single_K:
        run = _run(study, K, 1)
        _write(store, run, [_point(run, T, 1, vpr(T, P1 * K)) for T in CURVE], history=False)
    for K, L in ((1, 2), (1, 3), (4, 3)):
        for seed, dv in ((0, -0.01), (1, 0.01)):
            run = _run(study, K, L, seed)
            rows = [_point(run, T, L, vpr(T, P1 * K * L ** BETA) + dv) for T in CURVE]
            _write(store, run, rows, history=False)
            if (K, L) == samples_for and seed == 0:  # every example kept: resampled per example
                for r in rows:
                    k = round(r["value"] * N)
                    store.write_rows("samples", [
                        full_row("samples", run_id=run["run_id"], eval_key=r["eval_key"], T=r["T"], L_s=L, example=i,
                                 input="", output="", reference="", score=float(i < k),
                                 scores=json.dumps({"vpr": float(i < k)})) for i in range(N)], run["run_id"],
                        f"{r['eval_key']}.parquet")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("results"))
    write_study(root, "eff")
    return load_study(root, "eff")


def test_monotone_fit_and_inversion_never_extrapolate():
    assert isotonic(np.array([0.1, 0.3, 0.2, 0.5])) == pytest.approx([0.1, 0.25, 0.25, 0.5])
    x, fit = np.log([1.0, 2.0, 4.0]), np.array([0.2, 0.2, 0.6])
    assert invert(x, fit, 0.4) == pytest.approx(math.log(2 * math.sqrt(2)))
    assert invert(x, fit, 0.2) == pytest.approx(0.0)  # on the flat part: the smallest size reaching it
    assert invert(x, fit, 0.7) == math.inf and invert(x, fit, 0.1) == -math.inf


def test_the_batched_fit_and_inversion_are_the_scalar_ones_per_replicate():
    """The bootstrap fits and inverts a thousand replicates at once; each column must be what the scalar
    pool-adjacent-violators fit and inversion give (ties, flat parts, both open ends included)."""
    rng = np.random.default_rng(1)
    Y = np.round(rng.random((5, 400)), 1)  # rounded: many ties and violations
    Y[:, 0] = [0.2, 0.2, 0.2, 0.2, 0.2]
    F = isotonic_columns(Y)
    for b in range(Y.shape[1]):
        assert F[:, b] == pytest.approx(isotonic(Y[:, b]))
    x = np.log([1.0, 2.0, 4.0, 8.0, 16.0])
    v = np.concatenate([rng.random(397) * 1.2 - 0.1, [np.nan, 0.2, 1.5]])
    got = invert_columns(x, F, v)
    want = np.array([invert(x, F[:, b], v[b]) for b in range(v.size)])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert got[~np.isnan(want)] == pytest.approx(want[~np.isnan(want)])


def test_samples_are_not_read_for_a_run_whose_config_keeps_fewer_examples(tmp_path, monkeypatch):
    """A run that keeps 50 samples of 200 examples cannot be resampled per example: reading its files
    (20 per run, a round trip each on an object store) was most of effective-params at 1,000 runs."""
    from analysis.effective import example_scores

    root = str(tmp_path / "results")
    write_study(root, "eff")
    data = load_study(root, "eff")
    rid = next(r for r in data.runs["run_id"] if "1x2" in r and r.endswith("s0"))  # the run with samples
    row = data.evals[(data.evals["run_id"] == rid)].iloc[0]
    assert example_scores(data, rid, row["eval_key"], "vpr", N, {}) is not None
    data = load_study(root, "eff")
    data.runs["config"] = [json.dumps({"eval": {"n_samples_kept": N - 1 if r == rid else N}})
                           for r in data.runs["run_id"]]
    reads = []
    original = Store.read_bytes
    monkeypatch.setattr(Store, "read_bytes", lambda self, path: reads.append(path) or original(self, path))
    assert example_scores(data, rid, row["eval_key"], "vpr", N, {}) is None
    effective_params(data, n_boot=50)
    assert [p for p in reads if "/samples/" in p], "the other runs keep every example: read"
    assert not [p for p in reads if f"/samples/{rid}/" in p], reads


def test_the_fit_recovers_m_and_beta_within_their_intervals(study):
    eff = effective_params(study, n_boot=400)
    t = eff.table.set_index(["model", "T"])
    for L in (2, 3):
        for T in CURVE:
            r = t.loc[(f"(1 x {L})", T)]
            assert r["where"] == IN_RANGE and r["seeds"] == 2
            assert r["m"] == pytest.approx(L ** BETA, rel=0.02)  # values rounded to k / 1000
            assert r["m_low"] < L ** BETA < r["m_high"]
            assert r["m_high"] / r["m_low"] < 3  # an interval, not everything
            assert r["equiv_params"] == pytest.approx(P1 * L ** BETA, rel=0.02)
    beta = eff.beta.set_index("T")
    b = beta.loc["all"]
    assert b["points"] == 4 and b["out_of_range"] == 2 and b["L_values"] == "2, 3"
    assert b["beta"] == pytest.approx(BETA, abs=0.03)
    assert b["beta_low"] < BETA < b["beta_high"] and b["beta_high"] - b["beta_low"] < 1.0
    assert set(beta.index) == {"all", "1", "2"}


def test_a_model_beyond_the_single_pass_range_is_said_to_be_so(study):
    eff = effective_params(study, n_boot=200)
    for r in eff.table[eff.table["model"] == "(4 x 3)"].itertuples():
        assert r.where == ABOVE and math.isnan(r.m) and math.isnan(r.equiv_params)
        assert r.note == "m > 2 (the largest single-pass model); not extrapolated"


def test_per_example_scores_are_resampled_when_every_example_is_kept(study):
    from analysis.effective import example_scores

    rows = study.evals[(study.evals["K"] == 1) & (study.evals["L_t"] == 2) & (study.evals["T"] == 1)]
    got = {r.run_id: example_scores(study, r.run_id, r.eval_key, "vpr", N, {}) for r in rows.itertuples()}
    kept = [s for s in got.values() if s is not None]
    assert len(kept) == 1 and kept[0].mean() == pytest.approx(rows["value"].min())  # seed 0 (-0.01)
    assert sum(s is None for s in got.values()) == 1  # seed 1: no samples, binomial from value and n


def test_report_draws_the_figure_and_writes_the_tables(study, tmp_path):
    from study.cli import app

    root = str(tmp_path / "res")
    write_study(root, "eff")
    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["report", "--figure", "all", "--results", root, "--study", "eff",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "effective_params.png").exists() and (out / "effective_params.svg").exists()
    beta = pd.read_csv(out / "effective_beta.csv")
    assert beta.loc[beta["T"] == "all", "beta"].iloc[0] == pytest.approx(BETA, abs=0.03)
    for page in ("report.md", "report.html"):
        text = (out / page).read_text()
        assert "Effective parameters" in text and "What a loop is worth (m = L^beta)" in text
        assert "above the largest single-pass model" in text


def test_two_single_pass_sizes_get_the_reason_not_a_figure(tmp_path):
    root = str(tmp_path / "res")
    write_study(root, "two", single_K=(1, 2))
    data = load_study(root, "two")
    with pytest.raises(MissingData, match=r"at least 3 single-pass .*2 single-pass sizes \(\(1 x 1\)"):
        FIGURES["effective-params"](data, str(tmp_path / "fig"), Options())
    assert not (tmp_path / "fig").exists()
    from study.cli import app

    r = CliRunner().invoke(app, ["report", "--figure", "effective-params", "--results", root, "--study", "two",
                                 "--out", str(tmp_path / "cli")])
    assert r.exit_code == 1 and "effective-params: not drawn" in r.output and "2 single-pass sizes" in r.output


def test_resample_runs_draws_what_the_loop_over_runs_draws():
    """The one-call binomial draw of a point's runs gives the values (and leaves the generator where) the
    loop of resample_run does; a point with per-example scores or a non-rate metric takes the loop."""
    import numpy as np

    from analysis.effective import resample_run, resample_runs

    rows = [{"n_examples": 200, "value": 0.3}, {"n_examples": 50, "value": 1.2}, {"n_examples": 200, "value": 0.9}]
    for scores, metric in (([None] * 3, "vpr"), ([None, np.ones(50), None], "vpr")):
        a, b = np.random.default_rng(7), np.random.default_rng(7)
        got = resample_runs(rows, scores, metric, a, 300)
        want = np.stack([resample_run(r, s, metric, b, 300) for r, s in zip(rows, scores)])
        assert got.shape == (3, 300) and (got == want).all()
        assert a.random() == b.random()
