"""Training loss vs step, one line per model (mean over seeds, band min..max), one panel per task variant; with eval.at_checkpoints, also the primary metric on validation examples at every checkpoint, a panel per T.

The validation panels read the history's `val` column (`eval.at_checkpoints` validation examples,
L_s = L_t, the run's first sampler): a curve to watch training by, on a split that selection may use
and a handful of examples, never a test number.
"""
from __future__ import annotations

import json
import re

import pandas as pd

import tasks
from analysis.derived import Derived
from analysis.load import MissingData, StudyData, training_curves
from analysis.plotting import (Drawing, Options, band, facet_title, facets, grid, legend, model_label,
                               model_names, palette, panel_width, rate_ylim, theme, tight, wrap_label)

ORDER = 100
COST = 0


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    h = training_curves(data)
    if h is None or h.empty:
        raise MissingData("training curves need the history table (no rows in history/)")
    val = _val_rows(h)
    panels = [(v, extra, g, None) for v in sorted(h["task_variant"].unique())
              for extra, g in facets(h[h["task_variant"] == v])]
    panels += [(v, extra, g, key) for (v, key), gv in val.groupby(["task_variant", "key"], sort=True)
               for extra, g in facets(gv)]
    theme()
    fig, axes = grid(len(panels), w=panel_width(5.6, max(g["model_key"].nunique() for _, _, g, _ in panels)), h=4.0,
                     cols=3)
    for ax, (variant, extra, g, score) in zip(axes, panels):
        y = "train_loss" if score is None else "value"
        names = model_names(g)
        first = g.drop_duplicates("model_key").set_index("model_key", drop=False)
        keys = sorted(first.index, key=lambda k: (first.at[k, "K"], first.at[k, "L_t"], names[k]))
        colors = palette(keys)
        seeds = g.groupby("model_key")["run_id"].nunique()
        curves = g.groupby(["model_key", "step"])[y].agg(["mean", "min", "max"]).reset_index()
        by_model = dict(list(curves.groupby("model_key")))
        for key in keys:  # legend order: by K, L_t, then what else tells them apart
            curve = by_model[key].sort_values("step")
            n = int(seeds[key])
            ax.plot(curve["step"], curve["mean"], color=colors[key], marker=None if score is None else "o", ms=3,
                    label=model_label(first.loc[key], names) + (f" ({n} seeds)" if n > 1 else ""))
            if n > 1:
                band(ax, curve["step"].to_numpy(dtype=float), curve["min"].to_numpy(dtype=float),
                     curve["max"].to_numpy(dtype=float), colors[key])
        ax.set_xlabel("training step")
        if score is None:
            ax.set_ylabel(wrap_label("training loss (ELBO, mean over loops)"))
            facet_title(ax, variant, extra)
        else:
            metric, T = re.fullmatch(r"val_(.+)_T(\d+)", score).groups()
            ax.set_ylabel(f"{tasks.metric(metric).label}, validation")
            rate_ylim(ax, metric)
            facet_title(ax, f"{variant}: T = {T}, L_s = L_t", extra)
        legend(ax, len(keys), title="model (K x L_t)")
    fig.suptitle(f"{data.name}: training curves")
    tight(fig)
    return Drawing(fig, "training_curves", {"training_curves_val": val} if len(val) else {})


def _val_rows(h: pd.DataFrame) -> pd.DataFrame:
    """The history's checkpoint scores (its `val` column, JSON per row) as one row per run, step and score."""
    v = h[h["val"].notna()]
    rows = [{**r, "key": k, "value": x} for r, d in zip(v.drop(columns="val").to_dict("records"), v["val"])
            for k, x in json.loads(d).items() if re.fullmatch(r"val_(.+)_T(\d+)", k)]  # not val_elbo, val_ref_nll
    return pd.DataFrame(rows, columns=[*h.columns.drop("val"), "key", "value"])
