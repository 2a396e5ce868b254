"""Parameters vs the smallest T (or T * L_s) that reaches the threshold; recursive and single-pass
models as two series; the non-dominated front (fewest parameters and fewest steps) drawn."""
from __future__ import annotations

import tasks
from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.plotting import Drawing, Options, grid, legend, panel_width, theme, tight, wrap_label
from analysis.tables import fmt_params

ORDER = 30
COST = 1
READS = ("aggregated",)


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    from analysis import theme as sns  # seaborn's palettes and rules without importing it (analysis/theme.py)

    table = derived.crossings(opts.threshold, opts.pareto_x, opts.split)
    reached = table[table["reached"]]
    if reached.empty:
        best = "; ".join(f"{r.model} {r.task_variant}: best {r.best:.3f}" for r in table.itertuples())
        raise MissingData(f"no model reaches the threshold ({table['metric'].iloc[0]} >= "
                          f"{table['threshold'].iloc[0]}), so there is no crossing to plot ({best})")
    ylabel = "smallest T reaching the threshold (L_s = L_t)" if opts.pareto_x == "T" else \
        "fewest forward passes (steps run x L_s) reaching the threshold"
    variants = list(dict.fromkeys(reached["task_variant"]))
    theme()
    fig, axes = grid(len(variants), w=panel_width(5.2, 1), h=4.2, cols=3)
    for ax, variant in zip(axes, variants):
        t = table[table["task_variant"] == variant]
        r = t[t["reached"]]
        for name, sel, marker, color in (("recursive (L > 1)", r["L_t"] > 1, "o", sns.color_palette("deep")[0]),
                                         ("single pass (L = 1)", r["L_t"] == 1, "s", sns.color_palette("deep")[3])):
            s = r[sel]
            if len(s):
                ax.scatter(s["n_params"], s["crossing"], marker=marker, s=60, color=color, label=name, zorder=3)
            for row in s.itertuples():
                ax.annotate(row.model, (row.n_params, row.crossing), textcoords="offset points",
                            xytext=(5, 4), fontsize=8)
        front = r[r["pareto"]].sort_values("n_params")
        ax.step(front["n_params"], front["crossing"], where="post", color="0.3", ls=":", lw=1.5,
                label="non-dominated front", zorder=2)
        ax.set_xscale("log")
        ax.set_xlabel("parameters (log scale)")
        ax.set_ylabel(wrap_label(ylabel))
        ys = sorted({int(v) for v in r["crossing"]})
        if len(ys) > 1 and ys[-1] / ys[0] >= 4:
            ax.set_yscale("log", base=2)
        ax.set_yticks(ys, [str(v) for v in ys])
        xs = sorted({int(v) for v in r["n_params"]})
        ax.set_xticks(xs, [fmt_params(v) for v in xs])
        ax.minorticks_off()
        thr, metric = t["threshold"].iloc[0], t["metric"].iloc[0]
        never = t[~t["reached"]]
        title = f"{variant}: {metric.upper()} >= {thr:g}"
        if 0 < len(never) <= 4:
            title += "\nnever reached: " + ", ".join(f"{x.model} (best {x.best:.2f})"
                                                     for x in never.itertuples())
        elif len(never):  # a large sweep: the count and the closest; every model is in threshold_crossings.csv
            top = never.sort_values("best", ascending=tasks.lower_is_better(metric)).iloc[0]
            title += f"\nnever reached by {len(never)} models (closest: {top.model}, best {top.best:.2f})"
        ax.set_title(title, fontsize=10)
        legend(ax, 3)
    unreached = [v for v in dict.fromkeys(table["task_variant"]) if v not in variants]
    note = f"\nnot shown (no model reaches the threshold): {', '.join(unreached)}" if unreached else ""
    fig.suptitle(f"{data.name}: Pareto — parameters vs steps needed to reach the threshold{note}")
    tight(fig)
    return Drawing(fig, "pareto", {"threshold_crossings": table.drop(columns="model_key")})
