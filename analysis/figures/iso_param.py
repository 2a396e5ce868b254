"""Metric vs T, one line per L (sampled at its training depth), one panel per (task variant, K)."""
from __future__ import annotations

import pandas as pd

from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.plotting import (Drawing, Options, facet_title, facets, grid, legend, line, metric_axes, model_label,
                               model_names, needs_T, palette, panel_width, seed_note, theme, tight)

ORDER = 10
COST = 3


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    panels, have = [], []
    for variant, metric, d in derived.by_variant("iso-param", opts.split):
        d = d[d["L_s"] == d["L_t"]]
        for (K, width), gk in d.groupby(["K", "d_model"]):
            have.append(f"{variant} K={K}: L={sorted(int(x) for x in gk['L_t'].unique())}")
            for extra, g in facets(gk):
                if g["L_t"].nunique() >= 2:
                    panels.append((variant, metric, K, width, extra, g))
    if not panels:
        raise MissingData("iso-param needs at least two training depths L at the same K, evaluated at L_s = L_t "
                          f"(have {'; '.join(have) or 'no evaluation at L_s = L_t'})")
    needs_T(pd.concat([p[-1] for p in panels]), "iso-param")
    theme()
    fig, axes = grid(len(panels), w=panel_width(4.6, max(p[-1]["model_key"].nunique() for p in panels)))
    multi_width = len({p[3] for p in panels}) > 1
    for ax, (variant, metric, K, width, extra, g) in zip(axes, panels):
        names = model_names(g)
        lines = sorted(g.groupby("model_key"), key=lambda kg: (kg[1]["L_t"].iloc[0], names[kg[0]]))
        colors = palette([k for k, _ in lines])
        for key, gl in lines:
            row = gl.iloc[0]
            line(ax, gl, "T", f"{model_label(row, names)}  L_t = L_s = {row['L_t']}", colors[key])
        metric_axes(ax, metric, g["T"])
        facet_title(ax, f"{variant}, K = {K}" + (f", d = {width}" if multi_width else ""), extra)
        legend(ax, len(lines), title="model (K x L)")
    fig.suptitle(f"{data.name}: iso-parameter — K layers looped L times vs L = 1{seed_note(panels[0][-1])}")
    tight(fig)
    return Drawing(fig, "iso_param")
