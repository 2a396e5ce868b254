"""Training loss vs step, one line per model (mean over seeds, band min..max), one panel per task variant."""
from __future__ import annotations

from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.plotting import (Drawing, Options, band, facet_title, facets, grid, legend, model_label,
                               model_names, palette, panel_width, theme, tight)

ORDER = 100
COST = 0


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    h = data.history
    if h is None or h.empty:
        raise MissingData("training curves need the history table (no rows in history/)")
    panels = [(v, extra, g) for v in sorted(h["task_variant"].unique())
              for extra, g in facets(h[h["task_variant"] == v])]
    theme()
    fig, axes = grid(len(panels), w=panel_width(5.6, max(g["model_key"].nunique() for *_, g in panels)), h=4.0,
                     cols=3)
    for ax, (variant, extra, g) in zip(axes, panels):
        names = model_names(g)
        first = g.drop_duplicates("model_key").set_index("model_key", drop=False)
        keys = sorted(first.index, key=lambda k: (first.at[k, "K"], first.at[k, "L_t"], names[k]))
        colors = palette(keys)
        seeds = g.groupby("model_key")["run_id"].nunique()
        curves = g.groupby(["model_key", "step"])["train_loss"].agg(["mean", "min", "max"]).reset_index()
        by_model = dict(list(curves.groupby("model_key")))
        for key in keys:  # legend order: by K, L_t, then what else tells them apart
            curve = by_model[key].sort_values("step")
            n = int(seeds[key])
            ax.plot(curve["step"], curve["mean"], color=colors[key],
                    label=model_label(first.loc[key], names) + (f" ({n} seeds)" if n > 1 else ""))
            if n > 1:
                band(ax, curve["step"].to_numpy(dtype=float), curve["min"].to_numpy(dtype=float),
                     curve["max"].to_numpy(dtype=float), colors[key])
        ax.set_xlabel("training step")
        ax.set_ylabel("training loss (ELBO, mean over loops)")
        facet_title(ax, variant, extra)
        legend(ax, len(keys), title="model (K x L_t)", fontsize=8, loc="upper right")
    fig.suptitle(f"{data.name}: training curves")
    tight(fig)
    return Drawing(fig, "training_curves")
