"""The two-step ladder law (analysis/ladder/loss.py, metric.py, twostep.py) on synthetic ladders drawn
from a known law with noise: no training, seconds.

    .venv/bin/python -m pytest -x -q tests/test_ladder_two_step.py
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

TRUE = dict(E=0.12, A=0.15, alpha=0.6, B=0.1, beta=0.5, phi=0.5)
CURVES = {2: (0.8, 25.0, 0.30), 4: (0.95, 20.0, 0.36)}  # T -> (c, k, l0)
N_REF, D_REF = 3e4, 1e5
REL_SE = 0.004  # the loss's evaluation noise, relative
N_EX = 500


def true_loss(N, L, D, K=1, kappa=0.0):
    neff = N * L ** TRUE["phi"] * K ** kappa / N_REF
    return TRUE["E"] + TRUE["A"] * neff ** -TRUE["alpha"] + TRUE["B"] * (D / D_REF) ** -TRUE["beta"]


def true_vpr(T, loss, shape="*", per_shape_shift=None):
    c, k, l0 = CURVES[T]
    if per_shape_shift:
        l0 += per_shape_shift.get(shape, 0.0)
    return c / (1 + np.exp(-k * (l0 - loss)))


def n_of(d, K):
    return 12 * K * d * d


def ladder(seed=0, kappa=0.0, shift=None, bump=0.0, widths=(48, 64, 80, 96, 128), steps=(400, 800, 1600)):
    """A synthetic ladder frame as analysis.ladder.frame builds it: final points and log-spaced checkpoints."""
    rng = np.random.default_rng(seed)
    rows = []
    shapes = [(1, 1), (1, 2), (2, 1), (1, 3)]
    for d in widths:
        for K, L in shapes:
            for s in steps:
                rid = f"r{d}_{K}x{L}_{s}"
                for step in (s // 4, s // 2, s):
                    N, D = n_of(d, K), step * 128
                    lt = true_loss(N, L, D, K, kappa) * (1 + bump * np.sin(np.log(N) * 3))
                    lm = lt * (1 + REL_SE * rng.standard_normal())
                    r = {"run_id": rid, "K": K, "L": L, "d_model": d, "N": N, "D": D, "step": step,
                         "is_checkpoint": step != s, "split": "test" if step == s else "val",
                         "elbo": lm, "elbo_se": REL_SE * lt, "n_examples": N_EX}
                    for T in CURVES:
                        r[f"vpr_T{T}"] = rng.binomial(N_EX, true_vpr(T, lt, f"({K} x {L})", shift)) / N_EX
                    rows.append(r)
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def fitted():
    from analysis.ladder.twostep import fit_two_step

    return fit_two_step(ladder(), n_boot=30, seed=1)


def test_step1_recovers_the_known_loss_law_within_its_intervals(fitted):
    from analysis.ladder.law import q95

    assert fitted.loss_fit.converged
    assert not fitted.kappa["kappa_kept"]
    names = {"alpha": 2, "beta": 4, "phi": 5}
    for name, i in names.items():
        lo, hi = q95(fitted.loss_b[:, i][:, None])
        assert lo[0] <= TRUE[name] <= hi[0], (name, lo, hi, fitted.loss_fit.params())
    got = fitted.loss_fit.params()
    assert abs(got["phi"] - TRUE["phi"]) < 0.15


def test_step2_recovers_one_curve_per_T_and_the_fit_is_not_flagged(fitted):
    from analysis.ladder.law import q95

    assert not fitted.misfit, fitted.residuals
    for T, (c, k, l0) in CURVES.items():
        m = fitted.metric[T]
        assert not m.per_shape, (T, m.lr_stat, m.lr_p)
        lo, hi = q95(fitted.metric_b[T]["*"][:, 2][:, None])
        assert lo[0] <= l0 <= hi[0]
        assert abs(m.curves["*"][2] - l0) < 0.02


def test_a_held_out_wider_model_is_predicted_within_its_interval_at_every_step(fitted):
    tgt = ladder(seed=7, widths=(192,), steps=(800,))
    final = tgt[~tgt["is_checkpoint"]].assign(label=lambda f: [f"({k} x {lp}) d=192" for k, lp in zip(f["K"], f["L"])])
    err = fitted.errors(final)
    assert len(err) == 4 * len(CURVES)
    assert err["step1_covered"].all(), err[["label", "step1_rel_error", "step1_low", "step1_high"]]
    assert (err["step1_rel_error"].abs() < 0.03).all()
    assert err["chained_covered"].mean() >= 0.75, err[["label", "T", "chained_error_pts", "chained_err_low",
                                                       "chained_err_high"]]
    assert err["step2_covered"].mean() >= 0.75
    pred = fitted.predict(final[["label", "N", "K", "L", "D"]])
    assert set(pred.columns) >= {"loss", "loss_low", "loss_high", "predicted", "low", "high", "loss_inside"}
    assert (pred["loss_low"] <= pred["loss"]).all() and (pred["loss"] <= pred["loss_high"]).all()


def test_a_misspecified_loss_law_is_flagged():
    from analysis.ladder.twostep import fit_two_step

    law = fit_two_step(ladder(bump=0.05), n_boot=5)
    assert law.misfit
    assert any(n.startswith("step 1") for n in law.notes), law.notes


def test_shapes_that_need_their_own_curve_are_fitted_per_shape():
    from analysis.ladder.twostep import fit_two_step

    law = fit_two_step(ladder(shift={"(1 x 3)": 0.08, "(2 x 1)": -0.05}), n_boot=5)
    assert all(law.metric[T].per_shape for T in CURVES)
    assert any("per shape" in n for n in law.notes)


def test_a_K_exponent_is_added_only_when_the_residuals_demand_it():
    from analysis.ladder.loss import fit_with_kappa_if_needed

    for kappa, kept in ((0.0, False), (0.4, True)):
        f = ladder(kappa=kappa)
        fit, info = fit_with_kappa_if_needed(f["N"], f["L"], f["D"], f["elbo"], f["K"], f["elbo_se"] / f["elbo"])
        assert info["kappa_kept"] is kept, info
        if kept:
            assert abs(fit.params()["kappa"] - kappa) < 0.15


def test_the_loss_fit_is_robust_to_an_outlying_checkpoint():
    from analysis.ladder.loss import fit_loss

    f = ladder()
    f.loc[5, "elbo"] *= 3  # a diverged checkpoint
    fit = fit_loss(f["N"], f["L"], f["D"], f["elbo"])
    assert fit.converged
    assert abs(fit.params()["alpha"] - TRUE["alpha"]) < 0.1


def _plan_totals(name: str) -> dict:
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "study.cli", "plan", os.path.join(root, "grids", "cpu", name),
                          "--json", "--flops-per-s", "1e11"], capture_output=True, text=True, check=True, cwd=root)
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
    return {**next(x for x in lines if x.get("totals")), "rows": [x for x in lines if not x.get("totals")]}


def test_the_pre_registered_two_step_ladder_validates_and_fits_an_hour_of_two_cores():
    """`study plan` accepts grids/cpu/ladder_two_step.yaml (and its target) and, at the demo's measured
    1e11 FLOP/s, its runs one after another take under two hours: under an hour on 2 idle cores."""
    lad = _plan_totals("ladder_two_step.yaml")
    assert lad["runs"] == len(lad["rows"]) > 0 and lad["seconds"] < 2 * 3600
    shapes = {(r["K"], r["L_t"]) for r in lad["rows"]}
    assert shapes == {(1, 1), (1, 2), (2, 1), (1, 3)}
    tgt = _plan_totals("ladder_two_step_target.yaml")
    assert tgt["rows"] and not {r["run_id"] for r in tgt["rows"]} & {r["run_id"] for r in lad["rows"]}


def _rungs(widths, steps=800):
    return pd.DataFrame([{"label": f"({K} x {L}) d={d}", "N": n_of(d, K), "K": K, "L": L, "steps": steps}
                         for d in widths for K, L in ((1, 1), (1, 2))])


def test_design_check_passes_rungs_that_bracket_the_target_and_flags_ones_that_do_not(fitted):
    from analysis.ladder.design import check_design, checkpoint_points

    target = pd.DataFrame([{"label": "d=160", "N": n_of(160, 1), "K": 1, "L": 2, "D": 800 * 128}])
    # the pre-registered grid's recipe: a steps axis (1,600 steps at d = 128) brackets a wider target's loss
    rungs = pd.concat([_rungs((48, 64, 96, 128)), _rungs((128,), steps=1600)], ignore_index=True)
    assert not check_design(fitted, checkpoint_points(_rungs((48, 64, 96, 128)), 100, 128), target)["targets"][0][2]
    good = check_design(fitted, checkpoint_points(rungs, 100, 128), target)
    assert good["warnings"] == [], good
    assert good["targets"][0][2]
    # rungs far too small: the target's loss lies below all of them, and the rungs sit at the floor
    bad = check_design(fitted, checkpoint_points(_rungs((8, 10, 12), steps=100), 50, 128), target)
    assert not bad["targets"][0][2]
    assert any("outside" in w for w in bad["warnings"]) and any("floor" in w for w in bad["warnings"])


def test_the_frame_is_built_from_store_tables_as_the_contract_says():
    import json

    from analysis.ladder.frame import ladder_frame

    runs = pd.DataFrame([{"run_id": "a", "status": "done", "K": 1, "L_t": 2, "d_model": 64, "n_params": 50_000,
                          "n_params_non_embedding": 40_000, "steps": 800, "batch": 128}])
    ev = [{"run_id": "a", "T": 0, "L_s": 2, "sampler": "likelihood", "split": s, "n_examples": n, "metric": m,
           "value": v, "ci_low": v - 0.0196, "ci_high": v + 0.0196}
          for s, n in (("test", 500), ("val", 200)) for m, v in (("elbo", 0.3), ("ref_nll", 0.2))]
    ev += [{"run_id": "a", "T": T, "L_s": 2, "sampler": "confidence", "split": "test", "n_examples": 500,
            "metric": "vpr", "value": 0.1 * T, "ci_low": 0.0, "ci_high": 1.0} for T in (2, 4)]
    hist = pd.DataFrame([{"run_id": "a", "step": 400, "val": json.dumps({"val_elbo": 0.4, "val_ref_nll": 0.3,
                                                                          "val_vpr_T2": 0.05, "val_vpr_T4": 0.2})},
                         {"run_id": "a", "step": 10, "val": None}])
    f = ladder_frame(runs, pd.DataFrame(ev), hist)
    assert len(f) == 2
    fin, ck = f[~f["is_checkpoint"]].iloc[0], f[f["is_checkpoint"]].iloc[0]
    assert (fin["D"], fin["elbo"], fin["vpr_T2"], fin["vpr_T4"], fin["n_examples"]) == (800 * 128, 0.3, 0.2, 0.4, 500)
    assert abs(fin["elbo_se"] - 0.01) < 1e-4
    assert (ck["D"], ck["elbo"], ck["vpr_T4"], ck["n_examples"], ck["split"]) == (400 * 128, 0.4, 0.2, 200, "val")
    assert abs(ck["elbo_se"] - 0.4 * 0.01 / 0.3) < 1e-4
