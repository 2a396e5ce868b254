"""`study predict`: the ladder law of analysis/ladder/ printed, with its three modes (held-out models,
`--target GRID`, `--budget FLOPS`; docs/guide/prediction.md); targets and candidates priced with
study/spec/cost.py's cost model (analysis never imports study, so the prices are made here).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable

import pandas as pd
import yaml

from analysis.ladder import (Ladder, LadderError, family_mismatch, fit_study, ladder_figure, measured_targets,
                             residual_summary)
from analysis.load import StudyData, training_fields

# widths of the budget's candidates beyond the ladder: the ladder's largest times these, rounded to 16
WIDTH_STEPS = (1.25, 1.5, 2.0, 2.5, 3.0, 4.0)


def fmt_n(n: float) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def pct(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{100 * v:.1f}"


def ladder_runs(data: StudyData):
    """The study's grid (as last run) expanded, as study.spec.grid.Run by run id; {} when it is absent or no
    longer expands (an older grid format)."""
    if not data.grid_text:
        return {}
    from study.spec.grid import expand

    try:
        g = expand(yaml.safe_load(data.grid_text), f"{data.dir}/grid.yaml")
    except Exception:
        return {}
    return {r.run_id: r for r in g.runs}


def model_row(run, label: str | None = None) -> dict:
    c = run.costs()
    return {"label": label or f"({run.model.K} x {run.model.L}) d={run.model.d_model}", "K": run.model.K,
            "L": run.model.L, "d_model": run.model.d_model, "N": c["n_params_non_embedding"],
            "n_params": c["n_params"], "D": run.train.steps * run.train.batch_size,
            "train_flops": run.train_flops(), "run_id": run.run_id}


def grid_models(grid) -> tuple[pd.DataFrame, list]:
    """One row per distinct model of a grid (seeds collapsed): label, K, L, d_model, N, D, train_flops
    (of one seed), seeds; and one Run per row (its first seed)."""
    rows, runs, seen = [], [], {}
    for r in grid.runs:
        key = (r.task.model_dump_json(), r.model.model_dump_json(),
               r.train.model_copy(update={"seed": 0}).model_dump_json())
        if key in seen:
            rows[seen[key]]["seeds"] += 1
            rows[seen[key]]["run_ids"].append(r.run_id)
            continue
        seen[key] = len(rows)
        rows.append({**model_row(r), "seeds": 1, "run_ids": [r.run_id]})
        runs.append(r)
    return pd.DataFrame(rows), runs


def priced(base, shapes, ladder_widths, steps=(None,)) -> pd.DataFrame:
    """A budget's candidates: run `base` (its training recipe) at each (K, L) shape, width and step count (None:
    the base's, the row labelled by its model alone), priced with study/spec/cost.py's cost model. Widths:
    the ladder's and wider ones (its largest times WIDTH_STEPS), each a multiple of 16 and of the heads."""
    quantum = 16 * base.model.n_heads // math.gcd(16, base.model.n_heads)
    top = int(max(ladder_widths))
    wider = {max(quantum, round(top * s / quantum) * quantum) for s in WIDTH_STEPS}
    widths = sorted({int(w) for w in ladder_widths} | wider)
    rows = []
    for (K, L), d, s in itertools.product(shapes, widths, steps):
        r = dataclasses.replace(base, model=base.model.model_copy(update={"K": K, "L": L, "d_model": d}))
        if s is None:
            rows.append(model_row(r))
        else:
            r = dataclasses.replace(r, train=base.train.model_copy(update={"steps": s}))
            rows.append({**model_row(r, f"({K} x {L}) d={d} s={s}"), "steps": s})
    return pd.DataFrame(rows)


def ladder_ids(law: Ladder) -> list[str]:
    """The run ids of the ladder's models (every seed), in the law's order."""
    return [r for ids in law.models.loc[law.models["role"] == "ladder", "run_ids"] for r in ids]


def header(law: Ladder, data: StudyData, echo: Callable[[str], None]) -> None:
    lad = law.models[law.models["role"] == "ladder"]
    held = law.models[law.models["role"] == "held out"]
    echo(f"study {data.name}: {law.variant}, {law.metric} on the {law.split} split ({law.sampler} sampler, "
         f"L_s = L_t), T = {', '.join(map(str, law.Ts))}")
    echo(f"law: {law.law}")
    echo(f"ladder: {len(lad)} models, {int(lad['seeds'].sum())} runs, "
         f"N {fmt_n(lad['N'].min())}..{fmt_n(lad['N'].max())} "
         f"non-embedding, L {', '.join(map(str, sorted(set(lad['L']))))}; held out: "
         + (", ".join(f"{r.label} ({r.seeds} seed{'s' if r.seeds > 1 else ''})" for r in held.itertuples()) or "none"))
    echo(f"intervals: 95%, {law.n_boot} bootstrap replicates over the ladder's runs and their test examples"
         f"{f'; {law.failed} did not converge, left out' if law.failed else ''}")
    coefficients(law, echo)
    for note in law.notes:
        echo(f"note: {note}")


def coefficients(law: Ladder, echo: Callable[[str], None]) -> None:
    """The law's shared coefficients and, per T, its slope, its midpoint (and ceiling), with intervals."""
    p = law.params
    for name, _, _, meaning in law.terms:
        c = p[p["name"] == name].iloc[0]
        what = (f"a loop is worth L^beta x the parameters: m(L=2) = {2 ** c.estimate:.2f}" if name == "beta"
                else f"{meaning}: x{2 ** c.estimate:.2f} at 2" if name in ("kappa", "lambda") else meaning)
        echo(f"  {name:<5} = {c.estimate:.3f} [{c.low:.3f}, {c.high:.3f}]  ({what})")
        if name == "beta" and law.beta_by_T is not None and len(law.Ts) > 1:
            echo("        beta at each T fitted alone (a check of the shared beta): " + "; ".join(
                f"T={r.T} {r.estimate:.2f} [{r.low:.2f}, {r.high:.2f}]" for r in law.beta_by_T.itertuples()))
    scale, fmt = law.form.scale, (fmt_n if law.form.size == "N" else (lambda v: f"{v:.0f}"))
    mid = law.form.midpoint
    for T in law.Ts:
        s = p[(p["name"] == "slope") & (p["T"] == T)].iloc[0]
        n = p[(p["name"] == mid) & (p["T"] == T)].iloc[0]
        line = (f"  T={T:<3} slope {s.estimate:.2f} [{s.low:.2f}, {s.high:.2f}] per e-fold of {scale}; "
                f"{'half the ceiling' if law.form.ceiling else '50%'} at {scale} "
                f"{fmt(10 ** n.estimate)} [{fmt(10 ** n.low)}, {fmt(10 ** n.high)}]")
        if law.form.ceiling:
            c = p[(p["name"] == "ceiling") & (p["T"] == T)].iloc[0]
            line += f"; ceiling {pct(c.estimate)}% [{pct(c.low)}, {pct(c.high)}]"
        echo(line)


def heldout_table(law: Ladder, Ts: list[int] | None, echo, h: pd.DataFrame | None = None,
                  title: str = "held-out models") -> None:
    h = law.heldout if h is None else h
    if h.empty:
        echo("held out: none (the fit used every model)")
        return
    if Ts:
        h = h[h["T"].isin(Ts)]
    echo(f"{title}, predicted vs measured (%, 95% intervals; error = predicted - measured, points):")
    cols = "  {:<16} {:>3} {:>12}  {:<19} {:<19} {:<21} {:>9}"
    echo(cols.format("model", "T", f"{law.form.scale}/ladder", "predicted", "measured", "error [95%]", "abs error"))
    for r in h.itertuples():
        echo(cols.format(r.label, r.T, f"{r.scale_vs_ladder:.2f}x",
                         f"{pct(r.predicted)} [{pct(r.low)}, {pct(r.high)}]",
                         f"{pct(r.measured)} [{pct(r.meas_low)}, {pct(r.meas_high)}]",
                         f"{r.error_pts:+.1f} [{r.err_low:+.1f}, {r.err_high:+.1f}]", f"{r.abs_error_pts:.1f}")
             + ("" if r.covered else "  outside"))
    mid = h[(h["measured"] > 0.05) & (h["measured"] < 0.95)]
    if len(mid):
        echo(f"  where the measured value is between 5% and 95%: largest abs error {mid['abs_error_pts'].max():.1f} "
             f"points, {int((mid['abs_error_pts'] <= 2).sum())} of {len(mid)} within 2 points")
    echo(f"  consistent (error interval holds 0): {int(h['covered'].sum())} of {len(h)}")


def residuals(law: Ladder, echo, worst: int = 5) -> None:
    echo("residuals of the fit on the ladder (measured seed mean - law, points; rms_z: residual / its "
         "binomial standard error, about 1 when the law fits within evaluation noise):")
    for r in residual_summary(law).itertuples():
        echo(f"  T={r.T:<4} {r.points:>3} points  rms {r.rms_pts:5.2f}  max |.| {r.max_abs_pts:5.2f}  "
             f"rms_z {r.rms_z:5.2f}")
    big = law.residuals.reindex(law.residuals["residual_pts"].abs().sort_values(ascending=False).index).head(worst)
    echo("  largest: " + "; ".join(f"{r.label} T={r.T}: {pct(r.measured)} vs {pct(r.fitted)} ({r.residual_pts:+.1f})"
                                   for r in big.itertuples()))


def targets(law: Ladder, models: pd.DataFrame, runs: list, Ts, runs_by_id: dict, echo,
            trained=None) -> pd.DataFrame | None:
    """`runs_by_id`: the study's grid (ladder_runs), to price the ladder's runs; `trained`: the StudyData of
    the target grid's own study when it is in the store (trained once to check): its finished runs are then
    compared with the prediction, and returned (measured_targets)."""
    for r, run in zip(models.itertuples(), runs):
        bad = family_mismatch(law, training_fields({}, run.training_config))
        if bad:
            echo(f"warning: {r.label} differs from the ladder's family in {'; '.join(bad)}: the law does not "
                 "cover that difference")
        if not law.vary_D and not math.isclose(r.D, law.d_ref, rel_tol=1e-9):
            echo(f"warning: {r.label} trains on D = {r.D:,} examples, the ladder on {law.d_ref:,.0f}: the law has no "
                 "data term (every ladder run saw the same D)")
    t = law.targets(models, Ts)
    echo("targets (never trained here), predicted metric (%, 95% interval):")
    Ts_shown = sorted(set(t["T"]))
    cols = "  {:<16} {:>8} {:>8} {:>12} {:>11}" + "  {:<19}" * len(Ts_shown)
    echo(cols.format("model", "params", "N", f"{law.form.scale}/ladder", "train FLOPs", *(f"T={T}" for T in Ts_shown)))
    for label, g in t.groupby("label", sort=False):
        r = g.iloc[0]
        echo(cols.format(label, fmt_n(r["n_params"]), fmt_n(r["N"]), f"{r['scale_vs_ladder']:.2f}x",
                         f"{r['train_flops']:.3g}",
                         *(f"{pct(x.predicted)} [{pct(x.low)}, {pct(x.high)}]"
                           for x in g.sort_values("T").itertuples())))
    ids = ladder_ids(law)
    ladder = [runs_by_id[r].train_flops() for r in ids if r in runs_by_id]
    flops, priced, total = float(sum(ladder)), len(ladder), len(ids)
    if priced:
        tf = float((models["train_flops"] * models["seeds"]).sum())
        echo(f"training compute: ladder {flops:.3g} FLOPs ({priced} of {total} runs priced from the study's grid), "
             f"targets {tf:.3g} FLOPs ({int(models['seeds'].sum())} runs): the ladder is {100 * flops / tf:.1f}% of "
             "the targets' compute")
    if trained is None:
        return None
    got = measured_targets(law, trained, models)
    if got.empty:
        echo(f"measured: study {trained.name!r} holds no finished evaluation of these targets yet")
    else:
        heldout_table(law, Ts, echo, got, f"targets trained in study {trained.name!r}")
    return got


def budget(law: Ladder, cands: pd.DataFrame, flops: float, Ts, where: str, echo) -> None:
    echo(f"best model within {flops:.3g} training FLOPs ({where}; study/spec/cost.py's cost model), per T:")
    for T in law._Ts(Ts):
        top, v = law.best(cands, flops, T)
        echo(f"  T={T}: best per (K x L) shape, predicted metric (%, 95% interval):")
        shapes = set(zip(law.models["K"], law.models["L"]))
        for r in top.itertuples():
            echo(f"    {r.label:<16} N {fmt_n(r.N):>7}  {r.train_flops:9.3g} FLOPs  {pct(r.predicted):>5} "
                 f"[{pct(r.low)}, {pct(r.high)}]  {law.form.scale} {r.scale_vs_ladder:.2f}x the ladder's largest"
                 + ("" if (r.K, r.L) in shapes else f"; ({r.K} x {r.L}) is not a shape of the ladder"))
        if v["runner_up"] is None:
            echo(f"    best: {v['best']} (the only shape within the budget)")
        else:
            sure = ("the fit prefers it (the paired interval excludes 0)" if v["diff_low"] > 0
                    else "not a sure choice (the paired interval holds 0)")
            echo(f"    best: {v['best']}; runner-up {v['runner_up']}: paired difference {100 * v['difference']:+.1f} "
                 f"points [{100 * v['diff_low']:+.1f}, {100 * v['diff_high']:+.1f}], best in {100 * v['p_best']:.0f}% "
                 f"of replicates: {sure}; their own intervals {'overlap' if v['overlap'] else 'do not overlap'}")


def trained_study(results: str, study: str) -> StudyData | None:
    """The target grid's own study, when the store holds runs of it."""
    from analysis.load import MissingData, load_study
    from store import Store, is_safe_name

    if not is_safe_name(study) or not Store(results, study).exists(Store(results, study).dir):
        return None
    try:
        return load_study(results, study)
    except MissingData:
        return None


def predict(data: StudyData, hold_out: list[str], target_grid, flops: float | None, Ts: list[int] | None,
            n_boot: int, echo: Callable[[str], None], results: str = "results", law_name: str = "preregistered",
            plot: str | None = None) -> None:
    law = fit_study(data, hold_out=hold_out, n_boot=n_boot, law=law_name)
    law._Ts(Ts)  # an unknown T is refused before anything is printed
    header(law, data, echo)
    heldout_table(law, Ts, echo)
    residuals(law, echo)
    runs_by_id = ladder_runs(data) if (target_grid is not None or flops is not None) else {}
    models = runs = measured = None
    if target_grid is not None:
        models, runs = grid_models(target_grid)
        trained = trained_study(results, target_grid.study) if target_grid.study != data.name else None
        measured = targets(law, models, runs, Ts, runs_by_id, echo, trained)
    if flops is not None:
        if models is not None:
            budget(law, models, flops, Ts, f"the models of {target_grid.path}", echo)
        else:
            base = next((runs_by_id[r] for r in ladder_ids(law) if r in runs_by_id), None)
            if base is None:
                raise LadderError("--budget needs candidates: the study's grid.yaml does not give its ladder's runs "
                                  "(absent, or no longer expands); give them with --target GRID")
            lad = law.models[law.models["role"] == "ladder"]  # every K with every L it trained
            cands = priced(base, list(itertools.product(sorted(set(lad["K"])), sorted(set(lad["L"])))),
                           lad["d_model"])
            budget(law, cands, flops, Ts,
                   "the ladder's (K x L) shapes at its widths and up to 4x its widest, its training recipe", echo)
    if plot:
        fig = ladder_figure(law, targets=models, measured=measured, Ts=Ts)
        fig.savefig(plot, dpi=120, bbox_inches="tight")
        echo(f"figure: {plot}")
