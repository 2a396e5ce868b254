"""The one-step ladder's table (predicted vs measured per model and T) and its figure."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import tasks
from analysis.ladder.law import Ladder, q95, shape_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure


# ---- the ladder's table and figure ------------------------------------------------------------------
TABLE_COLUMNS = ["role", "label", "T", "N", "scale_vs_ladder", "predicted", "low", "high", "measured", "meas_low",
                 "meas_high", "error_pts", "err_low", "err_high", "abs_error_pts", "covered", "in_band", "within_2"]
BAR_PTS = 2.0  # OLMo's bar: within 2 points of absolute accuracy ...
BAND = (0.05, 0.95)  # ... wherever the measured value is between 5% and 95%


def ladder_table(law: Ladder, targets: pd.DataFrame | None = None,
                 measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """Predicted vs measured, one row per model and T: the held-out models (role 'held out') and the targets
    (role 'target': measured_targets' rows where they were trained, else law.targets' prediction alone).
    in_band: the measured value lies where OLMo's bar applies; within_2: the error is within BAR_PTS."""
    parts = [law.heldout.assign(role="held out")]
    done = set(measured["label"]) if measured is not None and len(measured) else set()
    if done:
        parts.append(measured.assign(role="target"))
    if targets is not None and len(targets):
        rest = targets[~targets["label"].isin(done)]
        if len(rest):
            parts.append(law.targets(rest).assign(role="target"))
    t = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else \
        pd.DataFrame(columns=TABLE_COLUMNS)
    t = t.reindex(columns=TABLE_COLUMNS)  # a column no part has (e.g. measured, with targets alone) is NaN
    m = t["measured"].astype(float)
    t["in_band"] = (m > BAND[0]) & (m < BAND[1])
    t["within_2"] = t["abs_error_pts"].astype(float) <= BAR_PTS
    return t.sort_values(["role", "T", "N"], kind="stable").reset_index(drop=True)


def _short(v: float, _pos=None) -> str:
    """A tick label: 50, 200, 20k, 1.5M."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def ladder_figure(law: Ladder, targets: pd.DataFrame | None = None, measured: pd.DataFrame | None = None,
                  Ts: list[int] | None = None) -> Figure:
    """One panel per T: the ladder's models (seed means) against their effective scale under the fitted law
    (N_eff, or d_eff for the depth-width law), coloured by (K x L) shape; the law's curve with its 95%
    band at a fixed scale; held-out models and targets as their prediction (open diamond, 95% interval) and,
    where trained, their measurement (filled square, 95% interval)."""
    # matplotlib here, not above: importing the figures (analysis.figures, a one-process report) draws nothing yet
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from analysis.plotting import figure

    Ts = law._Ts(Ts)
    tab = ladder_table(law, targets, measured)
    info = law.models.set_index("model_key")
    res = law.residuals.assign(x=law.scale(info.loc[law.residuals["model_key"]]),
                               shape=[shape_of(k, lp) for k, lp in info.loc[law.residuals["model_key"], ["K", "L"]]
                                      .itertuples(index=False)])
    others = pd.concat([law.models[law.models["role"] != "ladder"],
                        targets if targets is not None else pd.DataFrame(columns=law.models.columns)])
    x_of = dict(zip(others["label"], law.scale(others))) if len(others) else {}
    xs = np.concatenate([res["x"].to_numpy(float), np.array(list(x_of.values()), float)])
    grid = np.geomspace(xs.min() / 1.3, xs.max() * 1.3, 120)
    zg = np.log(grid / law.size_ref)
    shapes = sorted(res["shape"].unique())
    colour = {s: f"C{i}" for i, s in enumerate(shapes)}
    fig = figure(figsize=(3.4 * len(Ts) + 0.6, 3.4), layout="constrained")
    axes = fig.subplots(1, len(Ts), sharey=True, squeeze=False)[0]
    for ax, T in zip(axes, Ts):
        i = law.Ts.index(T)
        curve = law.at(law.theta, i, zg)
        lo, hi = q95(law.at(law.theta_b, i, zg))
        ax.fill_between(grid, lo, hi, color="0.85", label="law, 95% band")
        ax.plot(grid, curve, color="0.2", lw=1.5, label="law")
        for s, g in res[res["T"] == T].groupby("shape"):
            ax.plot(g["x"], g["measured"], "o", ms=5, color=colour[s], label=f"ladder {s}")
        for r in tab[tab["T"] == T].itertuples():
            x = x_of[r.label]
            ax.errorbar([x], [r.predicted], yerr=[[r.predicted - r.low], [r.high - r.predicted]], fmt="D", ms=6,
                        mfc="none", color="C4", capsize=3, label=f"{r.role}: predicted")
            if np.isfinite(r.measured):
                ax.errorbar([x], [r.measured], yerr=[[r.measured - r.meas_low], [r.meas_high - r.measured]], fmt="s",
                            ms=5, color="k", capsize=3, label=f"{r.role}: measured")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(_short))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"T = {T}")
        ax.set_xlabel(f"{law.form.scale} under the fitted law")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(tasks.metric(law.metric).label)
    seen = {lb: h for h, lb in zip(*axes[0].get_legend_handles_labels())}  # one entry per label, in order
    for ax in axes[1:]:
        for h, lb in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lb, h)
    fig.legend(list(seen.values()), list(seen.keys()), loc="outside right upper", fontsize=9)
    fig.suptitle(f"{law.variant}: {law.form.name} law", fontsize=10)
    return fig
