"""The text8 NLL / BPC / perplexity table, with a bar chart of NLL (training curves: `training-curves`)."""
from __future__ import annotations

from analysis.derived import Derived
from analysis.load import StudyData
from analysis.plotting import Drawing, Options, subplots, theme, tight, wrap_label
from analysis.tables import text8_table

ORDER = 90
COST = 2


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    import seaborn as sns

    agg = derived.aggregated()
    table = text8_table(agg, split=opts.split)
    # the tasks of the table's rows by their own names (any task evaluated by its likelihood, not only text8)
    named = " / ".join(sorted(agg.loc[agg["task_variant"].isin(table["task_variant"]), "task"].unique()))
    theme()
    labels = [f"{m}, L_s = {ls}" for m, ls in zip(table["model"], table["L_s"])]
    fig, ax = subplots(figsize=(max(5.0, 1.1 * len(table) + 2), 4))
    colors = [sns.color_palette("deep")[3] if lt == 1 else sns.color_palette("deep")[0] for lt in table["L_t"]]
    bars = ax.bar(labels, table["nll"], color=colors)
    for b, nll, bpc, ppl in zip(bars, table["nll"], table["bpc"], table["ppl"]):
        ax.annotate(f"{nll:.3f} nats\n{bpc:.3f} bpc\nppl {ppl:.1f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8, textcoords="offset points", xytext=(0, 2))
    ax.set_ylabel(wrap_label("NLL bound (nats / char), lower is better"))
    ax.set_xlabel("model (K x L_t) and sampling depth L_s; red: single pass")
    ax.set_ylim(0, table["nll"].max() * 1.3)
    ax.set_title(f"{data.name}: {named} likelihood")
    tight(fig)
    return Drawing(fig, "text8_nll", {"text8_table": table})
