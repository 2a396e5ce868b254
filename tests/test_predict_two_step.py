"""`study predict --law two-step` on a synthetic store drawn from a known two-step law (the ladder of
tests/test_ladder_two_step.py written as real Parquet through store.Store: runs rows, the test ELBO as
nll-test rows, VPR rate rows per T, checkpoints as history rows' val JSON). Nothing is trained.

    .venv/bin/python -m pytest -x -q tests/test_predict_two_step.py
"""
from __future__ import annotations

import datetime as dt
import os
import json

import pandas as pd
import pytest

from store import Store
from tests.helpers import full_row
from tests.test_ladder import _study
from tests.test_ladder_two_step import CURVES, N_EX, ladder

STUDY = "two_step"
WHEN = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _ev(rid, key, T, L, sampler, split, metric, value, se=None):
    lo, hi = (None, None) if se is None else (value - 1.959964 * se, value + 1.959964 * se)
    return full_row("evals", run_id=rid, eval_key=key, T=T, L_s=L, sampler=sampler, split=split, n_examples=N_EX,
                    metric=metric, value=float(value), ci_low=lo, ci_high=hi, forward_passes=max(T, 1) * L,
                    eval_flops=1, eval_seconds=0.1, created_at=WHEN)


def write_store(root: str, frame, continuous: bool = True, study: str = STUDY) -> None:
    """Each run of `frame` (analysis.ladder.frame's columns) as the store keeps it."""
    store = Store(root, study)
    for rid, g in frame.groupby("run_id"):
        fin = g[~g["is_checkpoint"]].iloc[0]
        K, L = int(fin["K"]), int(fin["L"])
        store.write_rows("runs", [full_row(
            "runs", run_id=rid, study=study, task="sudoku", task_params="{}", K=K, L_t=L, d_model=int(fin["d_model"]),
            heads=4, batch=128, steps=int(fin["step"]), seed=int(fin.get("seed", 0)), n_params=int(fin["N"]) + 1000,
            n_params_non_embedding=int(fin["N"]), status="done", config=json.dumps({"run": rid}),
            created_at=WHEN)], f"{rid}.parquet")
        rows = [_ev(rid, f"T{T}-Ls{L}-confidence", T, L, "confidence", "test", "vpr", fin[f"vpr_T{T}"]) for T in CURVES]
        if continuous:
            rows += [_ev(rid, f"nll-{s}", 0, L, "likelihood", s, "elbo", fin["elbo"], fin["elbo_se"])
                     for s in ("test", "val")]
        for row in rows:  # one file per eval key, as `study run` writes them
            store.write_rows("evals", [row], rid, f"{row['eval_key']}.parquet")
        store.write_rows("history", [full_row(
            "history", run_id=rid, step=int(c["step"]), loss=0.5, L_t=L, lr=1e-3, seconds=1.0, attempt=1,
            val=json.dumps({"val_elbo": float(c["elbo"]), **{f"val_vpr_T{T}": float(c[f"vpr_T{T}"]) for T in CURVES}}))
            for c in g[g["is_checkpoint"]].to_dict("records")], f"{rid}.parquet")


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("two_step"))
    write_store(root, ladder(widths=(48, 64, 96, 128, 192), steps=(400, 800)))
    return root


def test_cli_prints_the_errors_of_each_step_apart(synth, tmp_path):
    png = str(tmp_path / "ladder.png")
    r = _study("predict", "--study", STUDY, "--results", synth, "--law", "two-step", "--boot", "50", "--plot", png)
    assert r.returncode == 0, r.stderr + r.stdout
    out = r.stdout
    assert "the two-step law" in out and "step 1: l = E + A N_eff^-alpha" in out
    table = out.split("held-out models, errors per step")[1].split("residuals")[0]
    # the largest N is held out: (2 x 1) d=192 at both step counts, each at every T
    assert table.count("(2 x 1) d=192") == 2 * len(CURVES), table
    assert "step 1 [95%]" in table and "step 2 [95%]" in table and "chained [95%]" in table
    assert "step 1 (loss)" in out and "misfit: no" in out
    from matplotlib.image import imread

    assert f"figure: {png}" in out and imread(png).shape[1] > 2 * imread(png).shape[0] * 0.9  # two panels side by side


def test_a_store_without_the_test_elbo_gets_one_line_naming_backfill(tmp_path):
    write_store(str(tmp_path), ladder(widths=(48, 64), steps=(400,)), continuous=False)
    r = _study("predict", "--study", STUDY, "--results", str(tmp_path), "--law", "two-step")
    assert r.returncode == 2 and f"study backfill --study {STUDY}" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_design_check_passes_the_preregistered_grid_and_flags_the_old_ladder(synth):
    from tests.helpers import ROOT

    target = f"{ROOT}/grids/cpu/ladder_two_step_target.yaml"
    outs = {}
    for name in ("ladder_two_step.yaml", "ladder.yaml"):
        r = _study("predict", "--study", STUDY, "--results", synth, "--design", f"{ROOT}/grids/cpu/{name}",
                   "--target", target, "--boot", "50")
        assert r.returncode == 0, r.stderr + r.stdout
        outs[name] = r.stdout
    good, old = outs["ladder_two_step.yaml"], outs["ladder.yaml"]
    assert "loss the rungs and their checkpoints are predicted to cover" in good
    assert "design: passes" in good and "warning" not in good and "outside" not in good
    assert "predicted at a metric floor or ceiling" in good
    # the old ladder has no steps axis: the (1 x 2) d=160 target's loss lies below every rung's
    assert "target (1 x 2) d=160" in old and "outside: step 2 would extrapolate" in old
    assert "warning: target (1 x 2) d=160" in old and "design: 1 warning(s)" in old


def test_design_needs_a_target():
    r = _study("predict", "--design", "grids/cpu/ladder.yaml")
    assert r.returncode == 2 and "--target TARGET_GRID" in r.stderr, r.stderr


def test_the_bar_is_computed_part_by_part_and_fails_where_the_errors_miss():
    """analysis.ladder.criteria on a law fitted to the true two-step law: errors made to miss by hand fail
    the parts they should, and only those."""
    import pandas as pd

    from analysis.ladder.criteria import check_bar
    from analysis.ladder.frame import split_holdout
    from analysis.ladder.twostep import fit_two_step

    f = ladder(widths=(48, 64, 96, 128, 192), steps=(800,))
    f = f.assign(label=[f"({k} x {lp}) d={d}" for k, lp, d in zip(f["K"], f["L"], f["d_model"])])
    lad, held = split_holdout(f, ["widest"])
    law = fit_two_step(lad, n_boot=40, seed=2)
    errs = law.errors(held)
    good = check_bar(law, errs, held)
    assert list(good["criterion"]) == [1, 2, 3, 4]
    assert good.set_index("criterion").loc[4, "passed"] == (not law.misfit)
    bad = errs.copy()
    bad.loc[bad.index[0], "step1_rel_error"] = 0.05  # 5% off: criterion 1 fails
    mid = bad[(bad["measured"] >= 0.05) & (bad["measured"] <= 0.95)].index
    bad.loc[mid[:2], "chained_error_pts"] = 9.0  # two misses: more than one in six
    bad.loc[bad.index[-1], "chained_covered"] = False
    got = check_bar(law, bad, held).set_index("criterion")["passed"]
    assert not got[1] and not got[3]
    assert not got[2] or len(mid) < 2
    one = check_bar(law, errs.assign(chained_error_pts=0.0, step1_rel_error=0.0, step1_low=-0.01, step1_high=0.01,
                                     step1_covered=True, step2_covered=True, chained_covered=True), held)
    assert one.set_index("criterion").loc[[1, 3], "passed"].all()
    assert pd.api.types.is_bool_dtype(one["passed"])


@pytest.mark.slow  # three fits of the two-step law with their bootstraps: minutes on 2 cores
def test_hold_out_widest_prints_the_bar_and_a_trained_target_is_measured_against_it(synth, tmp_path):
    """The backtest (`--hold-out widest`) and the target (`--target GRID` whose study the store holds) are
    both held to the bar, part by part; the target's seeds are matched to the grid's models by shape,
    width and steps."""
    from tests.helpers import ROOT

    r = _study("predict", "--study", STUDY, "--results", synth, "--law", "two-step", "--hold-out", "widest",
               "--boot", "50")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "bar on the held-out models" in r.stdout
    for part in ("  1. ", "  2. ", "  3. ", "  4. "):
        assert part in r.stdout, r.stdout
    assert "bar: passed" in r.stdout or "bar: not passed" in r.stdout
    target = f"{ROOT}/grids/cpu/ladder_two_step_target.yaml"
    frames = [ladder(seed=s, widths=(160,), steps=(800,)) for s in range(3)]
    tgt = pd.concat([fr.assign(run_id=fr["run_id"] + f"_s{s}", seed=s) for s, fr in enumerate(frames)], ignore_index=True)
    tgt = tgt[tgt["K"].eq(1) & tgt["L"].isin([1, 2])]
    write_store(synth, tgt, study="cpu_ladder_two_step_target")
    r = _study("predict", "--study", STUDY, "--results", synth, "--law", "two-step", "--target", target,
               "--boot", "50", "--T", "2", "--T", "4")
    assert r.returncode == 0, r.stderr + r.stdout
    out = r.stdout
    assert "measured: 2 targets, 6 runs trained in study 'cpu_ladder_two_step_target'" in out, out
    assert "bar on the targets" in out and out.count("(1 x 2) d=160") >= 2


@pytest.mark.slow  # two fits of the two-step law with their bootstraps
def test_budget_names_the_best_shape_width_and_steps_from_the_two_step_law(synth):
    from store import Store
    from tests.helpers import ROOT

    r = _study("predict", "--study", STUDY, "--results", synth, "--law", "two-step", "--budget", "1e13")
    assert r.returncode == 2 and "grid.yaml" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    text = open(f"{ROOT}/grids/cpu/ladder_two_step.yaml").read().replace("study: cpu_ladder_two_step", f"study: {STUDY}")
    st = Store(synth, STUDY)
    st.write_bytes(st.path("grid.yaml"), text.encode())
    try:
        r = _study("predict", "--study", STUDY, "--results", synth, "--law", "two-step", "--budget", "1e13",
                   "--boot", "50", "--T", "4")
        assert r.returncode == 0, r.stderr + r.stdout
        assert "best model within 1e+13 training FLOPs, by the two-step law" in r.stdout
        line = next(x for x in r.stdout.splitlines() if x.startswith("  T=4: "))
        assert " s=" in line and " d=" in line and "VPR" in line, line
        flops = float(line.split("FLOPs")[0].split()[-1])
        assert flops <= 1e13
        assert "runner-up shape" in r.stdout
        r = _study("predict", "--study", STUDY, "--results", synth, "--law", "two-step", "--budget", "1e3")
        assert r.returncode == 2 and "no candidate trains within --budget" in r.stderr, r.stderr
    finally:
        st.delete(st.path("grid.yaml"))


def test_report_ladder_figure_draws_both_steps_when_runs_store_the_elbo(synth, tmp_path, monkeypatch):
    """`study report --figure ladder` on a store with the test ELBO: the two-step law's two panels (loss vs
    N_eff, VPR vs loss per T) and its held-out errors as the figure's table; without the ELBO, the one-step."""
    import analysis.figures.ladder as fl
    from analysis.figures import FIGURES, Options
    from analysis.load import load_study

    monkeypatch.setattr(fl, "N_BOOT_FIGURE", 20)
    paths = FIGURES["ladder"](load_study(synth, STUDY), str(tmp_path), Options())
    names = sorted(os.path.basename(p) for p in paths)
    assert "ladder.png" in names and "ladder_two_step_errors.csv" in names, names
    errs = pd.read_csv(tmp_path / "ladder_two_step_errors.csv")
    assert {"step1_rel_error", "step2_error_pts", "chained_error_pts"} <= set(errs.columns)
    assert set(errs["label"]) == {"(2 x 1) d=192 s=400", "(2 x 1) d=192 s=800"}
