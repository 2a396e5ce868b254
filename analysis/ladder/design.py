"""Checks of a ladder's design before anything trains, from a two-step law fitted on an earlier ladder
(the prior): the rungs (N, K, L, D of each planned run) and their checkpoints against the target.

- step 2 interpolates only when the target's predicted loss lies inside the range of losses the rungs
  and their checkpoints are predicted to cover (`loss_inside`); otherwise the chained prediction
  extrapolates the loss-to-metric curve, which the ladder cannot check;
- a rung at a metric floor (below FLOOR) or ceiling (above CEILING) tells the curve little: a warning
  when more than half the rungs sit there at a T.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.ladder.twostep import TwoStep

FLOOR, CEILING = 0.05, 0.95


def checkpoint_points(rungs: pd.DataFrame, every: int, batch: int) -> pd.DataFrame:
    """The rungs (columns label, N, K, L, steps) and every checkpoint (each `every` steps) as points with D."""
    rows = []
    for r in rungs.to_dict("records"):
        for step in range(every, int(r["steps"]) + 1, every):
            rows.append({**r, "step": step, "D": step * batch, "is_checkpoint": step != int(r["steps"])})
    return pd.DataFrame(rows)


def check_design(law: TwoStep, points: pd.DataFrame, targets: pd.DataFrame, Ts: list[int] | None = None) -> dict:
    """`points`: the rungs and their checkpoints (checkpoint_points); `targets`: label, N, K, L, D. Returns the
    covered loss range, each target's predicted loss and whether it lies inside, the share of rungs at a
    floor or ceiling per T, and warnings (empty when the design passes)."""
    loss, _ = law.predict_loss(points)
    lo, hi = float(np.min(loss)), float(np.max(loss))
    tl, _ = law.predict_loss(targets)
    warnings = []
    inside = [(lb, float(v), bool(lo <= v <= hi)) for lb, v in zip(targets["label"], tl)]
    for lb, v, ok in inside:
        if not ok:
            warnings.append(f"target {lb}: predicted loss {v:.4g} lies outside the rungs' and checkpoints' range "
                            f"[{lo:.4g}, {hi:.4g}]: step 2 would extrapolate")
    finals = points[~points["is_checkpoint"]]
    pred = law.predict(finals.reset_index(drop=True), Ts)
    stuck = {}
    for T, g in pred.groupby("T"):
        share = float(((g["predicted"] < FLOOR) | (g["predicted"] > CEILING)).mean())
        stuck[int(T)] = share
        if share > 0.5:
            warnings.append(f"T = {T}: {100 * share:.0f}% of the rungs are predicted at a metric floor (< "
                            f"{100 * FLOOR:g}%) or ceiling (> {100 * CEILING:g}%): place rungs in the rise")
    return {"loss_range": (lo, hi), "targets": inside, "at_floor_or_ceiling": stuck, "warnings": warnings}
