"""The pass bar of a pre-registered two-step ladder (written into `grids/cpu/ladder_two_step.yaml`'s header
before that ladder ran), computed, never read off a table: its four parts are in docs/guide/prediction.md
("The bar, computed") and in check_bar's rows below; the leave-widest-rung-out backtest is this check on
`--hold-out widest`.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.ladder.twostep import MISFIT, TwoStep

REL = 0.02  # part 1: step 1's relative loss error
PTS = 2.0  # part 2: the chained error, in points (or 2 x the seed mean's standard error, if larger) ...
BAND = (0.05, 0.95)  # ... where the measured metric lies in this band


def seed_se(measured: pd.DataFrame, label: str, T: int) -> float:
    """The standard error of one model's seed mean of vpr_T<T> (NaN with one seed)."""
    v = measured.loc[measured["label"] == label, f"vpr_T{T}"].to_numpy(float)
    return float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan


def check_bar(law: TwoStep, errors: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """One row per part of the bar (criterion 1..4, passed, detail) for `errors` (TwoStep.errors on
    `measured`, the held-out or target models' final points, one row per seed)."""
    rows = []
    per_model = errors.drop_duplicates("label")
    bad1 = [r.label for r in per_model.itertuples() if abs(r.step1_rel_error) > REL or not r.step1_covered]
    rows.append({"criterion": 1, "passed": not bad1 and len(per_model) > 0,
                 "detail": "step 1 within {:.0f}% and its interval holds 0: ".format(100 * REL)
                 + "; ".join(f"{r.label} {100 * r.step1_rel_error:+.2f}% [{100 * r.step1_low:+.2f}, "
                             f"{100 * r.step1_high:+.2f}]" for r in per_model.itertuples())})
    pts = errors.assign(se=[seed_se(measured, r.label, r.T) for r in errors.itertuples()])
    pts = pts.assign(bar=[max(PTS, 2 * 100 * s) if math.isfinite(s) else PTS for s in pts["se"]])
    pts = pts.assign(hit=pts["chained_error_pts"].abs() <= pts["bar"])
    eligible = pts[(pts["measured"] >= BAND[0]) & (pts["measured"] <= BAND[1])]
    need = len(eligible) - len(eligible) // 6
    hits = int(eligible["hit"].sum())
    rows.append({"criterion": 2, "passed": len(eligible) > 0 and hits >= need,
                 "detail": f"chained error within max({PTS:g} points, 2 x seed se) at {hits} of {len(eligible)} points "
                 f"in {100 * BAND[0]:.0f}-{100 * BAND[1]:.0f}% (needed {need}); "
                 + "; ".join(f"{r.label} T={r.T} {r.chained_error_pts:+.2f} (bar {r.bar:.2f})" + ("" if r.hit else " MISS")
                             for r in eligible.itertuples())
                 + ("" if len(eligible) == len(pts) else f"; {len(pts) - len(eligible)} point(s) outside the band")})
    cov = pts[["step1_covered", "step2_covered", "chained_covered"]].all(axis=1)
    rows.append({"criterion": 3, "passed": bool(cov.all()) and len(pts) > 0,
                 "detail": f"every error interval holds 0 at {int(cov.sum())} of {len(pts)} points"
                 + "".join(f"; not at {r.label} T={r.T}" for r, ok in zip(pts.itertuples(), cov) if not ok)})
    worst = law.residuals["rms_z"].max()
    rows.append({"criterion": 4, "passed": bool(worst <= MISFIT),
                 "detail": f"largest residual rms {worst:.2f} x the evaluation noise (bar {MISFIT:g}): "
                 + "; ".join(("step 1" if r.step == 1 else f"step 2 T={int(r.T)}") + f" {r.rms_z:.2f}"
                             for r in law.residuals.itertuples())})
    return pd.DataFrame(rows)
