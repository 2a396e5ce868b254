"""`study predict --law two-step --budget FLOPS`: the (K x L, width, steps) that the two-step law predicts
reaches the best metric within a training budget, at each T, with its interval and the runner-up shape.

Candidates (our choice): the ladder's (K x L) shapes, at its widths and wider ones (as the one-step
`--budget` takes them: study.commands.predict.candidate_widths), trained for each of the ladder's step counts
and 2x and 4x its longest, every one priced with the ladder's own training recipe (its grid's first run)
by study/spec/cost.py's cost model. A candidate outside the ladder's N or D is an extrapolation of step 1
and one whose predicted loss lies outside the ladder's losses an extrapolation of step 2: both are named.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pandas as pd

from analysis.ladder import LadderError
from analysis.ladder.law import q95
from analysis.load import StudyData
from study.commands.predict import candidate_widths, fmt_n, ladder_runs, model_row, pct

STEP_STEPS = (2, 4)  # longer training than the ladder's longest, as multiples of it


def candidates(data: StudyData, lad: pd.DataFrame) -> pd.DataFrame:
    """The candidates above, one row per (K, L, d_model, steps): label, K, L, d_model, N, D, steps, train_flops."""
    runs_by_id = ladder_runs(data)
    base = next((runs_by_id[r] for r in sorted(set(lad["run_id"])) if r in runs_by_id),
                next(iter(runs_by_id.values()), None))  # the ladder's run, else the grid's first
    if base is None:
        raise LadderError("--budget needs the ladder's recipe: the study's grid.yaml does not give its runs "
                          "(absent, or no longer expands)")
    widths = candidate_widths(lad["d_model"], base.model.n_heads)
    fin = lad[~lad["is_checkpoint"]]
    longest = int(fin["step"].max())
    steps = sorted(set(fin["step"].astype(int)) | {longest * m for m in STEP_STEPS})
    rows = []
    for K, L in sorted(set(zip(lad["K"].astype(int), lad["L"].astype(int)))):
        for d in widths:
            for s in steps:
                r = dataclasses.replace(base, model=base.model.model_copy(update={"K": K, "L": L, "d_model": d}),
                                        train=base.train.model_copy(update={"steps": s}))
                rows.append({**model_row(r, f"({K} x {L}) d={d} s={s}"), "steps": s})
    return pd.DataFrame(rows)


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
             f"{l_est[best]:.4g}  VPR {pct(est[best])} [{pct(lo[0])}, {pct(hi[0])}]" + (f"; {', '.join(where)}" if where else ""))
        shape = (b["K"], b["L"])
        other = [j for j in order if (within.iloc[j]["K"], within.iloc[j]["L"]) != shape]
        if not other:
            echo("    the only shape within the budget")
            continue
        j = int(other[0])
        diff = boot[:, best] - boot[:, j]
        dlo, dhi = q95(diff[:, None])
        sure = "the law prefers it (the paired interval excludes 0)" if dlo[0] > 0 else "not a sure choice (the paired interval holds 0)"
        echo(f"    runner-up shape: {within.iloc[j]['label']} VPR {pct(est[j])}; paired difference "
             f"{100 * (est[best] - est[j]):+.1f} points [{100 * dlo[0]:+.1f}, {100 * dhi[0]:+.1f}]: {sure}")
