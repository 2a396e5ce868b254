"""Metric vs forward passes per sample (denoising steps run x L_s), one line per model and sampling depth L_s.
Adaptive-depth points (sampler `confidence+adaptive(0.9)`, L_s its cap) beside them: stars on dotted
lines at the forward passes they actually spent (mean per example)."""
from __future__ import annotations

import pandas as pd

import tasks
from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.plotting import (MAX_MODELS, Drawing, Options, facet_title, facets, grid, legend, line, metric_axes,
                               model_label, model_names, palette, panel_width, seed_note, theme, tight)
from analysis.tables import split_rows

ORDER = 40
COST = 7

ADAPTIVE_MARKERS = "*XPh"  # compute: one per adaptive-depth setting (threshold, cap)


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    from matplotlib.lines import Line2D  # here: importing the figures imports no matplotlib (plotting.mpl)

    panels = []
    for v, m, dv in derived.by_variant("compute", opts.split):
        if dv["forward_passes"].nunique() < 2:
            continue
        for extra, d in facets(dv):  # a large sweep: a panel per setting, and per training depth if still large
            parts = [(extra, d)] if d["model_key"].nunique() <= MAX_MODELS else \
                [(", ".join(filter(None, [extra, f"L_t = {lt}"])), g) for lt, g in d.groupby("L_t")]
            panels += [(v, m, e, g) for e, g in parts]
    if not panels:
        raise MissingData("compute needs evaluations at two or more forward-pass budgets T x L_s")
    theme()
    most = max(g["model_key"].nunique() + g["L_s"].nunique() for *_, g in panels)
    fig, axes = grid(len(panels), w=panel_width(6.0, most), h=4.4, cols=2 if len(panels) < 6 else 3)
    markers = "osD^vP*X"
    stars = False  # whether any panel draws adaptive-depth points: the title names them only then
    for ax, (variant, metric, extra, d) in zip(axes, panels):
        names = model_names(d)
        first = d.drop_duplicates("model_key")
        models = [k for _, k in sorted(zip(zip(first["K"], first["L_t"], first["model_key"].map(names)),
                                           first["model_key"]))]
        colors = palette(models)
        ls_values = sorted(d["L_s"].unique())
        for (key, _), g in d.groupby(["model_key", "L_s"]):
            # a sampler that stops once nothing is masked runs T past the blanks in the same passes: of the
            # T that share one forward-pass count, the smallest is drawn (the cheapest way to that budget)
            g = g.sort_values("T", kind="stable").drop_duplicates("forward_passes")
            row = g.iloc[0]
            mk = markers[ls_values.index(row["L_s"]) % len(markers)]
            line(ax, g, "forward_passes", None, colors[key], marker=mk, ls="-" if row["L_s"] == row["L_t"] else "--")
        adaptive = _adaptive_rows(derived, variant, metric, d, opts.split)
        adaptive = adaptive[adaptive["model_key"].isin(colors)]
        kind = lambda smp, cap: (smp.split("+", 1)[1], int(cap))  # ('adaptive(0.9)', 3)
        kinds = sorted({kind(smp, cap) for smp, cap in zip(adaptive["sampler"], adaptive["L_s"])})
        stars = stars or bool(kinds)
        for (key, smp, cap), g in adaptive.groupby(["model_key", "sampler", "L_s"]):
            g = g.sort_values("T").drop_duplicates("forward_passes_mean")  # T past the blanks: same run
            mk = ADAPTIVE_MARKERS[kinds.index(kind(smp, cap)) % len(ADAPTIVE_MARKERS)]
            line(ax, g, "forward_passes_mean", None, colors[key], marker=mk, ls=":")
        if tasks.metric(metric).threshold is not None:
            ax.axhline(tasks.metric(metric).threshold, color="0.5", lw=1, ls=":")
        metric_axes(ax, metric, d["forward_passes"], "forward passes per sample (block passes; at most T x L_s)")
        facet_title(ax, variant, extra)
        # one entry per model (its color) and one per sampling depth (its marker), not one per line
        row_of = first.set_index("model_key", drop=False)
        handles = [Line2D([], [], color=colors[k], lw=2, label=model_label(row_of.loc[k], names)) for k in models]
        handles += [Line2D([], [], color="0.35", marker=markers[i % len(markers)], ls="none", label=f"L_s = {v}")
                    for i, v in enumerate(ls_values)]
        styles = {"-" if a == b else "--" for a, b in zip(d["L_s"], d["L_t"])}
        handles += [Line2D([], [], color="0.35", ls=ls, label=what) for ls, what in
                    (("-", "solid: L_s = L_t"), ("--", "dashed: L_s != L_t")) if ls in styles and len(styles) > 1]
        handles += [Line2D([], [], color="0.35", marker=ADAPTIVE_MARKERS[i % len(ADAPTIVE_MARKERS)], ls=":",
                           label=f"{a}, L_s <= {c}")
                    for i, (a, c) in enumerate(kinds)]
        if (thr := tasks.metric(metric).threshold) is not None:
            handles.append(Line2D([], [], color="0.5", lw=1, ls=":", label=f"threshold {thr:g}"))
        legend(ax, len(handles), handles=handles, title="model (K x L_t); sampling depth")
    star_note = "; stars: adaptive depth, at its mean passes" if stars else ""
    fig.suptitle(f"{data.name}: compute — metric vs total forward passes (solid: L_s = L_t{star_note})"
                 f"{seed_note(panels[0][3])}")
    tight(fig)
    return Drawing(fig, "compute")


def _adaptive_rows(derived: Derived, variant: str, metric: str, d: pd.DataFrame, split: str) -> pd.DataFrame:
    """The adaptive-depth rows (`<sampler>+adaptive(θ)`) of the sampler `d` shows, for one variant and metric."""
    agg = split_rows(derived.aggregated(), "compute", split)
    adaptive = agg["sampler"].str.startswith(f"{d['sampler'].iloc[0]}+adaptive(")
    return agg[adaptive & (agg["task_variant"] == variant) & (agg["metric"] == metric)]
