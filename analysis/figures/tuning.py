"""Optimization history and parameter importances of results/<study>/optuna.* (written by `study tune`).

One row of panels per search the Optuna storage holds (analysis.tuning reads it): each trial's value
with the best so far, and the parameters' importances.
"""
from __future__ import annotations

from analysis.derived import Derived
from analysis.load import StudyData
from analysis.plotting import LEGEND_WIDTH, Drawing, Options, legend, subplots
from analysis.tuning import IMPORTANCE_METHOD, load_searches

ORDER = 120
COST = 0


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    import seaborn as sns

    searches = load_searches(data.dir)
    sns.set_theme(style="whitegrid")
    fig, axes = subplots(len(searches), 2, figsize=(11 + LEGEND_WIDTH, 3.8 * len(searches)), squeeze=False)
    tables = {}
    for (name, df, imp, direction), (ax_h, ax_i) in zip(searches, axes):
        ax_h.scatter(df["number"], df["value"], s=18, color=sns.color_palette("deep")[0], label="trial value")
        ax_h.step(df["number"], df["best_so_far"], where="post", color=sns.color_palette("deep")[3],
                  label=f"best so far ({direction})")
        ax_h.set_xlabel("trial number")
        ax_h.set_ylabel("objective value")
        ax_h.set_title(f"{name}: optimization history ({len(df)} completed trials)", fontsize=10)
        legend(ax_h, 2)
        if imp:
            names = list(imp)[::-1]
            ax_i.barh(names, [imp[n] for n in names], color=sns.color_palette("deep")[2])
            ax_i.set_xlabel(f"importance ({IMPORTANCE_METHOD}: how far each parameter's top-trial values stand "
                            "out; normalised to sum 1)")
            ax_i.set_xlim(0, 1)
            ax_i.set_title(f"{name}: parameter importances", fontsize=10)
        else:
            ax_i.axis("off")
            ax_i.set_title(f"{name}: importances need >= 2 trials and a varied parameter", fontsize=10)
        tables[f"tuning_trials_{_safe(name)}"] = df
    fig.suptitle(f"{data.name}: hyperparameter search (Optuna)")
    fig.tight_layout()
    return Drawing(fig, "tuning", tables)


def _safe(name: str) -> str:
    """A search's name as a file name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "search"
