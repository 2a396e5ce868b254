"""What a loop is worth: each looped (K x L) placed on its family's single-pass metric-vs-parameters
curve (monotone fit at each T) as m x its parameters, and m = L^beta across L.

Left: the single-pass models (squares) and their monotone fit per T; each looped model drawn at the
parameters it performs like, with its bootstrap interval (seeds and examples); a model beyond the
single-pass range as a triangle at the range's edge (not extrapolated); each looped model is named
once, beside its point at its largest T. Right: m against L on log
axes with the fitted L^beta and its interval. Tables effective_params.csv and effective_beta.csv
beside it."""
from __future__ import annotations

import numpy as np
import pandas as pd

import tasks
from analysis.effective import ABOVE, IN_RANGE, effective_tables
from analysis.derived import Derived
from analysis.load import StudyData
from analysis.plotting import LEGEND_WIDTH, Drawing, Options, legend, rate_ylim, subplots, theme, tight, wrap_label

ORDER = 110
COST = 4


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    import seaborn as sns

    eff = derived.effective(opts.split)
    table, beta = effective_tables(eff)
    panels = list(eff.table.groupby(["task_variant", "family"], sort=True))
    theme()
    fig, axes = subplots(len(panels), 2, figsize=(12.5 + 2 * LEGEND_WIDTH, 4.6 * len(panels) + 0.6), squeeze=False)
    for (ax, bx), ((variant, fam), t) in zip(axes, panels):
        c = eff.curves[(eff.curves["task_variant"] == variant) & (eff.curves["family"] == fam)]
        Ts = sorted(t["T"].unique())
        colors = dict(zip(Ts, sns.color_palette("viridis", max(len(Ts), 1))))
        _curves(ax, variant, fam, t, c, colors)
        b = beta[(beta["task_variant"] == variant) & (beta["family"] == fam) & (beta["T"] == "all")].iloc[0]
        _multipliers(bx, t, b, colors)
    fig.suptitle(f"{data.name}: effective parameters of recursion")
    tight(fig)
    return Drawing(fig, "effective_params", {"effective_params": table, "effective_beta": beta})


def _curves(ax, variant: str, fam: str, t: pd.DataFrame, c: pd.DataFrame, colors: dict) -> None:
    """Left panel: the single-pass curve per T, each looped model at the parameters it performs like."""
    markers = dict(zip(sorted(t["L"].unique()), "oD^vP*X"))
    metric = t["metric"].iloc[0]
    last_T = t.groupby("model")["T"].max()
    for T in colors:
        ct = c[c["T"] == T].sort_values("n_params")
        ax.plot(ct["n_params"], ct["fit"], color=colors[T], lw=1.5, label=f"T = {T}: single pass, monotone fit")
        ax.scatter(ct["n_params"], ct["value"], marker="s", color=colors[T], s=36, zorder=3)
        tt = t[t["T"] == T]
        # one artist per (T, L) and per side out of range, not one per model (a large sweep has hundreds)
        for L, r in tt[tt["where"] == IN_RANGE].groupby("L"):
            lo = np.where(np.isfinite(r["m_low"]), r["m_low"] * r["n_params"], r["equiv_params"])
            hi = np.where(np.isfinite(r["m_high"]), r["m_high"] * r["n_params"], ct["n_params"].max())
            ax.errorbar(r["equiv_params"], r["value"], xerr=np.clip([r["equiv_params"] - lo, hi - r["equiv_params"]], 0, None),
                        fmt=markers[L], color=colors[T], mec="k", ms=7, capsize=3, zorder=4)
        edge = lambda where: ct["n_params"].max() if where == ABOVE else ct["n_params"].min()  # out of range
        for where, r in tt[tt["where"] != IN_RANGE].groupby("where"):
            ax.scatter([edge(where)] * len(r), r["value"], marker=">" if where == ABOVE else "<",
                       color=colors[T], edgecolor="k", s=70, zorder=4)
        # each model named once, at its largest T (named at every T, a large sweep's panel is a
        # block of overlapping labels)
        for r in tt[tt["T"] == last_T[tt["model"]].to_numpy()].itertuples():
            ax.annotate(r.model, (r.equiv_params if r.where == IN_RANGE else edge(r.where), r.value),
                        textcoords="offset points", xytext=(5, -10), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel(wrap_label("parameters (single-pass models; looped models at the parameters they perform like)"))
    ax.set_ylabel(tasks.metric(metric).label)
    rate_ylim(ax, metric)
    ax.set_title(f"{variant}{' ' + fam if fam else ''}: metric vs parameters, L_s = L_t", fontsize=10)
    legend(ax, len(colors))


def _multipliers(bx, t: pd.DataFrame, b: pd.Series, colors: dict) -> None:
    """Right panel: m against L on log axes, with the fitted m = L^beta (`b`) and its interval."""
    Ts, Ls = list(colors), sorted(t["L"].unique())
    ok = t[t["where"] == IN_RANGE]
    for i, T in enumerate(Ts):
        g = ok[ok["T"] == T]
        if len(g):
            lo = (g["m"] - g["m_low"]).clip(lower=0)
            hi = (g["m_high"] - g["m"]).replace(np.inf, np.nan).fillna(0).clip(lower=0)
            dodge = 1 + 0.03 * (i - (len(Ts) - 1) / 2)  # the T of one L side by side
            bx.errorbar(g["L"] * dodge, g["m"], yerr=[lo, hi], fmt="o", color=colors[T], capsize=3,
                        label=f"T = {T}")
    if np.isfinite(b["beta"]):
        xs = np.linspace(1, max(Ls) * 1.1, 50)
        bx.plot(xs, xs ** b["beta"], color="0.2", lw=1.5,
                label=f"m = L^beta, beta = {b['beta']:.2f} [{b['beta_low']:.2f}, {b['beta_high']:.2f}]")
        if np.isfinite(b["beta_low"]) and np.isfinite(b["beta_high"]):
            bx.fill_between(xs, xs ** b["beta_low"], xs ** b["beta_high"], color="0.5", alpha=0.2, lw=0)
    bx.plot([1, max(Ls) * 1.1], [1, max(Ls) * 1.1], color="0.6", ls=":", lw=1, label="m = L (a loop = a layer)")
    bx.set_xscale("log")
    bx.set_yscale("log")
    bx.set_xticks(Ls, [str(v) for v in Ls])
    bx.minorticks_off()
    y0, y1 = bx.get_ylim()
    ticks = [v for v in (0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 10, 15, 20, 30, 50, 100) if y0 <= v <= y1]
    bx.set_yticks(ticks, [f"{v:g}" for v in ticks])
    bx.set_xlabel("loops L (sampled at L_s = L)")
    bx.set_ylabel(wrap_label("parameter multiplier m (95% bootstrap interval)"))
    out = int(b["out_of_range"])
    bx.set_title("what a loop is worth" + (f" ({out} point{'s' if out > 1 else ''} beyond the single-pass range left out)"
                                           if out else ""), fontsize=10)
    legend(bx, 3)
