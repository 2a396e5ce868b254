"""`study predict --law two-step`: the two-step law of analysis/ladder/twostep.py fitted on a study's runs
and their checkpoints, printed with its errors per step, its bar and `--budget` (docs/guide/prediction.md).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from analysis.ladder import LadderError
from analysis.ladder.frame import split_holdout, study_frame
from analysis.ladder.law import q95
from analysis.ladder.twostep import MISFIT, fit_two_step, vpr_Ts
from analysis.load import StudyData
from study.commands.predict import fmt_n, grid_models, ladder_runs, pct, priced

def predict_two_step(data: StudyData, hold_out: list[str], target_grid, Ts: list[int] | None, n_boot: int,
                     echo: Callable[[str], None], plot: str | None = None, trained: StudyData | None = None,
                     flops: float | None = None) -> None:
    """`trained`: the target grid's own study when the store holds it (its finished runs are then measured
    against the prediction and held to the bar); `flops`: a training budget (`budget` below)."""
    f = study_frame(data)
    lad, held = split_holdout(f, hold_out)
    have = vpr_Ts(f)
    for T in Ts or []:
        if T not in have:
            raise LadderError(f"--T {T}: T = {T} was not evaluated (evaluated: {', '.join(map(str, have))})")
    law = fit_two_step(lad, Ts=Ts, n_boot=n_boot)
    p = law.loss_fit.params()
    n_ck = int(lad["is_checkpoint"].sum())
    echo(f"study {data.name}: the two-step law, test ELBO -> VPR (analysis/ladder/twostep.py), T = "
         f"{', '.join(map(str, law.Ts))}")
    echo(f"ladder: {lad['label'].nunique()} models, {lad['run_id'].nunique()} runs, {n_ck} checkpoints, N "
         f"{fmt_n(lad['N'].min())}..{fmt_n(lad['N'].max())} non-embedding; held out: "
         + (", ".join(sorted(held["label"].unique())) or "none"))
    echo(f"step 1: l = E + A N_eff^-alpha + B D^-beta, N_eff = N L^phi{' K^kappa' if law.loss_fit.with_kappa else ''}: "
         + ", ".join(f"{k} {v:.3g}" for k, v in p.items() if k != "kappa" or law.loss_fit.with_kappa)
         + ("" if law.loss_fit.converged else " (did not converge)"))
    for T in law.Ts:
        m = law.metric[T]
        echo(f"step 2, T={T}: VPR = c sigmoid(k (l0 - l)), "
             + ("one curve per shape" if m.per_shape else "one curve for every shape"))
    echo(f"intervals: 95%, {law.n_boot} bootstrap replicates over the ladder's runs, checkpoints and examples")
    errors = _errors(law, held, echo)
    echo(f"residuals, x the evaluation noise (misfit above {MISFIT:g}):")
    for r in law.residuals.itertuples():
        what = "step 1 (loss)" if r.step == 1 else f"step 2 (T={int(r.T)})"
        echo(f"  {what:<15} rms {r.rms_z:.2f} over {r.points} points" + ("  MISFIT" if r.rms_z > MISFIT else ""))
    echo("misfit: " + ("yes, the law misfits the ladder: read its predictions with care" if law.misfit else "no"))
    for note in law.notes:
        echo(f"note: {note}")
    if not held.empty:
        _bar(law, errors, held, "held-out models", echo)
    if target_grid is not None:
        _targets(law, target_grid, Ts, echo)
        if trained is not None:
            _measured_targets(law, trained, target_grid, echo)
    if flops is not None:
        budget_two_step(law, data, lad, flops, Ts, echo)
    if plot:
        from analysis.ladder.twostep_figure import two_step_figure

        two_step_figure(law, lad, held).savefig(plot, dpi=120, bbox_inches="tight")
        echo(f"figure: {plot}")


def _errors(law, held: pd.DataFrame, echo, what: str = "held-out models") -> pd.DataFrame | None:
    """Prints the errors per step of `held` (TwoStep.errors) and returns them (None when `held` is empty)."""
    if held.empty:
        echo("held out: none (the fit used every model)")
        return None
    e = law.errors(held)
    echo(f"{what}, errors per step (step 1: loss, % relative; step 2 and chained: VPR, points; 95%):")
    cols = "  {:<18} {:>3} {:<24} {:<10} {:<22} {:<22}"
    echo(cols.format("model", "T", "step 1 [95%]", "measured", "step 2 [95%]", "chained [95%]").rstrip())
    for r in e.itertuples():
        flag = "" if (r.step1_covered and r.step2_covered and r.chained_covered) else "  outside"
        echo(cols.format(r.label, r.T,
                         f"{100 * r.step1_rel_error:+.2f} [{100 * r.step1_low:+.2f}, {100 * r.step1_high:+.2f}]",
                         pct(r.measured),
                         f"{r.step2_error_pts:+.1f} [{r.step2_err_low:+.1f}, {r.step2_err_high:+.1f}]",
                         f"{r.chained_error_pts:+.1f} [{r.chained_err_low:+.1f}, {r.chained_err_high:+.1f}]").rstrip() + flag)
    return e


def _bar(law, errors: pd.DataFrame, measured: pd.DataFrame, what: str, echo) -> None:
    """The pre-registered bar (analysis.ladder.criteria) on `what`, part by part, and its verdict."""
    from analysis.ladder.criteria import check_bar

    bar = check_bar(law, errors, measured)
    echo(f"the two-step ladder's bar on the {what} (analysis/ladder/criteria.py; docs/guide/prediction.md):")
    for r in bar.itertuples():
        echo(f"  {r.criterion}. {'pass' if r.passed else 'FAIL'}: {r.detail}")
    echo(f"bar: {'passed' if bar['passed'].all() else 'not passed'} ({int(bar['passed'].sum())} of {len(bar)} parts)")


def _measured_targets(law, trained: StudyData, grid, echo) -> None:
    """The targets the store holds trained (the target grid's own study): errors per step and the bar."""
    try:
        f = study_frame(trained)
    except LadderError as e:
        echo(f"measured: study {trained.name!r}: {e}")
        return
    fin = f[~f["is_checkpoint"]]
    models, runs = grid_models(grid)
    want = {(int(m.K), int(m.L), int(m.d_model), int(r.train.steps)) for m, r in zip(models.itertuples(), runs)}
    fin = fin[[(int(k), int(lp), int(d), int(s)) in want
               for k, lp, d, s in zip(fin["K"], fin["L"], fin["d_model"], fin["step"])]]
    if fin.empty:
        echo(f"measured: study {trained.name!r} holds no finished run of these targets yet")
        return
    echo(f"measured: {fin['label'].nunique()} targets, {len(fin)} runs trained in study {trained.name!r}")
    _bar(law, _errors(law, fin, echo, "targets"), fin, "targets", echo)


def _targets(law, grid, Ts, echo) -> None:
    models, _ = grid_models(grid)
    pred = law.predict(models[["label", "N", "K", "L", "D"]], Ts)
    echo(f"targets (never trained here), from {grid.path}: predicted loss and VPR (%), 95% intervals:")
    for r in pred.itertuples():
        echo(f"  {r.label:<18} T={r.T:<3} loss {r.loss:.4g} [{r.loss_low:.4g}, {r.loss_high:.4g}]"
             f"{'' if r.loss_inside else ' (outside the ladder losses: step 2 extrapolates)'}  "
             f"VPR {pct(r.predicted)} [{pct(r.low)}, {pct(r.high)}]")


def design_check(data: StudyData, design_grid, target_grid, Ts: list[int] | None, n_boot: int,
                 echo: Callable[[str], None]) -> None:
    """`--design GRID --target TARGET_GRID`: the two-step law fitted on the whole study (the prior) checks a
    ladder's design before any of it trains (analysis.ladder.design.check_design)."""
    from analysis.ladder.design import check_design, checkpoint_points

    f = study_frame(data)
    law = fit_two_step(f, Ts=Ts, n_boot=n_boot)
    models, runs = grid_models(design_grid)
    points = pd.concat([checkpoint_points(pd.DataFrame([{"label": m["label"], "N": m["N"], "K": m["K"], "L": m["L"],
                                                         "steps": r.train.steps}]),
                                          r.train.checkpoint_every or r.train.steps, r.train.batch_size)
                        for m, r in zip(models.to_dict("records"), runs)], ignore_index=True)
    targets, _ = grid_models(target_grid)
    got = check_design(law, points, targets[["label", "N", "K", "L", "D"]], Ts)
    lo, hi = got["loss_range"]
    echo(f"design {design_grid.path}: {len(models)} rungs, {int(points['is_checkpoint'].sum())} checkpoints; the "
         f"prior: the two-step law fitted on study {data.name} ({f['run_id'].nunique()} runs)"
         + ("; it misfits its own ladder: read this with care" if law.misfit else ""))
    echo(f"loss the rungs and their checkpoints are predicted to cover: [{lo:.4g}, {hi:.4g}]")
    for label, loss, inside in got["targets"]:
        echo(f"  target {label}: predicted loss {loss:.4g}, "
             + ("inside: step 2 interpolates" if inside else "outside: step 2 would extrapolate"))
    for T, share in sorted(got["at_floor_or_ceiling"].items()):
        echo(f"  T={T}: {100 * share:.0f}% of the rungs predicted at a metric floor or ceiling")
    for w in got["warnings"]:
        echo(f"warning: {w}")
    echo("design: " + ("passes" if not got["warnings"] else f"{len(got['warnings'])} warning(s)"))


# ---- --budget: the candidates and their choice are in docs/guide/prediction.md ("A budget")
STEP_STEPS = (2, 4)  # longer training than the ladder's longest, as multiples of it


def candidates(data: StudyData, lad: pd.DataFrame) -> pd.DataFrame:
    """The candidates above, one row per (K, L, d_model, steps): label, K, L, d_model, N, D, steps, train_flops."""
    runs_by_id = ladder_runs(data)
    base = next((runs_by_id[r] for r in sorted(set(lad["run_id"])) if r in runs_by_id),
                next(iter(runs_by_id.values()), None))  # the ladder's run, else the grid's first
    if base is None:
        raise LadderError("--budget needs the ladder's recipe: the study's grid.yaml does not give its runs "
                          "(absent, or no longer expands)")
    fin = lad[~lad["is_checkpoint"]]
    longest = int(fin["step"].max())
    steps = sorted(set(fin["step"].astype(int)) | {longest * m for m in STEP_STEPS})
    return priced(base, sorted(set(zip(lad["K"].astype(int), lad["L"].astype(int)))), lad["d_model"], steps)


def budget_two_step(law, data: StudyData, lad: pd.DataFrame, flops: float, Ts: list[int] | None,
                    echo: Callable[[str], None]) -> None:
    cands = candidates(data, lad)
    within = cands[cands["train_flops"] <= flops].reset_index(drop=True)
    if within.empty:
        raise LadderError(f"no candidate trains within --budget {flops:.3g} FLOPs (the cheapest needs "
                          f"{cands['train_flops'].min():.3g})")
    n_max, d_max = float(lad["N"].max()), float(lad["D"].max())
    lo_l, hi_l = law.loss_range
    l_est, _ = law.predict_loss(within)
    echo(f"best model within {flops:.3g} training FLOPs, by the two-step law ({len(within)} of {len(cands)} "
         "candidates: the ladder's shapes, its widths and wider, its step counts and 2x, 4x its longest; "
         "study/spec/cost.py's cost model), per T:")
    for T in Ts or law.Ts:
        est, boot = law.metric_boot(within, T)
        order = np.argsort(-est, kind="stable")
        best = int(order[0])
        b = within.iloc[best]
        lo, hi = q95(boot[:, [best]])
        where = []
        if b["N"] > n_max or b["D"] > d_max:
            where.append("step 1 extrapolates (beyond the ladder's N or D)")
        if not lo_l <= l_est[best] <= hi_l:
            where.append("step 2 extrapolates (loss outside the ladder's)")
        echo(f"  T={T}: {b['label']}  N {fmt_n(b['N'])}  {b['train_flops']:.3g} FLOPs  predicted loss "
             f"{l_est[best]:.4g}  VPR {pct(est[best])} [{pct(lo[0])}, {pct(hi[0])}]"
             + (f"; {', '.join(where)}" if where else ""))
        shape = (b["K"], b["L"])
        other = [j for j in order if (within.iloc[j]["K"], within.iloc[j]["L"]) != shape]
        if not other:
            echo("    the only shape within the budget")
            continue
        j = int(other[0])
        diff = boot[:, best] - boot[:, j]
        dlo, dhi = q95(diff[:, None])
        sure = ("the law prefers it (the paired interval excludes 0)" if dlo[0] > 0
                else "not a sure choice (the paired interval holds 0)")
        echo(f"    runner-up shape: {within.iloc[j]['label']} VPR {pct(est[j])}; paired difference "
             f"{100 * (est[best] - est[j]):+.1f} points [{100 * dlo[0]:+.1f}, {100 * dhi[0]:+.1f}]: {sure}")
