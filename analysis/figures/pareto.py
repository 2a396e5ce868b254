"""Parameters vs the smallest T (or T * L_s) that reaches the threshold; recursive and single-pass
models as two series; the non-dominated front (fewest parameters and fewest steps) drawn."""
from __future__ import annotations

import tasks
from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.plotting import Drawing, Options, apart, grid, legend, panel_width, theme, tight, wrap_label
from analysis.tables import fmt_params

ORDER = 30
COST = 1


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    import seaborn as sns

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
    deep = sns.color_palette("deep")
    fig, axes = grid(len(variants), w=panel_width(5.2, 1), h=4.2, cols=3)
    labels = []
    for ax, variant in zip(axes, variants):
        t = table[table["task_variant"] == variant]
        r = t[t["reached"]]
        # the single-pass square drawn larger and under the recursive circle: a (1 x 2) at a (1 x 1)'s point shows
        for name, sel, marker, size, color, z in (("single pass (L = 1)", r["L_t"] == 1, "s", 130, deep[3], 3),
                                                  ("recursive (L > 1)", r["L_t"] > 1, "o", 50, deep[0], 4)):
            s = r[sel]
            if len(s):
                ax.scatter(s["n_params"], s["crossing"], marker=marker, s=size, color=color, label=name, zorder=z)
            labels += [ax.annotate(row.model, (row.n_params, row.crossing), textcoords="offset points",
                                   xytext=(7, 4), fontsize=8) for row in s.itertuples()]
        ax.set_xscale("log")
        ax.set_xlabel("parameters (log scale)")
        ax.set_ylabel(wrap_label(ylabel))
        ys = sorted({int(v) for v in r["crossing"]})
        if len(ys) > 1 and ys[-1] / ys[0] >= 4:
            ax.set_yscale("log", base=2)
        if len(ys) == 1:  # one value is no scale: a tick at half and at twice it beside
            ys = [max(ys[0] // 2, 0), ys[0], 2 * ys[0]]
        ax.set_yticks(ys, [str(v) for v in ys])
        xs = sorted({int(v) for v in r["n_params"]})
        ax.set_xticks(xs, [fmt_params(v) for v in xs])
        ax.minorticks_off()
        # the front's staircase, up from its first point and on past its last to the edges (one point is a corner)
        front = r[r["pareto"]].sort_values("n_params")
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        ax.step([front["n_params"].iloc[0], *front["n_params"], x1], [y1, *front["crossing"], front["crossing"].iloc[-1]],
                where="post", color="0.3", ls=(0, (2, 1.5)), lw=1.5, label="non-dominated front", zorder=2)
        ax.set_xlim(x0, x1), ax.set_ylim(y0, y1)
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
    needed = "steps" if opts.pareto_x == "T" else "forward passes"
    fig.suptitle(f"{data.name}: Pareto — parameters vs {needed} needed to reach the threshold{note}")
    tight(fig)
    apart(fig, labels)
    return Drawing(fig, "pareto", {"threshold_crossings": table.drop(columns="model_key")})
