"""Sudoku metric vs T per L, one panel per mask rate (the paper's 25x25 figure)."""
from __future__ import annotations

import pandas as pd

from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.plotting import (Drawing, Options, grid, legend, line, model_label, model_names, needs_T, palette,
                               panel_width, rate_ylim, seed_note, theme, tight, x_axis, ylabel)
from analysis.tables import SHAPE_FIELDS, select

ORDER = 60
COST = 0
READS = ("aggregated", "runs")


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    agg = derived.split_rows("mask-rate", opts.split)
    s = agg[agg["task"] == "sudoku"]
    if s.empty:
        raise MissingData(f"mask-rate needs Sudoku evaluations (the study has none on split {opts.split!r})")
    runs = data.runs[data.runs["task"] == "sudoku"][["run_id", "sudoku_n", "mask_rate", "task_variant"]]
    info = runs.drop_duplicates("task_variant").set_index("task_variant")
    s = select(s, "vpr", split=opts.split)
    s = s[s["L_s"] == s["L_t"]].join(info[["sudoku_n", "mask_rate"]], on="task_variant")
    sizes = {n: sorted(g["mask_rate"].dropna().unique()) for n, g in s.groupby("sudoku_n")}
    sizes = {n: r for n, r in sizes.items() if len(r) >= 2}
    if not sizes:
        # by variant name: a [low, high] mask range (mask_rate None) is named, never a panel of its own
        have = "; ".join(sorted(s["task_variant"].unique())) or "no VPR at L_s = L_t"
        raise MissingData(f"mask-rate needs Sudoku runs of one grid size at two or more mask rates (have {have})")
    panels = [(n, r, s[(s["sudoku_n"] == n) & (s["mask_rate"] == r)]) for n, rates in sizes.items() for r in rates]
    needs_T(pd.concat([g for *_, g in panels]), "mask-rate")
    theme()
    fig, axes = grid(len(panels), w=panel_width(4.6, 1), cols=3)
    labels = {}
    for n, rate, g in panels:  # one label per model; the mask rate is the panel's title
        names = model_names(g, (*SHAPE_FIELDS, "task.mask_rate"))
        labels.update({k: model_label(gl.iloc[0], names) for k, gl in g.groupby("model_key")})
    colors = palette(sorted(set(labels.values())))
    for ax, (n, rate, g) in zip(axes, panels):
        for key, gl in sorted(g.groupby("model_key"), key=lambda kg: labels[kg[0]]):
            line(ax, gl, "T", labels[key], colors[labels[key]])
        x_axis(ax, g["T"], "denoising steps T")
        rate_ylim(ax, "vpr")
        ax.set_ylabel(ylabel("vpr"))
        ax.set_title(f"sudoku {int(n)}x{int(n)}, {round(100 * rate)}% of cells masked")
        legend(ax, g["model_key"].nunique(), title="model (K x L), L_s = L_t")
    fig.suptitle(f"{data.name}: mask rate — VPR vs T per depth L{seed_note(panels[0][2])}")
    tight(fig)
    return Drawing(fig, "mask_rate")
