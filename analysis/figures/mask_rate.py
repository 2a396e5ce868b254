"""Metric vs T per L, one panel per grid size and mask rate (the paper's 25x25 figure), for the tasks that
declare this figure and the run columns it sweeps (Task.figure_columns: Sudoku's sudoku_n and mask_rate)."""
from __future__ import annotations

import pandas as pd

import tasks
from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.plotting import (Drawing, Options, grid, legend, line, metric_axes, model_label, model_names, needs_T,
                               palette, panel_width, seed_note, theme, tight)
from analysis.tables import SHAPE_FIELDS, select, split_rows

ORDER = 60
COST = 0


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    swept = {t: cls for t, (_, cls) in tasks.TASKS.items() if "mask-rate" in cls.figure_columns}
    who = " or ".join(t.capitalize() for t in swept) or "a task declaring mask-rate"
    agg = split_rows(derived.aggregated(), "mask-rate", opts.split)
    panels, have = [], []
    for task, cls in swept.items():
        size, rate = cls.figure_columns["mask-rate"]
        metric = cls.primary_metric
        s = select(agg[agg["task"] == task], metric, split=opts.split)
        info = data.runs[data.runs["task"] == task].drop_duplicates("task_variant").set_index("task_variant")
        s = s[s["L_s"] == s["L_t"]].join(info[[size, rate]], on="task_variant")
        have += sorted(s["task_variant"].unique())
        for n, g in s.groupby(size):
            rates = sorted(g[rate].dropna().unique())
            if len(rates) >= 2:  # a [low, high] mask range (rate None) is named by its variant, never a panel
                panels += [(task, metric, n, r, g[g[rate] == r]) for r in rates]
    if agg["task"].isin(list(swept)).sum() == 0:
        raise MissingData(f"mask-rate needs {who} evaluations (the study has none on split {opts.split!r})")
    if not panels:
        raise MissingData(f"mask-rate needs {who} runs of one grid size at two or more mask rates "
                          f"(have {'; '.join(have) or 'no primary metric at L_s = L_t'})")
    needs_T(pd.concat([g for *_, g in panels]), "mask-rate")
    theme()
    fig, axes = grid(len(panels), w=panel_width(4.6, 1), cols=3)
    labels = {}
    for task, _, n, rate, g in panels:  # one label per model; the mask rate is the panel's title
        names = model_names(g, (*SHAPE_FIELDS, *(f"task.{c}" for c in tasks.TASKS[task][1].aliases)))
        labels.update({k: model_label(gl.iloc[0], names) for k, gl in g.groupby("model_key")})
    colors = palette(sorted(set(labels.values())))
    for ax, (task, metric, n, rate, g) in zip(axes, panels):
        for key, gl in sorted(g.groupby("model_key"), key=lambda kg: labels[kg[0]]):
            line(ax, gl, "T", labels[key], colors[labels[key]])
        metric_axes(ax, metric, g["T"])
        ax.set_title(f"{task} {int(n)}x{int(n)}, {round(100 * rate)}% of cells masked")
        legend(ax, g["model_key"].nunique(), title="model (K x L), L_s = L_t")
    metrics = "/".join(dict.fromkeys(p[1].upper() for p in panels))
    fig.suptitle(f"{data.name}: mask rate — {metrics} vs T per depth L{seed_note(panels[0][4])}")
    tight(fig)
    return Drawing(fig, __name__.rsplit(".", 1)[1])  # mask_rate.png, after this module
