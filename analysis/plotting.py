"""Drawing helpers every figure of analysis/figures/ shares: panels and their grid, lines with their
interval bands, axes, legends, labels, the theme, and writing a figure and its tables to files.
"""
from __future__ import annotations

import functools
import math
import os
import sys
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.derived import Derived
from analysis.load import MissingData, StudyData
from analysis.options import DATELESS, FORMATS, PNG_DPI, Options  # noqa: F401 (the figures' API)
from analysis.tables import SHAPE_FIELDS, differing, one_split, shape_label
import tasks

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@functools.cache
def mpl():
    """matplotlib, imported at the first figure drawn, not with this module: a report with drawing workers
    imports the figures (analysis.figures) in its own process only to order and caption them. The Agg backend
    is chosen here, once: a caller's pyplot (the Python API's user, a test) is headless."""
    import matplotlib

    matplotlib.use("Agg")
    return matplotlib


def figure(**kw) -> Figure:
    """A new Figure drawn on an Agg canvas: what plt.figure(**kw) gives with the Agg backend, without
    pyplot (its import, its backend machinery, its registry of open figures that each needs closing)."""
    mpl()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kw)
    FigureCanvasAgg(fig)
    return fig


def subplots(nrows: int = 1, ncols: int = 1, figsize=None, **kw):
    """plt.subplots(nrows, ncols, figsize=figsize, **kw) on a figure of figure(): (the Figure, its axes)."""
    fig = figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


@dataclass
class Drawing:
    """What a figure's draw() returns: the figure, written as <file>.png and .<fmt>, and the tables written
    beside it as <name>.csv (in this order)."""
    fig: Figure
    file: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


def ylabel(metric: str) -> str:
    # the band is the seed interval of stats.seed_interval (none where the seeds tie: ci_method says why)
    ci = "95% CI over seeds; 1 seed: Wilson" if tasks.is_rate(metric) else "95% CI over seeds"
    return wrap_label(f"{tasks.metric(metric).label}\n(band: {ci})")


def wrap_label(text: str) -> str:
    """An axis label in lines of at most LABEL_CHARS characters (a y label longer than its axes runs off
    the figure)."""
    return "\n".join(textwrap.fill(part, LABEL_CHARS) for part in text.split("\n"))


def model_names(d: pd.DataFrame, shown=SHAPE_FIELDS) -> dict[str, str]:
    """model_key -> the fields that tell the models of `d` apart beyond `shown` ('' when none)."""
    return differing(sorted(d["model_key"].unique()), shown)


def model_label(row, names: dict[str, str]) -> str:
    """'(1 x 2)', or '(1 x 2) truncate_k=2' when other models shown beside it differ in truncate_k."""
    return shape_label(row["K"], row["L_t"], names.get(row["model_key"], ""))


MAX_MODELS = 8  # models (colors) in one panel before a figure splits it by the fields that tell them apart


def facets(d: pd.DataFrame, shown=SHAPE_FIELDS, cap: int = MAX_MODELS) -> list[tuple[str, pd.DataFrame]]:
    """(what the panel's models share beyond `shown`, its rows): d as one panel while it holds at most `cap`
    models, else one panel per value of the other fields that differ (a 100-model sweep over lr and
    shape: one panel per lr, not 100 legend entries in one)."""
    names = model_names(d, shown)
    extras = sorted(set(names.values()))
    if d["model_key"].nunique() <= cap or len(extras) < 2:
        return [("", d)]
    tag = d["model_key"].map(names)
    return [(e, d[tag == e]) for e in extras]


LEGEND_WIDTH = 2.4  # inches a panel grows by to make room for its legend beside it
LEGEND_FONT, LEGEND_TITLE_FONT = 9, 10  # points: readable beside the theme's 11-point ticks
LABEL_CHARS = 30  # characters per line of a y label: a longer one is wrapped, never taller than its axes


def panel_width(w: float, most_entries: int) -> float:
    """A panel's width, grown by LEGEND_WIDTH when it has a legend (beside it: see legend)."""
    return w + (LEGEND_WIDTH if most_entries > 0 else 0.0)


def facet_title(ax, title: str, extra: str) -> None:
    """The panel's title, with what its models share (a facet of a large sweep) on a second line."""
    ax.set_title(title + (f"\n{extra}" if extra else ""), fontsize=10 if extra else None)


def legend(ax, n_entries: int, below: bool = False, **kw) -> None:
    """The panel's legend outside its axes, beside them (right) or `below` them (under the x label):
    inside, a legend covers the lines it names wherever they run. Its text at LEGEND_FONT points."""
    at = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.2)} if below else \
        {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0)}
    kw = {**kw, **at, "borderaxespad": 0.0, "fontsize": LEGEND_FONT, "title_fontsize": LEGEND_TITLE_FONT}
    if n_entries > 24:  # a tall legend in two columns rather than past the panel's bottom
        kw.setdefault("ncol", 2)
    ax.legend(**kw)


def line(ax, g: pd.DataFrame, x: str, label: str | None, color, marker: str = "o", ls: str = "-") -> None:
    """Seed-mean metric vs x with its interval as a band; bars of +-1 s.d. across seeds when several.

    The bands and bars of all lines of one axes become one artist each (see flush_bands): a
    100-model figure then draws a few hundred artists fewer in each of its layout and save passes."""
    one_split(g, "a line")
    # numpy from here: a large figure draws hundreds of lines, and pandas per line would be a third of its
    # building time
    xs = g[x].to_numpy(dtype=float)
    order = np.argsort(xs, kind="stable")
    xs = xs[order]
    if len(xs) > 1 and (np.diff(xs) == 0).any():
        raise ValueError(f"a line was given two rows at one {x}: group by model_key first")
    col = lambda c: g[c].to_numpy(dtype=float)[order]
    v = col("value")
    ax.plot(xs, v, marker=marker, ls=ls, color=color, label=label if label is not None else "_nolegend_")
    band(ax, xs, col("ci_low"), col("ci_high"), color)
    if (g["n_seeds"].to_numpy() > 1).any():
        sd = np.nan_to_num(col("seed_sd"), nan=0.0)
        _pending(ax)["bars"] += [(xi, a, b, color) for xi, a, b in zip(xs, v - sd, v + sd)]


def _pending(ax) -> dict:
    return ax.__dict__.setdefault("_rmdm_bands", {"bands": [], "bars": []})


def band(ax, xs: np.ndarray, lo: np.ndarray, hi: np.ndarray, color) -> None:
    """fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0), drawn with the axes' other bands as one
    artist by flush_bands: one polygon per run of points with a finite interval (fill_between leaves
    gaps at NaN too)."""
    ok = np.isfinite(xs) & np.isfinite(lo) & np.isfinite(hi)
    for run in np.split(np.arange(len(xs)), np.flatnonzero(np.diff(ok.astype(int))) + 1):
        run = run[ok[run]]
        if len(run):
            _pending(ax)["bands"].append((np.r_[np.c_[xs[run], lo[run]], np.c_[xs[run], hi[run]][::-1]], color))


def flush_bands(fig) -> None:
    """Draw the bands and seed bars line collected, per axes: one PolyCollection of bands (alpha 0.15,
    below the lines), one LineCollection of bars and one scatter of their caps (as errorbar(capsize=3)
    draws them)."""
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.colors import to_rgba

    # colors as an (n, 4) array: a list of two colors would read as one (color, alpha) pair
    rgba = lambda colors: np.array([to_rgba(c) for c in colors])
    for ax in fig.axes:
        pending = ax.__dict__.pop("_rmdm_bands", None)
        if not pending:
            continue
        if pending["bands"]:
            polys, colors = zip(*pending["bands"])
            ax.add_collection(PolyCollection(polys, facecolors=rgba(colors), alpha=0.15, linewidths=0, zorder=1),
                              autolim=False)  # the limits from the vertices at once, not path by path
            ax.update_datalim(np.concatenate(polys))
        if pending["bars"]:
            xs, lo, hi, colors = (list(c) for c in zip(*pending["bars"]))
            ax.add_collection(LineCollection([[(x, a), (x, b)] for x, a, b in zip(xs, lo, hi)], colors=rgba(colors),
                                             linewidths=1, zorder=2), autolim=False)
            ax.scatter(xs + xs, lo + hi, marker="_", s=36, linewidths=1, c=rgba(colors + colors), zorder=2)
        ax.autoscale_view()


def metric_axes(ax, metric: str, xs, xlabel: str = "denoising steps T") -> None:
    """A panel of `metric` against xs: the x axis (x_axis), a rate's 0..1 (rate_ylim) and the y label."""
    x_axis(ax, xs, xlabel)
    rate_ylim(ax, metric)
    ax.set_ylabel(ylabel(metric))


def x_axis(ax, values, label: str, max_ticks: int = 9) -> None:
    values = sorted({int(round(v)) for v in values})
    log = len(values) > 1 and values[-1] / max(values[0], 1) >= 4
    if log:
        ax.set_xscale("log", base=2)
    ticks = thin(values, max_ticks, log)
    ax.set_xticks(ticks, [str(v) for v in ticks])
    ax.minorticks_off()
    ax.set_xlabel(label)


def thin(values: list[int], n: int, log: bool) -> list[int]:
    """At most about n of the sorted `values` as ticks, spread evenly (on a log axis, in log): the
    first and the last always, the others only when far enough from the last one kept."""
    if len(values) <= n:
        return values
    pos = [math.log2(max(v, 1)) if log else float(v) for v in values]
    gap = (pos[-1] - pos[0]) / (n - 1)
    kept = [0]
    for i in range(1, len(values) - 1):
        if pos[i] - pos[kept[-1]] >= gap * 0.999 and pos[-1] - pos[i] >= gap * 0.5:
            kept.append(i)
    return [values[i] for i in kept + [len(values) - 1]]


RATE_TICKS = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


def rate_ylim(ax, metric: str) -> None:
    """A rate's axis: 0 to 1 with fixed ticks (what the automatic locator picks there, without its
    formatter's work on every layout and draw)."""
    if tasks.metric(metric).unit:
        ax.set_ylim(-0.02, 1.02)
        ax.set_yticks(RATE_TICKS, [f"{v:.1f}" for v in RATE_TICKS])
        ax.__dict__["_rmdm_rate"] = True  # outer_y_labels may leave its labels to its left neighbour


def outer_y_labels(fig) -> None:
    """A rate panel whose left neighbour in the grid has the same y label (same metric, same fixed
    0..1 ticks) shows neither: the row's first panel labels the row (fewer texts to lay out and draw
    in a large figure, and a less cluttered one)."""
    at = {}
    for ax in fig.axes:
        ss = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
        if ss is not None and ax.get_visible():
            at[(id(ss.get_gridspec()), ss.rowspan.start, ss.colspan.start)] = ax
    label = {k: ax.get_ylabel() for k, ax in at.items()}  # before any is cleared
    for (gs, row, col), ax in at.items():
        left = at.get((gs, row, col - 1))
        if (left is not None and ax.__dict__.get("_rmdm_rate") and left.__dict__.get("_rmdm_rate")
                and label[(gs, row, col)] == label[(gs, row, col - 1)]):
            ax.set_ylabel("")
            ax.tick_params(labelleft=False)


def seed_note(d: pd.DataFrame) -> str:
    n = int(d["n_seeds"].max()) if "n_seeds" in d and len(d) else 1
    return f"; mean of {n} seeds (band: 95% CI, bars: +-1 s.d. across seeds)" if n > 1 else ""


def grid(n: int, w: float = 4.6, h: float = 3.8, cols: int = 4):
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    fig, axes = subplots(rows, cols, figsize=(w * cols, h * rows + 0.6), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def tight(fig) -> None:
    """tight_layout with the figure's suptitle (wrapped to the figure's width) above the first row.

    The suptitle is pinned a fixed 0.1 inch below the top edge: at its default height (98% of the
    figure) a tall grid's title sits far below the edge, and tight_layout, which reserves only the
    title's own height, lets the first row's titles run into it. Pinned, one tight_layout pass is
    enough (a `rect` would measure every panel twice)."""
    st = fig._suptitle
    if st is not None:
        width = max(40, int(fig.get_size_inches()[0] * 7.5))  # characters of a 12 pt title per line
        text = st.get_text()
        if any(len(line) > width for line in text.split("\n")):
            st.set_text("\n".join(textwrap.fill(line, width) for line in text.split("\n")))
        st.set_y(1.0 - 0.1 / fig.get_size_inches()[1])
        st.set_verticalalignment("top")
    flush_bands(fig)
    outer_y_labels(fig)
    fig.tight_layout()


def apart(fig, labels: list) -> None:
    """Move annotations (offset in points) up, one after another, until no two of them overprint."""
    r, placed = fig.canvas.get_renderer(), []
    for a in sorted(labels, key=lambda a: tuple(a.get_window_extent(r).p0[::-1])):
        box = a.get_window_extent(r)
        while hit := next((b for b in placed if box.overlaps(b)), None):
            x, y = a.xyann
            a.xyann = (x, y + (hit.y1 - box.y0) * 72 / fig.dpi + 1)
            box = a.get_window_extent(r)
        placed.append(box)


def palette(keys) -> dict:
    import seaborn as sns

    keys = list(dict.fromkeys(keys))
    # seaborn's colour-blind-safe palette while its ten colours last, then viridis (one colour per key still)
    return dict(zip(keys, sns.color_palette("colorblind" if len(keys) <= 10 else "viridis", max(len(keys), 1))))


def needs_T(d: pd.DataFrame, what: str) -> None:
    Ts = sorted(int(t) for t in d["T"].unique())
    if len(Ts) < 2:
        raise MissingData(f"{what} plots the metric against T and needs at least two values of T (have T = {Ts})")


def theme() -> None:
    import seaborn as sns

    matplotlib = mpl()
    sns.set_theme(style="whitegrid", context="notebook")
    # titles at a fixed height above their axes: matplotlib's automatic placement lays out the whole
    # y axis on every draw of every titled panel, only to dodge tick labels on top (we never put any
    # there): a fifth of a large figure's drawing
    matplotlib.rcParams["axes.titley"] = 1.0
    # SVG text as <text> elements, not glyph outlines: editable and searchable in the figure a paper
    # reuses, smaller, and a fifth quicker to write (the viewer needs a sans-serif font; DejaVu Sans
    # is what the PNG uses)
    matplotlib.rcParams["svg.fonttype"] = "none"


def ablation(data: StudyData, derived: Derived, opts: Options, axis: str, file: str, what: str) -> Drawing:
    """Metric vs T, one line per value of `axis` (loss or schedule), one panel per recursive model: the
    shape of the losses and schedules figures."""
    other = "schedule" if axis == "loss" else "loss"
    panels, have = [], []
    for variant, metric, d in derived.by_variant(file, opts.split):
        d = d[(d["L_t"] > 1) & (d["L_s"] == d["L_t"])]
        for key, g in d.groupby(["K", "L_t", other, "d_model"]):
            have.append(f"{variant} {shape_label(key[0], key[1])}: {axis} {sorted(g[axis].unique())}")
            if g[axis].nunique() >= 2:
                panels.append((variant, metric, key, g))
    if not panels:
        raise MissingData(f"{file} needs one recursive model (L > 1) trained with two or more {axis} values, other "
                          f"settings equal (have {'; '.join(have) or 'no recursive model evaluated at L_s = L_t'})")
    theme()
    fig, axes = grid(len(panels), w=panel_width(4.6, 1), cols=3)
    for ax, (variant, metric, (K, L, oth, width), g) in zip(axes, panels):
        # one line per model: the label names the fields that differ (the axis, and any other, e.g. truncate_k)
        names = model_names(g)
        lines = sorted(g.groupby("model_key"), key=lambda kg: names[kg[0]])
        colors = palette([k for k, _ in lines])
        for key, gl in lines:
            line(ax, gl, "T", names[key] or model_label(gl.iloc[0], names), colors[key])
        metric_axes(ax, metric, g["T"])
        ax.set_title(f"{variant}, {shape_label(K, L)}, {other} {oth}\nL_s = L_t = {L}", fontsize=10)
        legend(ax, len(lines), title=what)
    fig.suptitle(f"{data.name}: {what} ablation{seed_note(panels[0][3])}")
    tight(fig)
    return Drawing(fig, file)


def save(fig, out_dir: str | None, name: str, fmt: str) -> list:
    """Write fig as PNG and `fmt` into out_dir and close it: the paths. out_dir None (the Python API,
    rmdm_study): write nothing and hand the Figure back, laid out and open."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if out_dir is None:
        return [fig]
    os.makedirs(out_dir, exist_ok=True)
    matplotlib = mpl()
    paths = []
    # savefig(bbox_inches="tight") draws the whole figure once only to measure it, per file: with a
    # hundred models (a legend entry and tick label each) drawing is most of a report. Measure once,
    # as the PNG's savefig would (Agg at its dpi), and save both files with that box.
    bbox = _tight_bbox(fig, PNG_DPI)
    engine = fig.get_layout_engine()
    fig._layout_engine = None  # the layout is final (tight_layout ran): no draw per file to redo it
    try:
        for ext in ("png", fmt):
            p = os.path.join(out_dir, f"{name}.{ext}")
            # zlib level 3, not 6: a third less time encoding a large figure for a file about 4% larger
            # no date in the file and SVG ids from a fixed salt: the same figure is the same bytes each report
            with matplotlib.rc_context({"svg.hashsalt": "rmdm-study"}):
                fig.savefig(p, dpi=PNG_DPI if ext == "png" else None, bbox_inches=bbox, metadata=DATELESS[ext],
                            **({"pil_kwargs": {"compress_level": 3}} if ext == "png" else {}))
            paths.append(p)
    finally:
        fig._layout_engine = engine
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:  # a figure pyplot made (a caller's) leaves its registry; figure()'s are not in it
            plt.close(fig)
    return paths


def _tight_bbox(fig, dpi: float):
    """The box savefig(bbox_inches="tight", dpi=dpi) would crop a PNG to (inches, padded), measured
    without savefig's extra draw: after tight_layout the artists' extents are final, and the same
    boxes come out (checked on every figure of the demo, CPU and 1,000-run stores)."""
    old = fig.dpi
    fig.set_dpi(dpi)
    try:
        pad = mpl().rcParams["savefig.pad_inches"]
        return fig.get_tightbbox(fig.canvas.get_renderer()).padded(pad, pad)
    finally:
        fig.set_dpi(old)


def save_table(df: pd.DataFrame, out_dir: str | None, name: str):
    """Write df as out_dir/name.csv: the path (out_dir None: the DataFrame, nothing written)."""
    if out_dir is None:
        return df
    os.makedirs(out_dir, exist_ok=True)
    p = os.path.join(out_dir, f"{name}.csv")
    df.to_csv(p, index=False)
    return p
