"""The two-step law's figure: step 1 (the loss against N_eff = N L^phi, the law's curve at each training
length of the ladder's final points) and step 2 (VPR against the loss per T, the fitted curves)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.ladder.metric import curve
from analysis.ladder.twostep import TwoStep
from analysis.plotting import LEGEND_FONT, figure


def two_step_figure(law: TwoStep, frame: pd.DataFrame, held: pd.DataFrame | None = None) -> Figure:
    """Two panels from the ladder's frame (and the held-out final points, marked)."""
    fig = figure(figsize=(12.0, 6.2), layout="constrained")
    a1, a2 = fig.subplots(1, 2)
    phi = law.loss_fit.params()["phi"]
    held = held if held is not None else frame.iloc[:0]
    for part, style in ((frame[frame["is_checkpoint"]], dict(marker=".", alpha=0.4, label="checkpoints")),
                        (frame[~frame["is_checkpoint"]], dict(marker="o", label="runs")),
                        (held, dict(marker="*", s=90, color="black", label="held out"))):
        if len(part):
            a1.scatter(part["N"] * part["L"] ** phi, part[law.loss_col], **style)
    allp = pd.concat([frame, held], ignore_index=True)
    grid = np.geomspace(allp["N"].min(), (allp["N"] * allp["L"] ** phi).max(), 100)
    for D in sorted(set(frame.loc[~frame["is_checkpoint"], "D"])):
        a1.plot(grid, law.loss_fit.predict(grid, np.ones_like(grid), np.full_like(grid, D)), lw=1,
                label=f"law, D = {D:.3g}")
    a1.set(xscale="log", xlabel="N_eff = N L^phi (non-embedding)", ylabel=law.loss_col, title="step 1: the loss law")
    _below(a1)
    ls = np.linspace(allp[law.loss_col].min(), allp[law.loss_col].max(), 100)
    for i, T in enumerate(law.Ts):
        color = f"C{i}"
        a2.scatter(frame[law.loss_col], frame[f"vpr_T{T}"], s=8, alpha=0.4, color=color)
        if len(held):
            a2.scatter(held[law.loss_col], held[f"vpr_T{T}"], marker="*", s=90, color=color, edgecolor="black")
        for name, theta in law.metric[T].curves.items():
            if law.metric[T].per_shape and name == "*":
                continue  # fitted per shape: the pooled curve is not the law
            a2.plot(ls, curve(np.asarray(theta), ls), color=color, lw=1,
                    label=f"T = {T}" + ("" if name == "*" else f" {name}"))
    a2.set(xlabel=law.loss_col, ylabel="VPR", title="step 2: loss to VPR per T")
    _below(a2)
    return fig


def _below(ax) -> None:
    """The panel's legend under its x label (never over the data), in up to three columns."""
    n = len(ax.get_legend_handles_labels()[1])
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), borderaxespad=0.0, fontsize=LEGEND_FONT,
              ncol=min(3, max(1, n // 4)))
