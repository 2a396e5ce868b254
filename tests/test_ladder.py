"""study predict / analysis.ladder on a synthetic store whose runs follow a known law.

The store is real Parquet written through store.Store.write_rows (as tests/test_analysis_data.py):
the runs of the real grids/cpu/ladder.yaml (widths 48 / 64 / 96 / 128 x shapes (1 x 1), (1 x 2),
(1 x 3), (2 x 1), two seeds; run ids, configs and parameter counts as `study run` would store them)
and of its target grids/cpu/ladder_target.yaml (d = 192, (1 x 2) and (2 x 1)) in its own study, with
VPR at T = 1, 2, 4, 8 drawn from sigmoid(b_T ln(N L^beta / N50_T)) with binomial noise over 400 test
examples (per-example scores in the samples table for half the runs, the binomial fallback for the
others). Nothing is trained.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess

import numpy as np
import pytest

from store import Store
from tests.helpers import ROOT, full_row

STUDY = "cpu_ladder"  # the ladder grid's own study name, so --budget prices candidates from its grid.yaml
TARGET_STUDY = "cpu_ladder_target"
LADDER_GRID = os.path.join(ROOT, "grids", "cpu", "ladder.yaml")
TARGET_GRID = os.path.join(ROOT, "grids", "cpu", "ladder_target.yaml")
TS = [1, 2, 4, 8]
N_EX = 400
# the law: beta, and per T the slope b_T and the N_eff (non-embedding parameters) at 50% (N50_T)
TRUE = {"beta": 0.6, "slope": {1: 1.5, 2: 1.8, 4: 2.0, 8: 2.2},
        "n50": {1: 4.0e5, 2: 1.2e5, 4: 4.0e4, 8: 1.5e4}}


def true_vpr(N: int, L: int, T: int, **_) -> float:
    z = math.log(N * L ** TRUE["beta"] / TRUE["n50"][T])
    return 1 / (1 + math.exp(-TRUE["slope"][T] * z))


# the depth-width law (--law depth-width): kappa, lambda, and per T the slope, the width d_eff at half the
# ceiling (d50_T) and the ceiling c_T
TRUE_DW = {"kappa": 0.8, "lambda": 0.3, "slope": {1: 4.0, 2: 4.5, 4: 5.0, 8: 5.5},
           "d50": {1: 100.0, 2: 80.0, 4: 65.0, 8: 55.0}, "ceiling": {1: 0.45, 2: 0.75, 4: 0.9, 8: 0.98}}


def true_vpr_dw(N: int, L: int, T: int, K: int = 1, d: int = 1) -> float:
    z = math.log(d * K ** TRUE_DW["kappa"] * L ** TRUE_DW["lambda"] / TRUE_DW["d50"][T])
    return TRUE_DW["ceiling"][T] / (1 + math.exp(-TRUE_DW["slope"][T] * z))


def _eval(run_id, key, T, L, value, n):
    return full_row("evals", run_id=run_id, eval_key=key, T=T, L_s=L, sampler="confidence", split="test",
                    n_examples=n, metric="vpr", value=value, ci_low=None, ci_high=None,
                    forward_passes=T * L, eval_flops=1, eval_seconds=0.1,
                    created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))


def _run_row(run, study: str) -> dict:
    c = run.costs()
    return full_row("runs", **{"run_id": run.run_id, "study": study, "task": "sudoku",
            "task_params": json.dumps(run.task.model_dump(), sort_keys=True), "K": run.model.K, "L_t": run.model.L,
            "schedule": run.train.schedule, "loss": run.train.loss, "d_model": run.model.d_model,
            "heads": run.model.n_heads, "lr": run.train.lr, "batch": run.train.batch_size, "steps": run.train.steps,
            "seed": run.train.seed, "n_params": c["n_params"], "n_params_non_embedding": c["n_params_non_embedding"],
            "flops_per_forward": c["flops_per_forward"], "train_seconds": 1.0, "final_loss": 0.5, "status": "done",
            "error": None, "attempts": 1, "node": "t", "device": "cpu", "code_version": "abc",
            "config": json.dumps(run.resolved(), sort_keys=True),
            "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})


def write_study(root: str, grid_path: str, rng, examples_every: int = 2, law=None) -> Store:
    """The runs of a real grid (its run ids, configs and parameter counts) with VPR drawn from the law:
    binomial over N_EX test examples; every `examples_every`-th run keeps its per-example scores."""
    from study.spec.grid import load_grid

    law = law or true_vpr
    g = load_grid(grid_path)
    store = Store(root, g.study)
    for i, run in enumerate(g.runs):
        row = _run_row(run, g.study)
        store.write_rows("runs", [row], f"{run.run_id}.parquet")
        store.write_config(run.run_id, run.resolved())
        for T in TS:
            hits = rng.random(N_EX) < law(row["n_params_non_embedding"], run.model.L, T, K=run.model.K,
                                          d=run.model.d_model)
            key = f"T{T}-Ls{run.model.L}-confidence"
            store.write_rows("evals", [_eval(run.run_id, key, T, run.model.L, float(hits.mean()), N_EX)],
                             run.run_id, f"{key}.parquet")
            if i % examples_every == 0:
                store.write_rows("samples", [{"run_id": run.run_id, "eval_key": key, "T": T, "L_s": run.model.L,
                                              "example": j, "input": "", "output": "", "reference": "",
                                              "score": float(h), "scores": json.dumps({"vpr": float(h)}),
                                              "passes": T * run.model.L, "steps": T} for j, h in enumerate(hits)],
                                 run.run_id, f"{key}.parquet")
    with open(grid_path) as f:
        store.write_text(store.path("grid.yaml"), f.read())
    return store


def write_synthetic(root: str, seed: int = 0) -> None:
    """The CPU ladder and its target (each in its own study, as they would be trained), following TRUE."""
    rng = np.random.default_rng(seed)
    write_study(root, LADDER_GRID, rng)
    write_study(root, TARGET_GRID, rng)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ladder"))
    write_synthetic(root)
    return root


@pytest.fixture(scope="module")
def fitted(synth):
    from analysis.ladder import fit_study
    from analysis.load import load_study

    return fit_study(load_study(synth, STUDY))  # holds out the largest: (2 x 1) d=128, both seeds


def _K_L(label: str) -> tuple[int, int]:
    K, L = label[1:label.index(")")].split(" x ")
    return int(K), int(L)


def test_recovers_the_law(fitted):
    p = fitted.params
    beta = p[p["name"] == "beta"].iloc[0]
    assert beta["low"] <= TRUE["beta"] <= beta["high"], beta.to_dict()
    assert beta["high"] - beta["low"] < 0.5  # informative, not a vacuous interval
    for T in TS:
        s = p[(p["name"] == "slope") & (p["T"] == T)].iloc[0]
        assert s["low"] <= TRUE["slope"][T] <= s["high"], (T, s.to_dict())
        n50 = p[(p["name"] == "log10_n50") & (p["T"] == T)].iloc[0]
        assert n50["low"] <= math.log10(TRUE["n50"][T]) <= n50["high"], (T, n50.to_dict())
    for r in fitted.beta_by_T.itertuples():  # the check of the shared beta: each T alone agrees
        assert r.low <= TRUE["beta"] <= r.high, r
    assert fitted.failed < fitted.n_boot // 10
    assert not fitted.vary_D  # every run saw the same data: no delta
    # residuals: one per ladder model and T, small against the evaluation noise when the law holds
    from analysis.ladder import residual_summary

    assert len(fitted.residuals) == 15 * len(TS)
    assert residual_summary(fitted).set_index("T").loc["all", "rms_z"] < 2


def test_heldout_interval_covers_the_truth(fitted, synth):
    h = fitted.heldout
    assert set(h["label"]) == {"(2 x 1) d=128"} and list(h["T"]) == TS and (h["seeds"] == 2).all()
    for r in h.itertuples():
        K, L = _K_L(r.label)
        assert r.low <= true_vpr(r.N, L, r.T) <= r.high, (r.label, r.T, r.low, r.high)
        assert r.abs_error_pts == pytest.approx(100 * abs(r.predicted - r.measured))
    # the target study, never in the fit: 2.2x the ladder's largest parameter count
    import pandas as pd

    from analysis.ladder import measured_targets
    from analysis.load import load_study
    from study.spec.grid import load_grid
    from study.commands.predict import grid_models

    models, _ = grid_models(load_grid(TARGET_GRID))
    assert sorted(models["label"]) == ["(1 x 2) d=192", "(2 x 1) d=192"] and (models["seeds"] == 2).all()
    t = measured_targets(fitted, load_study(synth, TARGET_STUDY), models)
    assert len(t) == 2 * len(TS) and (t["scale_vs_ladder"] > 1).any()
    for r in t.itertuples():
        truth = true_vpr(r.N, _K_L(r.label)[1], r.T)
        assert r.low <= truth <= r.high, (r.label, r.T, truth, r.low, r.high)
    pred = fitted.targets(models, [2])
    same = t[t["T"] == 2].set_index("label").loc[pred["label"], "predicted"]
    assert list(pred["predicted"]) == pytest.approx(list(same))
    assert isinstance(pred, pd.DataFrame)


def test_misfit_shows_in_the_residuals_and_beta_by_T(tmp_path):
    """A ladder whose loops are worth more at small T than at large T (beta 1.0 at T = 1, 0.1 at T = 8):
    the shared-beta law misfits, and the diagnostics say where."""
    from analysis.ladder import fit_study, residual_summary
    from analysis.load import load_study

    beta_T = {1: 1.0, 2: 0.7, 4: 0.4, 8: 0.1}

    def law(N, L, T, **_):
        return 1 / (1 + math.exp(-TRUE["slope"][T] * math.log(N * L ** beta_T[T] / TRUE["n50"][T])))

    write_study(str(tmp_path), LADDER_GRID, np.random.default_rng(3), examples_every=10 ** 6, law=law)
    m = fit_study(load_study(str(tmp_path), STUDY), n_boot=200)
    b = m.beta_by_T.set_index("T")
    assert b.loc[1, "low"] > b.loc[8, "high"]  # the per-T check separates them
    for T in TS:
        assert b.loc[T, "low"] <= beta_T[T] <= b.loc[T, "high"], (T, b.loc[T].to_dict())
    assert residual_summary(m).set_index("T").loc["all", "rms_z"] > 2  # well beyond the evaluation noise


def test_budget_and_T(fitted):
    import pandas as pd

    from analysis.ladder import LadderError

    n = fitted.models.set_index("label")
    cands = pd.DataFrame([{"label": lb, "K": r.K, "L": r.L, "d_model": r.d_model, "N": r.N, "D": r.D,
                           "train_flops": 6.0 * r.N * r.L * r.D} for lb, r in n.iterrows()])
    budget = float(cands["train_flops"].median())
    top, verdict = fitted.best(cands, budget, 1)
    assert (top["train_flops"] <= budget).all() and top["predicted"].is_monotonic_decreasing
    assert len(set(zip(top["K"], top["L"]))) == len(top)  # one row per shape
    assert verdict["best"] == top["label"].iloc[0] and verdict["runner_up"] == top["label"].iloc[1]
    assert verdict["diff_low"] <= verdict["difference"] <= verdict["diff_high"]
    with pytest.raises(LadderError, match="no candidate trains within"):
        fitted.best(cands, 1.0, 1)
    with pytest.raises(LadderError, match="T = 16 was not evaluated"):
        fitted.targets(cands, [16])


def _study(*args):
    """The real `study` command line, in this process (typer's runner: no second torch import)."""
    from typer.testing import CliRunner

    from study.cli import app

    r = CliRunner().invoke(app, list(args))
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def test_cli_prints_the_table(synth):
    r = _study("predict", "--study", STUDY, "--results", synth, "--boot", "200", "--target", TARGET_GRID,
               "--hold-out", "largest", "--budget", "4e13", "--T", "1", "--T", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "held-out models, predicted vs measured" in out and "(2 x 1) d=128" in out and "abs error" in out
    assert "residuals of the fit" in out and "beta  =" in out and "beta at each T fitted alone" in out
    assert "targets (never trained here)" in out and "(2 x 1) d=192" in out and "training compute: ladder" in out
    assert f"targets trained in study '{TARGET_STUDY}'" in out
    assert "best model within 4e+13 training FLOPs" in out and "runner-up" in out
    assert "T=4" not in out.split("held-out models")[1].split("residuals")[0]  # --T limits the tables
    assert "warning" not in out  # the target is of the ladder's family


def test_cli_errors_are_one_line(synth, tmp_path):
    for args, what in [(("--study", "nope"), "no study 'nope'"),
                       (("--study", STUDY, "--hold-out", "nosuchrun"), "no run 'nosuchrun'"),
                       (("--study", STUDY, "--T", "16"), "T = 16 was not evaluated"),
                       (("--study", STUDY, "--budget", "-1"), "--budget -1")]:
        r = _study("predict", "--results", synth, *args)
        assert r.returncode == 2 and what in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    # too few runs: a store with three models names what is needed
    small = Store(str(tmp_path), "tiny")
    for K, L, d in [(1, 1, 48), (1, 2, 64), (2, 1, 96)]:
        run_id = f"r{K}x{L}d{d}"
        small.write_rows("runs", [full_row("runs", run_id=run_id, study="tiny", task="sudoku", task_params="{}", K=K,
                                           L_t=L, d_model=d, heads=4, batch=8, steps=10, seed=0,
                                           n_params=1000 * d, n_params_non_embedding=900 * d, status="done",
                                           config="{}", created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))],
                         f"{run_id}.parquet")
        small.write_rows("evals", [_eval(run_id, "k", 1, L, 0.5, 10)], run_id, "k.parquet")
    r = _study("predict", "--study", "tiny", "--results", str(tmp_path))
    assert r.returncode == 2 and "too few runs to fit" in r.stderr and "at least 4 models" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def synth_dw(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ladder_dw"))
    rng = np.random.default_rng(5)
    write_study(root, LADDER_GRID, rng, law=true_vpr_dw)
    write_study(root, TARGET_GRID, rng, law=true_vpr_dw)
    return root


@pytest.fixture(scope="module")
def fitted_dw(synth_dw):
    from analysis.ladder import fit_study
    from analysis.load import load_study

    return fit_study(load_study(synth_dw, STUDY), hold_out=["widest"], law="depth-width")  # fit on d <= 96


def test_depth_width_law_recovered_and_widest_predicted(fitted_dw, synth_dw):
    """A store following the depth-width law: its parameters fall in their intervals, and the held-out
    widest rung (d = 128, fitted on d = 48 / 64 / 96) and the d = 192 target are covered."""
    from analysis.ladder import measured_targets
    from analysis.load import load_study
    from study.spec.grid import load_grid
    from study.commands.predict import grid_models

    m = fitted_dw
    assert m.form.name == "depth-width" and m.beta_by_T is None and m.failed < m.n_boot // 10
    p = m.params
    for name in ("kappa", "lambda"):
        c = p[p["name"] == name].iloc[0]
        assert c["low"] <= TRUE_DW[name] <= c["high"], (name, c.to_dict())
    for T in TS:
        at = p[p["T"] == T].set_index("name")
        for name, truth in (("slope", TRUE_DW["slope"][T]), ("log10_d50", math.log10(TRUE_DW["d50"][T])),
                            ("ceiling", TRUE_DW["ceiling"][T])):
            assert at.loc[name, "low"] <= truth <= at.loc[name, "high"], (T, name, at.loc[name].to_dict())
    h = m.heldout
    assert set(h["label"]) == {f"({K} x {L}) d=128" for K, L in [(1, 1), (1, 2), (1, 3), (2, 1)]}
    assert (h["seeds"] == 2).all() and len(h) == 4 * len(TS)
    for r in h.itertuples():
        K, L = _K_L(r.label)
        assert r.low <= true_vpr_dw(r.N, L, r.T, K=K, d=128) <= r.high, (r.label, r.T, r.low, r.high)
    models, _ = grid_models(load_grid(TARGET_GRID))
    t = measured_targets(m, load_study(synth_dw, TARGET_STUDY), models)
    for r in t.itertuples():
        K, L = _K_L(r.label)
        truth = true_vpr_dw(r.N, L, r.T, K=K, d=192)
        assert r.low <= truth <= r.high, (r.label, r.T, truth, r.low, r.high)
    assert len(t) == 2 * len(TS)


def test_ladder_table_and_figure(fitted_dw, synth_dw):
    from matplotlib.figure import Figure

    from analysis.ladder import TABLE_COLUMNS, ladder_figure, ladder_table, measured_targets
    from analysis.load import load_study
    from study.spec.grid import load_grid
    from study.commands.predict import grid_models

    models, _ = grid_models(load_grid(TARGET_GRID))
    measured = measured_targets(fitted_dw, load_study(synth_dw, TARGET_STUDY), models)
    tab = ladder_table(fitted_dw, models, measured)
    assert list(tab.columns) == TABLE_COLUMNS
    assert (tab["role"] == "held out").sum() == 16 and (tab["role"] == "target").sum() == 8
    assert (tab["within_2"] == (tab["abs_error_pts"] <= 2)).all()
    assert (tab["in_band"] == ((tab["measured"] > 0.05) & (tab["measured"] < 0.95))).all()
    # a target never trained: predicted only
    alone = ladder_table(fitted_dw, models.assign(label=models["label"] + " new"), measured.iloc[:0])
    assert alone.loc[alone["role"] == "target", "measured"].isna().all()

    fig = ladder_figure(fitted_dw, models, measured, Ts=[1, 4])
    assert isinstance(fig, Figure)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["T = 1", "T = 4"]
    for ax in panels:
        assert ax.get_xscale() == "log" and "d_eff" in ax.get_xlabel()
        labels = [ln.get_label() for ln in ax.get_lines()]
        assert "law" in labels and any(lb.startswith("ladder (2 x 1)") for lb in labels)
        assert sum(lb == "ladder (1 x 1)" for lb in labels) == 1  # one marker series per shape
    assert "VPR" in panels[0].get_ylabel()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"held out: predicted", "held out: measured", "target: predicted", "target: measured"} <= set(legend)


def test_cli_depth_width_and_plot(synth_dw, tmp_path):
    out = tmp_path / "ladder.png"
    r = _study("predict", "--study", STUDY, "--results", synth_dw, "--boot", "100", "--law", "depth-width",
               "--hold-out", "widest", "--target", TARGET_GRID, "--plot", str(out))
    assert r.returncode == 0, r.stderr
    assert "kappa =" in r.stdout and "lambda =" in r.stdout and "ceiling" in r.stdout and "d_eff/ladder" in r.stdout
    assert "beta" not in r.stdout and "(post-hoc form)" in r.stdout
    assert out.stat().st_size > 10_000 and f"figure: {out}" in r.stdout
    r = _study("predict", "--study", STUDY, "--results", synth_dw, "--law", "nope")
    assert r.returncode == 2 and "--law nope: one of preregistered, depth-width" in r.stderr
