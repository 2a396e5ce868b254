"""Heatmap of the metric over training depth L_t x sampling depth L_s at one T."""
from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

import tasks
from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.plotting import Drawing, Options, grid, theme, tight
from analysis.tables import SHAPE_FIELDS, differing, family_key, heatmap_matrix

ORDER = 50
COST = 6


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    from matplotlib.patches import Rectangle  # here: importing the figures imports no matplotlib (plotting.mpl)

    families = []
    for variant, metric, d in derived.by_variant("cross-depth", opts.split):
        d = d.assign(_family=d["model_key"].map(family_key))
        for _, g in d.groupby("_family"):
            if g.groupby("L_t")["L_s"].nunique().max() >= 2:
                row = g.iloc[0]
                families.append((variant, metric, (row["K"], row["schedule"], row["loss"], row["d_model"],
                                                   row["model_key"]), g))
    if not families:
        raise MissingData("cross-depth needs a model evaluated at two or more sampling depths L_s "
                          "(every model here is sampled at one depth only)")
    T = opts.T if opts.T is not None else _default_T(families)
    mats = []
    for variant, metric, key, g in families:
        if (g["T"] == T).any():
            mats.append((variant, metric, key, heatmap_matrix(g, T, metric, split=opts.split)))
    if not mats:
        have = sorted({int(t) for *_, g in families for t in g["T"].unique()})
        raise MissingData(f"cross-depth has no evaluation at T = {T} (T values present: {have})")
    theme()
    panel_w = max(4.8, 0.75 * max(m.shape[1] for *_, m in mats) + 2.5)
    fig, axes = grid(len(mats), w=panel_w, h=max(3.4, 0.6 * max(m.shape[0] for *_, m in mats) + 2.0), cols=2)
    # what else (beyond K, schedule, loss) tells the families of a variant apart, from one model of each
    names: dict[str, str] = {}
    for variant in {v for v, *_ in mats}:
        names.update(differing([key[-1] for v, _, key, _ in mats if v == variant],
                               (*SHAPE_FIELDS, "train.schedule", "train.loss")))
    tables = {}  # csv name -> the heatmap's numbers
    # panels of one rate metric share the 0..1 scale: one colorbar beside the first row serves them all
    # (a colorbar per panel would be a third of a large study's cross-depth figure)
    shared = len(mats) > 1 and len({metric for _, metric, *_ in mats}) == 1 and tasks.metric(mats[0][1]).unit
    for ax, (variant, metric, (K, schedule, loss, width, rep), m) in zip(axes, mats):
        rate = tasks.metric(metric).unit
        mesh = _heatmap(ax, m, vmin=0 if rate else None, vmax=1 if rate else None,
                        label=None if shared else tasks.metric(metric).label)
        for i, lt in enumerate(m.index):  # outline the cells sampled at the training depth
            if lt in list(m.columns):
                ax.add_patch(Rectangle((list(m.columns).index(lt), i), 1, 1, fill=False, ec="red", lw=2))
        ax.set_xlabel("sampling depth L_s (loops per step)")
        ax.set_ylabel("training depth L_t")
        extra = f", {names[rep]}" if names[rep] else ""
        # wrapped to the panel (about 11 characters of 10 pt text per inch): long family names ran
        # into the next column's title
        title = textwrap.fill(f"{variant}, K = {K}, {schedule} schedule, {loss} loss{extra}", int(panel_w * 11))
        ax.set_title(f"{title}\nT = {T}; red: L_s = L_t", fontsize=10)
        name = f"cross_depth_K{K}_{schedule}_{loss}_d{width}_T{T}"
        name = next(f"{name}_{i}" for i in range(1, len(mats) + 2) if f"{name}_{i}" not in tables) \
            if name in tables else name  # two families with one name: number the later ones
        tables[name] = m.reset_index()
    if shared:
        cax = axes[min(1, len(axes) - 1)].inset_axes([1.05, 0.0, 0.05, 1.0])
        fig.colorbar(mesh, cax=cax, label=f"{tasks.metric(mats[0][1]).label}, every panel"
                     ).outline.set_linewidth(0)
    fig.suptitle(f"{data.name}: cross-depth — train at L_t, sample at L_s (T = {T})")
    tight(fig)
    return Drawing(fig, "cross_depth", tables)


def _default_T(families: list[tuple]) -> int:
    counts: dict[int, int] = {}
    for *_, d in families:
        for T, g in d.groupby("T"):
            counts[T] = counts.get(T, 0) + len(g[["L_t", "L_s"]].drop_duplicates())
    best = max(counts.values())
    tied = sorted(T for T, c in counts.items() if c == best)
    return tied[(len(tied) - 1) // 2]  # the middle one: low T saturates at 0, high T at the ceiling


def _heatmap(ax, m: pd.DataFrame, vmin, vmax, label: str | None):
    """m as an annotated heatmap (rows top to bottom, one cell per value, two decimals, a colorbar
    beside), as sns.heatmap(annot=True, fmt=".2f", cmap="viridis", linewidths=0.5, linecolor="white")
    draws it, without its whole-figure draw to test whether tick labels overlap (a few short labels
    here never do; that draw would be a third of a large study's cross-depth figure). label=None: no
    colorbar (the caller draws one for several panels). Returns the mesh."""
    import seaborn as sns

    values = np.ma.masked_invalid(m.to_numpy(dtype=float))
    mesh = ax.pcolormesh(values, cmap="viridis", vmin=vmin, vmax=vmax, linewidths=0.5, edgecolors="white")
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set(xlim=(0, m.shape[1]), ylim=(m.shape[0], 0))
    if label is not None:
        # in lines of 18 characters: a short panel's colorbar is shorter than a metric's name
        ax.figure.colorbar(mesh, ax=ax, label=textwrap.fill(label, 18)).outline.set_linewidth(0)
    ax.set_xticks(np.arange(m.shape[1]) + 0.5, [str(c) for c in m.columns])
    ax.set_yticks(np.arange(m.shape[0]) + 0.5, [str(i) for i in m.index], va="center")
    ax.grid(False)
    mesh.update_scalarmappable()
    for (i, j), face in zip(np.ndindex(*m.shape), mesh.get_facecolors()):
        if values.mask is np.ma.nomask or not values.mask[i, j]:
            dark = sns.utils.relative_luminance(face) <= 0.408  # seaborn's rule: white text on dark cells
            ax.text(j + 0.5, i + 0.5, f"{values[i, j]:.2f}", color="w" if dark else ".15", ha="center", va="center")
    return mesh
