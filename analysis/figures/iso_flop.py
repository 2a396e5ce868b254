"""Each (K x L) against its (KL x 1) partner (equal K*L, so equal FLOPs per step), metric vs T,
with the parameter counts in a table beside the panels."""
from __future__ import annotations

import math

import pandas as pd

from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.plotting import Drawing, Options, figure, legend, line, metric_axes, needs_T, seed_note, theme, tight
from analysis.tables import fmt_params, shape_label

ORDER = 20
COST = 5


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    import seaborn as sns

    pairs = derived.pairs()
    if pairs.empty:
        have = sorted({shape_label(k, l) for k, l in zip(data.runs["K"], data.runs["L_t"])})
        raise MissingData("iso-flop needs a recursive (K x L) model, L > 1, and a single-pass (KL x 1) model of "
                          f"the same task variant and width (models present: {', '.join(have)})")
    variants = {v: (m, d) for v, m, d in derived.by_variant("iso-flop", opts.split)}
    panels = []
    for p in pairs.itertuples(index=False):
        if p.task_variant not in variants:
            continue
        metric, d = variants[p.task_variant]
        rec = d[(d["model_key"] == p.key_recursive) & (d["L_s"] == p.L)]
        single = d[(d["model_key"] == p.key_single) & (d["L_s"] == 1)]
        if len(rec) and len(single):
            panels.append((p, metric, rec, single))
    if not panels:
        raise MissingData("iso-flop pairs exist but lack evaluations at L_s = L_t for both partners")
    needs_T(pd.concat([pd.concat([r, s]) for _, _, r, s in panels]), "iso-flop")
    theme()
    n = len(panels)
    cols = min(n, 4)  # panels wrap into rows of four; the parameter table spans the rows on the right
    rows = math.ceil(n / cols)
    fig = figure(figsize=(4.6 * cols + 5.2, 5.2 * rows + 0.4 * max(0, n - 8) / cols))
    gs = fig.add_gridspec(rows, cols + 1, width_ratios=[1] * cols + [1.15])
    c_rec, c_single = sns.color_palette("deep")[0], sns.color_palette("deep")[3]
    for i, (p, metric, rec, single) in enumerate(panels):
        ax = fig.add_subplot(gs[i // cols, i % cols])
        line(ax, rec, "T", f"{shape_label(p.K, p.L, p.differs)} recursive, "
             f"{fmt_params(p.params_recursive)} params", c_rec)
        line(ax, single, "T", f"{shape_label(p.KL, 1)} single pass, {fmt_params(p.params_single)} params", c_single,
             marker="s", ls="--")
        metric_axes(ax, metric, pd.concat([rec["T"], single["T"]]))
        ax.set_title(f"{i + 1}. {p.task_variant}: K*L = {p.KL}", fontsize=10)
        legend(ax, 2, below=True)
    tab = fig.add_subplot(gs[:, cols])
    tab.axis("off")
    cells = [[str(i + 1), shape_label(p.K, p.L), fmt_params(p.params_recursive), shape_label(p.KL, 1),
              fmt_params(p.params_single), f"{p.param_ratio:.2f}x"] for i, (p, *_) in enumerate(panels)]
    t = tab.table(cellText=cells, colLabels=["panel", "(K x L)", "params", "(KL x 1)", "params", "ratio"],
                  loc="center", cellLoc="center")
    t.auto_set_font_size(False)
    t.set_fontsize(9)
    t.scale(1, 1.4)
    tab.set_title("parameters (same FLOPs per step)", fontsize=10)
    fig.suptitle(f"{data.name}: iso-FLOP — (K x L) vs (KL x 1) at equal compute{seed_note(panels[0][2])}")
    tight(fig)
    return Drawing(fig, "iso_flop", {"iso_flop_params": pairs.drop(columns=["key_recursive", "key_single"])})
