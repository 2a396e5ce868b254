"""`study predict --law two-step` on a synthetic store drawn from a known two-step law (the ladder of
tests/test_ladder_two_step.py written as real Parquet through store.Store: runs rows, the test ELBO as
nll-test rows, VPR rate rows per T, checkpoints as history rows' val JSON). Nothing is trained.

    .venv/bin/python -m pytest -x -q tests/test_predict_two_step.py
"""
from __future__ import annotations

import datetime as dt
import json

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


def write_store(root: str, frame, continuous: bool = True) -> None:
    """Each run of `frame` (analysis.ladder.frame's columns) as the store keeps it."""
    store = Store(root, STUDY)
    for rid, g in frame.groupby("run_id"):
        fin = g[~g["is_checkpoint"]].iloc[0]
        K, L = int(fin["K"]), int(fin["L"])
        store.write_rows("runs", [full_row(
            "runs", run_id=rid, study=STUDY, task="sudoku", task_params="{}", K=K, L_t=L, d_model=int(fin["d_model"]),
            heads=4, batch=128, steps=int(fin["step"]), seed=0, n_params=int(fin["N"]) + 1000,
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
