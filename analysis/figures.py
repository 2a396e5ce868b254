"""The paper's figures, drawn with matplotlib + seaborn from the results store only.

Every figure function takes (StudyData, out_dir, Options) and returns the paths it wrote
(a PNG and the chosen second format, plus CSV tables beside some). A figure that the data
cannot support raises MissingData naming the axes or values that are missing, and writes nothing.
The numbers come from the pure functions of analysis.tables.
"""
from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis.load import MissingData, StudyData  # noqa: E402
import tasks  # noqa: E402
from analysis.tables import (DEFAULT_SPLIT, SHAPE_FIELDS,  # noqa: E402
                             aggregate, differing, family_key, heatmap_matrix, iso_flop_pairs, one_split,
                             pareto_front, primary_metric, select, text8_table, threshold_crossings)

FORMATS = ("svg", "pdf")
PNG_DPI = 130


@dataclass(frozen=True)
class Options:
    fmt: str = "svg"  # second format beside PNG
    threshold: float | None = None  # pareto: default 0.95 for VPR, 0.70 for RTR
    T: int | None = None  # cross-depth: denoising steps of the heatmap (default: the middle T of those with most cells)
    pareto_x: str = "T"  # pareto y-axis: "T" (at L_s = L_t) or "forward_passes" (T * L_s, any L_s)
    split: str = DEFAULT_SPLIT  # the one evaluation split every figure and table reads
    compare: tuple = ()  # (run id A, run id B) pairs the report compares beside its iso pairs


# ---- helpers ---------------------------------------------------------------------------------
def aggregated(data: StudyData) -> pd.DataFrame:
    cached = getattr(data, "_agg", None)
    if cached is None:
        cached = aggregate(data.evals)
        object.__setattr__(data, "_agg", cached)
    return cached


def _split_rows(data: StudyData, what: str, split: str) -> pd.DataFrame:
    """The aggregated rows of one split; MissingData naming the splits present when it has none."""
    agg = aggregated(data)
    if agg.empty:
        raise MissingData(f"{what} needs evaluations: the study has no evals rows")
    if not (agg["split"] == split).any():
        raise MissingData(f"{what}: no evaluations on split {split!r} (splits present: "
                          f"{', '.join(sorted(map(str, agg['split'].unique())))})")
    return agg[agg["split"] == split]


def _by_variant(data: StudyData, what: str, split: str = DEFAULT_SPLIT) -> list[tuple[str, str, pd.DataFrame]]:
    """(task variant, its primary metric, its aggregated rows of that metric on `split`), variants with data only."""
    agg = _split_rows(data, what, split)
    out = []
    for variant, g in agg.groupby("task_variant"):
        metric = primary_metric(g["task"].iloc[0], g["metric"].unique())
        d = select(g, metric, split=split)
        if not d.empty:
            out.append((variant, metric, d))
    return out


def _ylabel(metric: str) -> str:
    ci = "95% Wilson CI" if tasks.is_rate(metric) else "95% CI"
    return f"{tasks.metric(metric).label}  (band: {ci})"


def fmt_params(n: float) -> str:
    """10_600_000 -> '10.6M', 150_000 -> '150k', 150 -> '150'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{int(n)}"


def _label(K, L) -> str:
    return f"({K} x {L})"


def _names(d: pd.DataFrame, shown=SHAPE_FIELDS) -> dict[str, str]:
    """model_key -> the fields that tell the models of `d` apart beyond `shown` ('' when none)."""
    return differing(sorted(d["model_key"].unique()), shown)


def _model_label(row, names: dict[str, str]) -> str:
    """'(1 x 2)', or '(1 x 2) truncate_k=2' when other models shown beside it differ in truncate_k."""
    extra = names.get(row["model_key"], "")
    return _label(row["K"], row["L_t"]) + (f" {extra}" if extra else "")


ADAPTIVE_MARKERS = "*XPh"  # compute: one per adaptive-depth setting (threshold, cap)
MAX_MODELS = 8  # models (colors) in one panel before a figure splits it by the fields that tell them apart


def _facets(d: pd.DataFrame, shown=SHAPE_FIELDS, cap: int = MAX_MODELS) -> list[tuple[str, pd.DataFrame]]:
    """(what the panel's models share beyond `shown`, its rows): d as one panel while it holds at most `cap`
    models, else one panel per value of the other fields that differ (a 100-model sweep over lr and
    shape: one panel per lr, not 100 legend entries in one)."""
    names = _names(d, shown)
    extras = sorted(set(names.values()))
    if d["model_key"].nunique() <= cap or len(extras) < 2:
        return [("", d)]
    tag = d["model_key"].map(names)
    return [(e, d[tag == e]) for e in extras]


LEGEND_INSIDE = 6  # entries a legend may have inside its axes; a longer one goes beside them
LEGEND_WIDTH = 2.4  # inches a panel grows by to make room for a legend beside it


def _panel_width(w: float, most_entries: int) -> float:
    """A panel's width, grown by LEGEND_WIDTH when some panel's legend goes beside it (see _legend)."""
    return w + (LEGEND_WIDTH if most_entries > LEGEND_INSIDE else 0.0)


def _facet_title(ax, title: str, extra: str) -> None:
    """The panel's title, with what its models share (a facet of a large sweep) on a second line."""
    ax.set_title(title + (f"\n{extra}" if extra else ""), fontsize=10 if extra else None)


def _legend(ax, n_entries: int, **kw) -> None:
    """A legend inside the axes while it is short, beside them (right) when it would cover the lines."""
    if n_entries > LEGEND_INSIDE:
        kw = {**kw, "loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0}
    ax.legend(**kw)


def _line(ax, g: pd.DataFrame, x: str, label: str | None, color, marker: str = "o", ls: str = "-") -> None:
    """Seed-mean metric vs x with its interval as a band; bars of +-1 s.d. across seeds when several.

    The bands and bars of all lines of one axes become one artist each (see _flush_bands): a
    100-model figure then draws a few hundred artists fewer in each of its layout and save passes."""
    one_split(g, "a line")
    # numpy from here: a large figure draws hundreds of lines, and pandas per line was a third of its
    # building time
    xs = g[x].to_numpy(dtype=float)
    order = np.argsort(xs, kind="stable")
    xs = xs[order]
    if len(xs) > 1 and (np.diff(xs) == 0).any():
        raise ValueError(f"a line was given two rows at one {x}: group by model_key first")
    col = lambda c: g[c].to_numpy(dtype=float)[order]
    v = col("value")
    ax.plot(xs, v, marker=marker, ls=ls, color=color, label=label if label is not None else "_nolegend_")
    _band(ax, xs, col("ci_low"), col("ci_high"), color)
    if (g["n_seeds"].to_numpy() > 1).any():
        sd = np.nan_to_num(col("seed_sd"), nan=0.0)
        _pending(ax)["bars"] += [(xi, a, b, color) for xi, a, b in zip(xs, v - sd, v + sd)]


def _pending(ax) -> dict:
    return ax.__dict__.setdefault("_rmdm_bands", {"bands": [], "bars": []})


def _band(ax, xs: np.ndarray, lo: np.ndarray, hi: np.ndarray, color) -> None:
    """fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0), drawn with the axes' other bands as one
    artist by _flush_bands: one polygon per run of points with a finite interval (fill_between leaves
    gaps at NaN too)."""
    ok = np.isfinite(xs) & np.isfinite(lo) & np.isfinite(hi)
    for run in np.split(np.arange(len(xs)), np.flatnonzero(np.diff(ok.astype(int))) + 1):
        run = run[ok[run]]
        if len(run):
            _pending(ax)["bands"].append((np.r_[np.c_[xs[run], lo[run]], np.c_[xs[run], hi[run]][::-1]], color))


def _flush_bands(fig) -> None:
    """Draw the bands and seed bars _line collected, per axes: one PolyCollection of bands (alpha 0.15,
    below the lines), one LineCollection of bars and one scatter of their caps (as errorbar(capsize=3)
    draws them)."""
    # colors as an (n, 4) array: a list of two colors would read as one (color, alpha) pair
    rgba = lambda colors: np.array([matplotlib.colors.to_rgba(c) for c in colors])
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


def _x_axis(ax, values, label: str, max_ticks: int = 9) -> None:
    values = sorted({int(round(v)) for v in values})
    log = len(values) > 1 and values[-1] / max(values[0], 1) >= 4
    if log:
        ax.set_xscale("log", base=2)
    ticks = _thin(values, max_ticks, log)
    ax.set_xticks(ticks, [str(v) for v in ticks])
    ax.minorticks_off()
    ax.set_xlabel(label)


def _thin(values: list[int], n: int, log: bool) -> list[int]:
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


def _loc(metric: str) -> str:
    """Legend corner away from the curves: metrics rise with T (rates) or fall (likelihoods)."""
    return "upper right" if tasks.lower_is_better(metric) else "lower right"


RATE_TICKS = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


def _rate_ylim(ax, metric: str) -> None:
    """A rate's axis: 0 to 1 with fixed ticks (what the automatic locator picks there, without its
    formatter's work on every layout and draw)."""
    if tasks.metric(metric).unit:
        ax.set_ylim(-0.02, 1.02)
        ax.set_yticks(RATE_TICKS, [f"{v:.1f}" for v in RATE_TICKS])
        ax.__dict__["_rmdm_rate"] = True  # _outer_y_labels may leave its labels to its left neighbour


def _outer_y_labels(fig) -> None:
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


def _seed_note(d: pd.DataFrame) -> str:
    n = int(d["n_seeds"].max()) if "n_seeds" in d and len(d) else 1
    return f"; mean of {n} seeds, bars +-1 s.d. across seeds" if n > 1 else ""


def _grid(n: int, w: float = 4.6, h: float = 3.8, cols: int = 4):
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows + 0.6), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _tight(fig) -> None:
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
    _flush_bands(fig)
    _outer_y_labels(fig)
    fig.tight_layout()


def _palette(keys) -> dict:
    keys = list(dict.fromkeys(keys))
    return dict(zip(keys, sns.color_palette("viridis" if len(keys) > 2 else "deep", max(len(keys), 1))))


def _needs_T(d: pd.DataFrame, what: str) -> None:
    Ts = sorted(int(t) for t in d["T"].unique())
    if len(Ts) < 2:
        raise MissingData(f"{what} plots the metric against T and needs at least two values of T (have T = {Ts})")


def save(fig, out_dir: str | None, name: str, fmt: str) -> list:
    """Write fig as PNG and `fmt` into out_dir and close it: the paths. out_dir None (the Python API,
    rmdm_study): write nothing and hand the Figure back, laid out and open."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if out_dir is None:
        return [fig]
    os.makedirs(out_dir, exist_ok=True)
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
            fig.savefig(p, dpi=PNG_DPI if ext == "png" else None, bbox_inches=bbox,
                        **({"pil_kwargs": {"compress_level": 3}} if ext == "png" else {}))
            paths.append(p)
    finally:
        fig._layout_engine = engine
        plt.close(fig)
    return paths


def _tight_bbox(fig, dpi: float):
    """The box savefig(bbox_inches="tight", dpi=dpi) would crop a PNG to (inches, padded), measured
    without savefig's extra draw: after tight_layout the artists' extents are final, and the same
    boxes come out (checked on every figure of the demo, CPU and 1,000-run stores)."""
    old = fig.dpi
    fig.set_dpi(dpi)
    try:
        pad = matplotlib.rcParams["savefig.pad_inches"]
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


def _theme() -> None:
    sns.set_theme(style="whitegrid", context="notebook")
    # titles at a fixed height above their axes: matplotlib's automatic placement lays out the whole
    # y axis on every draw of every titled panel, only to dodge tick labels on top (we never put any
    # there): a fifth of a large figure's drawing
    matplotlib.rcParams["axes.titley"] = 1.0
    # SVG text as <text> elements, not glyph outlines: editable and searchable in the figure a paper
    # reuses, smaller, and a fifth quicker to write (the viewer needs a sans-serif font; DejaVu Sans
    # is what the PNG uses)
    matplotlib.rcParams["svg.fonttype"] = "none"


# ---- figures ---------------------------------------------------------------------------------
def iso_param(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Metric vs T, one line per L (sampled at its training depth), one panel per (task variant, K)."""
    panels, have = [], []
    for variant, metric, d in _by_variant(data, "iso-param", opts.split):
        d = d[d["L_s"] == d["L_t"]]
        for (K, width), gk in d.groupby(["K", "d_model"]):
            have.append(f"{variant} K={K}: L={sorted(int(x) for x in gk['L_t'].unique())}")
            for extra, g in _facets(gk):
                if g["L_t"].nunique() >= 2:
                    panels.append((variant, metric, K, width, extra, g))
    if not panels:
        raise MissingData("iso-param needs at least two training depths L at the same K, evaluated at L_s = L_t "
                          f"(have {'; '.join(have) or 'no evaluation at L_s = L_t'})")
    _needs_T(pd.concat([p[-1] for p in panels]), "iso-param")
    _theme()
    fig, axes = _grid(len(panels), w=_panel_width(4.6, max(p[-1]["model_key"].nunique() for p in panels)))
    multi_width = len({p[3] for p in panels}) > 1
    for ax, (variant, metric, K, width, extra, g) in zip(axes, panels):
        names = _names(g)
        lines = sorted(g.groupby("model_key"), key=lambda kg: (kg[1]["L_t"].iloc[0], names[kg[0]]))
        colors = _palette([k for k, _ in lines])
        for key, gl in lines:
            row = gl.iloc[0]
            _line(ax, gl, "T", f"{_model_label(row, names)}  L_t = L_s = {row['L_t']}", colors[key])
        _x_axis(ax, g["T"], "denoising steps T")
        _rate_ylim(ax, metric)
        ax.set_ylabel(_ylabel(metric))
        _facet_title(ax, f"{variant}, K = {K}" + (f", d = {width}" if multi_width else ""), extra)
        _legend(ax, len(lines), title="model (K x L)", fontsize=8, loc=_loc(metric))
    fig.suptitle(f"{data.name}: iso-parameter — K layers looped L times vs L = 1{_seed_note(panels[0][-1])}")
    _tight(fig)
    return save(fig, out_dir, "iso_param", opts.fmt)


def iso_flop(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Each (K x L) against its (KL x 1) partner (equal K*L, so equal FLOPs per step), metric vs T,
    with the parameter counts in a table beside the panels."""
    pairs = pairs_of(data)
    if pairs.empty:
        have = sorted({_label(k, l) for k, l in zip(data.runs["K"], data.runs["L_t"])})
        raise MissingData("iso-flop needs a recursive (K x L) model, L > 1, and a single-pass (KL x 1) model of "
                          f"the same task variant and width (models present: {', '.join(have)})")
    variants = {v: (m, d) for v, m, d in _by_variant(data, "iso-flop", opts.split)}
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
    _needs_T(pd.concat([pd.concat([r, s]) for _, _, r, s in panels]), "iso-flop")
    _theme()
    n = len(panels)
    cols = min(n, 4)  # panels wrap into rows of four; the parameter table spans the rows on the right
    rows = math.ceil(n / cols)
    fig = plt.figure(figsize=(4.6 * cols + 5.2, 4.4 * rows + 0.4 * max(0, n - 8) / cols))
    gs = fig.add_gridspec(rows, cols + 1, width_ratios=[1] * cols + [1.15])
    c_rec, c_single = sns.color_palette("deep")[0], sns.color_palette("deep")[3]
    for i, (p, metric, rec, single) in enumerate(panels):
        ax = fig.add_subplot(gs[i // cols, i % cols])
        _line(ax, rec, "T", f"{_label(p.K, p.L)}{' ' + p.differs if p.differs else ''} recursive, "
              f"{fmt_params(p.params_recursive)} params", c_rec)
        _line(ax, single, "T", f"{_label(p.KL, 1)} single pass, {fmt_params(p.params_single)} params", c_single,
              marker="s", ls="--")
        _x_axis(ax, pd.concat([rec["T"], single["T"]]), "denoising steps T")
        _rate_ylim(ax, metric)
        ax.set_ylabel(_ylabel(metric))
        ax.set_title(f"{i + 1}. {p.task_variant}: K*L = {p.KL}", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    tab = fig.add_subplot(gs[:, cols])
    tab.axis("off")
    cells = [[str(i + 1), _label(p.K, p.L), fmt_params(p.params_recursive), _label(p.KL, 1),
              fmt_params(p.params_single), f"{p.param_ratio:.2f}x"] for i, (p, *_) in enumerate(panels)]
    t = tab.table(cellText=cells, colLabels=["panel", "(K x L)", "params", "(KL x 1)", "params", "ratio"],
                  loc="center", cellLoc="center")
    t.auto_set_font_size(False)
    t.set_fontsize(8)
    t.scale(1, 1.4)
    tab.set_title("parameters (same FLOPs per step)", fontsize=10)
    fig.suptitle(f"{data.name}: iso-FLOP — (K x L) vs (KL x 1) at equal compute{_seed_note(panels[0][2])}")
    _tight(fig)
    return save(fig, out_dir, "iso_flop", opts.fmt) + [
        save_table(pairs.drop(columns=["key_recursive", "key_single"]), out_dir, "iso_flop_params")]


def memo(data: StudyData, key: tuple, compute):
    """compute(), once per study read: a table a figure computes and the report's tables reuse (a
    drawing worker sends its memo back with the figure, analysis/render.py). Callers never modify it."""
    kept = data.__dict__.setdefault("_memo", {})
    if key not in kept:
        kept[key] = compute()
    return kept[key]


def pairs_of(data: StudyData) -> pd.DataFrame:
    """iso_flop_pairs of the study's runs (memoised)."""
    return memo(data, ("iso_flop_pairs",), lambda: iso_flop_pairs(data.runs))


def crossings_table(data: StudyData, opts: Options = Options()) -> pd.DataFrame:
    """Threshold crossings of every model of every task variant with a rate metric (memoised)."""
    return memo(data, ("crossings", opts.threshold, opts.pareto_x, opts.split), lambda: _crossings(data, opts))


def _crossings(data: StudyData, opts: Options) -> pd.DataFrame:
    frames = []
    for variant, metric, d in _by_variant(data, "pareto", opts.split):
        if not tasks.is_rate(metric):
            continue  # crossings are for success rates (VPR, RTR); text8's likelihood has its own table
        thr = opts.threshold if opts.threshold is not None else (tasks.metric(metric).threshold or 0.95)
        c = threshold_crossings(d, thr, metric, x=opts.pareto_x, split=opts.split)
        c["pareto"] = pareto_front(c).to_numpy()
        names = differing(c["model_key"])
        c["model"] = [_label(k, l) + (f" {names[key]}" if names[key] else "")
                      for k, l, key in zip(c["K"], c["L_t"], c["model_key"])]
        frames.append(c.assign(metric=metric, threshold=thr, x=opts.pareto_x))
    if not frames:
        raise MissingData("threshold crossings need a success-rate metric (VPR or RTR); the study has none")
    return pd.concat(frames, ignore_index=True)


def pareto(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Parameters vs the smallest T (or T * L_s) that reaches the threshold; recursive and single-pass
    models as two series; the non-dominated front (fewest parameters and fewest steps) drawn."""
    table = crossings_table(data, opts)
    reached = table[table["reached"]]
    if reached.empty:
        best = "; ".join(f"{r.model} {r.task_variant}: best {r.best:.3f}" for r in table.itertuples())
        raise MissingData(f"no model reaches the threshold ({table['metric'].iloc[0]} >= "
                          f"{table['threshold'].iloc[0]}), so there is no crossing to plot ({best})")
    ylabel = "smallest T reaching the threshold (L_s = L_t)" if opts.pareto_x == "T" else \
        "fewest forward passes (steps run x L_s) reaching the threshold"
    variants = list(dict.fromkeys(reached["task_variant"]))
    _theme()
    fig, axes = _grid(len(variants), w=5.2, h=4.2, cols=3)
    for ax, variant in zip(axes, variants):
        t = table[table["task_variant"] == variant]
        r = t[t["reached"]]
        for name, sel, marker, color in (("recursive (L > 1)", r["L_t"] > 1, "o", sns.color_palette("deep")[0]),
                                         ("single pass (L = 1)", r["L_t"] == 1, "s", sns.color_palette("deep")[3])):
            s = r[sel]
            if len(s):
                ax.scatter(s["n_params"], s["crossing"], marker=marker, s=60, color=color, label=name, zorder=3)
            for row in s.itertuples():
                ax.annotate(row.model, (row.n_params, row.crossing), textcoords="offset points",
                            xytext=(5, 4), fontsize=8)
        front = r[r["pareto"]].sort_values("n_params")
        ax.step(front["n_params"], front["crossing"], where="post", color="0.3", ls=":", lw=1.5,
                label="non-dominated front", zorder=2)
        ax.set_xscale("log")
        ax.set_xlabel("parameters (log scale)")
        ax.set_ylabel(ylabel)
        ys = sorted({int(v) for v in r["crossing"]})
        if len(ys) > 1 and ys[-1] / ys[0] >= 4:
            ax.set_yscale("log", base=2)
        ax.set_yticks(ys, [str(v) for v in ys])
        xs = sorted({int(v) for v in r["n_params"]})
        ax.set_xticks(xs, [fmt_params(v) for v in xs])
        ax.minorticks_off()
        thr, metric = t["threshold"].iloc[0], t["metric"].iloc[0]
        never = t[~t["reached"]]
        title = f"{variant}: {metric.upper()} >= {thr:g}"
        if 0 < len(never) <= 4:
            title += "\nnever reached: " + ", ".join(f"{x.model} (best {x.best:.2f})"
                                                     for x in never.itertuples())
        elif len(never):  # a large sweep: the count and the closest; every model is in threshold_crossings.csv
            top = never.sort_values("best", ascending=tasks.lower_is_better(metric)).iloc[0]
            title += f"\nnever reached by {len(never)} models (closest: {top.model}, best {top.best:.2f})"
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
    unreached = [v for v in dict.fromkeys(table["task_variant"]) if v not in variants]
    note = f"\nnot shown (no model reaches the threshold): {', '.join(unreached)}" if unreached else ""
    fig.suptitle(f"{data.name}: Pareto — parameters vs steps needed to reach the threshold{note}")
    _tight(fig)
    return save(fig, out_dir, "pareto", opts.fmt) + [
        save_table(table.drop(columns="model_key"), out_dir, "threshold_crossings")]


def compute(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Metric vs forward passes per sample (denoising steps run x L_s), one line per model and sampling depth L_s.
    Adaptive-depth points (sampler `confidence+adaptive(0.9)`, L_s its cap) beside them: stars on dotted
    lines at the forward passes they actually spent (mean per example)."""
    panels = []
    for v, m, dv in _by_variant(data, "compute", opts.split):
        if dv["forward_passes"].nunique() < 2:
            continue
        for extra, d in _facets(dv):  # a large sweep: a panel per setting, and per training depth if still large
            parts = [(extra, d)] if d["model_key"].nunique() <= MAX_MODELS else \
                [(", ".join(filter(None, [extra, f"L_t = {lt}"])), g) for lt, g in d.groupby("L_t")]
            panels += [(v, m, e, g) for e, g in parts]
    if not panels:
        raise MissingData("compute needs evaluations at two or more forward-pass budgets T x L_s")
    _theme()
    most = max(g["model_key"].nunique() + g["L_s"].nunique() for *_, g in panels)
    fig, axes = _grid(len(panels), w=_panel_width(6.0, most), h=4.4, cols=2 if len(panels) < 6 else 3)
    markers = "osD^vP*X"
    for ax, (variant, metric, extra, d) in zip(axes, panels):
        names = _names(d)
        first = d.drop_duplicates("model_key")
        models = [k for _, k in sorted(zip(zip(first["K"], first["L_t"], first["model_key"].map(names)),
                                           first["model_key"]))]
        colors = _palette(models)
        ls_values = sorted(d["L_s"].unique())
        for (key, _), g in d.groupby(["model_key", "L_s"]):
            row = g.iloc[0]
            mk = markers[ls_values.index(row["L_s"]) % len(markers)]
            _line(ax, g, "forward_passes", None, colors[key], marker=mk, ls="-" if row["L_s"] == row["L_t"] else "--")
        adaptive = _adaptive_rows(data, variant, metric, d, opts.split)
        adaptive = adaptive[adaptive["model_key"].isin(colors)]
        kind = lambda smp, cap: (smp.split("+", 1)[1], int(cap))  # ('adaptive(0.9)', 3)
        kinds = sorted({kind(smp, cap) for smp, cap in zip(adaptive["sampler"], adaptive["L_s"])})
        for (key, smp, cap), g in adaptive.groupby(["model_key", "sampler", "L_s"]):
            g = g.sort_values("T").drop_duplicates("forward_passes_mean")  # T past the blanks: same run
            mk = ADAPTIVE_MARKERS[kinds.index(kind(smp, cap)) % len(ADAPTIVE_MARKERS)]
            _line(ax, g, "forward_passes_mean", None, colors[key], marker=mk, ls=":")
        if tasks.metric(metric).threshold is not None:
            ax.axhline(tasks.metric(metric).threshold, color="0.5", lw=1, ls=":")
        _x_axis(ax, d["forward_passes"], "forward passes per sample (block passes; at most T x L_s)")
        _rate_ylim(ax, metric)
        ax.set_ylabel(_ylabel(metric))
        _facet_title(ax, variant, extra)
        # one entry per model (its color) and one per sampling depth (its marker), not one per line
        row_of = first.set_index("model_key", drop=False)
        handles = [Line2D([], [], color=colors[k], lw=2, label=_model_label(row_of.loc[k], names)) for k in models]
        handles += [Line2D([], [], color="0.35", marker=markers[i % len(markers)], ls="none", label=f"L_s = {v}")
                    for i, v in enumerate(ls_values)]
        handles += [Line2D([], [], color="0.35", marker=ADAPTIVE_MARKERS[i % len(ADAPTIVE_MARKERS)], ls=":",
                           label=f"{a}, L_s <= {c}")
                    for i, (a, c) in enumerate(kinds)]
        _legend(ax, len(handles), handles=handles, title="model (K x L_t); sampling depth", fontsize=7,
                loc=_loc(metric))
    fig.suptitle(f"{data.name}: compute — metric vs total forward passes (solid: L_s = L_t; stars: adaptive depth, "
                 f"at its mean passes){_seed_note(panels[0][3])}")
    _tight(fig)
    return save(fig, out_dir, "compute", opts.fmt)


def _adaptive_rows(data: StudyData, variant: str, metric: str, d: pd.DataFrame, split: str) -> pd.DataFrame:
    """The adaptive-depth rows (`<sampler>+adaptive(θ)`) of the sampler `d` shows, for one variant and metric."""
    agg = _split_rows(data, "compute", split)
    adaptive = agg["sampler"].str.startswith(f"{d['sampler'].iloc[0]}+adaptive(")
    return agg[adaptive & (agg["task_variant"] == variant) & (agg["metric"] == metric)]


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
    here never do; that draw was a third of a large study's cross-depth figure). label=None: no
    colorbar (the caller draws one for several panels). Returns the mesh."""
    values = np.ma.masked_invalid(m.to_numpy(dtype=float))
    mesh = ax.pcolormesh(values, cmap="viridis", vmin=vmin, vmax=vmax, linewidths=0.5, edgecolors="white")
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set(xlim=(0, m.shape[1]), ylim=(m.shape[0], 0))
    if label is not None:
        ax.figure.colorbar(mesh, ax=ax, label=label).outline.set_linewidth(0)
    ax.set_xticks(np.arange(m.shape[1]) + 0.5, [str(c) for c in m.columns])
    ax.set_yticks(np.arange(m.shape[0]) + 0.5, [str(i) for i in m.index], va="center")
    ax.grid(False)
    mesh.update_scalarmappable()
    for (i, j), face in zip(np.ndindex(*m.shape), mesh.get_facecolors()):
        if values.mask is np.ma.nomask or not values.mask[i, j]:
            dark = sns.utils.relative_luminance(face) <= 0.408  # seaborn's rule: white text on dark cells
            ax.text(j + 0.5, i + 0.5, f"{values[i, j]:.2f}", color="w" if dark else ".15", ha="center", va="center")
    return mesh


def cross_depth(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Heatmap of the metric over training depth L_t x sampling depth L_s at one T."""
    families = []
    for variant, metric, d in _by_variant(data, "cross-depth", opts.split):
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
    _theme()
    panel_w = max(4.8, 0.75 * max(m.shape[1] for *_, m in mats) + 2.5)
    fig, axes = _grid(len(mats), w=panel_w, h=max(3.4, 0.6 * max(m.shape[0] for *_, m in mats) + 2.0), cols=2)
    # what else (beyond K, schedule, loss) tells the families of a variant apart, from one model of each
    names: dict[str, str] = {}
    for variant in {v for v, *_ in mats}:
        names.update(differing([key[-1] for v, _, key, _ in mats if v == variant],
                               (*SHAPE_FIELDS, "train.schedule", "train.loss")))
    paths, used = [], set()
    # panels of one rate metric share the 0..1 scale: one colorbar beside the first row serves them all
    # (a colorbar per panel was a third of a large study's cross-depth figure)
    shared = len(mats) > 1 and len({metric for _, metric, *_ in mats}) == 1 and tasks.metric(mats[0][1]).unit
    for ax, (variant, metric, (K, schedule, loss, width, rep), m) in zip(axes, mats):
        rate = tasks.metric(metric).unit
        mesh = _heatmap(ax, m, vmin=0 if rate else None, vmax=1 if rate else None,
                        label=None if shared else tasks.metric(metric).label)
        for i, lt in enumerate(m.index):  # outline the cells sampled at the training depth
            if lt in list(m.columns):
                ax.add_patch(plt.Rectangle((list(m.columns).index(lt), i), 1, 1, fill=False, ec="red", lw=2))
        ax.set_xlabel("sampling depth L_s (loops per step)")
        ax.set_ylabel("training depth L_t")
        extra = f", {names[rep]}" if names[rep] else ""
        # wrapped to the panel (about 11 characters of 10 pt text per inch): long family names ran
        # into the next column's title
        title = textwrap.fill(f"{variant}, K = {K}, {schedule} schedule, {loss} loss{extra}", int(panel_w * 11))
        ax.set_title(f"{title}\nT = {T}; red: L_s = L_t", fontsize=10)
        name = f"cross_depth_K{K}_{schedule}_{loss}_d{width}_T{T}"
        name = next(f"{name}_{i}" for i in range(1, len(mats) + 2) if f"{name}_{i}" not in used) \
            if name in used else name  # two families with one name: number the later ones
        used.add(name)
        paths.append(save_table(m.reset_index(), out_dir, name))
    if shared:
        cax = axes[min(1, len(axes) - 1)].inset_axes([1.05, 0.0, 0.05, 1.0])
        fig.colorbar(mesh, cax=cax, label=f"{tasks.metric(mats[0][1]).label}, every panel"
                     ).outline.set_linewidth(0)
    fig.suptitle(f"{data.name}: cross-depth — train at L_t, sample at L_s (T = {T})")
    _tight(fig)
    return save(fig, out_dir, "cross_depth", opts.fmt) + paths


def mask_rate(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Sudoku metric vs T per L, one panel per mask rate (the paper's 25x25 figure)."""
    agg = _split_rows(data, "mask-rate", opts.split)
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
    _needs_T(pd.concat([g for *_, g in panels]), "mask-rate")
    _theme()
    fig, axes = _grid(len(panels), cols=3)
    labels = {}
    for n, rate, g in panels:  # one label per model; the mask rate is the panel's title
        names = _names(g, (*SHAPE_FIELDS, "task.mask_rate"))
        labels.update({k: _model_label(gl.iloc[0], names) for k, gl in g.groupby("model_key")})
    colors = _palette(sorted(set(labels.values())))
    for ax, (n, rate, g) in zip(axes, panels):
        for key, gl in sorted(g.groupby("model_key"), key=lambda kg: labels[kg[0]]):
            _line(ax, gl, "T", labels[key], colors[labels[key]])
        _x_axis(ax, g["T"], "denoising steps T")
        _rate_ylim(ax, "vpr")
        ax.set_ylabel(_ylabel("vpr"))
        ax.set_title(f"sudoku {int(n)}x{int(n)}, {round(100 * rate)}% of cells masked")
        ax.legend(title="model (K x L), L_s = L_t", fontsize=8, loc="lower right")
    fig.suptitle(f"{data.name}: mask rate — VPR vs T per depth L{_seed_note(panels[0][2])}")
    _tight(fig)
    return save(fig, out_dir, "mask_rate", opts.fmt)


def _ablation(data: StudyData, out_dir: str, opts: Options, axis: str, name: str, what: str) -> list[str]:
    """Metric vs T, one line per value of `axis` (loss or schedule), one panel per recursive model."""
    other = "schedule" if axis == "loss" else "loss"
    panels, have = [], []
    for variant, metric, d in _by_variant(data, name, opts.split):
        d = d[(d["L_t"] > 1) & (d["L_s"] == d["L_t"])]
        for key, g in d.groupby(["K", "L_t", other, "d_model"]):
            have.append(f"{variant} {_label(key[0], key[1])}: {axis} {sorted(g[axis].unique())}")
            if g[axis].nunique() >= 2:
                panels.append((variant, metric, key, g))
    if not panels:
        raise MissingData(f"{name} needs one recursive model (L > 1) trained with two or more {axis} values, other "
                          f"settings equal (have {'; '.join(have) or 'no recursive model evaluated at L_s = L_t'})")
    _theme()
    fig, axes = _grid(len(panels), cols=3)
    for ax, (variant, metric, (K, L, oth, width), g) in zip(axes, panels):
        # one line per model: the label names the fields that differ (the axis, and any other, e.g. truncate_k)
        names = _names(g)
        lines = sorted(g.groupby("model_key"), key=lambda kg: names[kg[0]])
        colors = _palette([k for k, _ in lines])
        for key, gl in lines:
            _line(ax, gl, "T", names[key] or _model_label(gl.iloc[0], names), colors[key])
        _x_axis(ax, g["T"], "denoising steps T")
        _rate_ylim(ax, metric)
        ax.set_ylabel(_ylabel(metric))
        ax.set_title(f"{variant}, {_label(K, L)}, {other} {oth}\nL_s = L_t = {L}", fontsize=10)
        ax.legend(title=what, fontsize=8, loc=_loc(metric))
    fig.suptitle(f"{data.name}: {what} ablation{_seed_note(panels[0][3])}")
    _tight(fig)
    return save(fig, out_dir, name, opts.fmt)


def losses(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Loss over loops: ALL vs FINAL vs WEIGHTED vs TRUNCATED."""
    return _ablation(data, out_dir, opts, "loss", "losses", "loss over loops")


def schedules(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Training-depth schedule: fixed, stochastic, curriculum, reverse curriculum."""
    return _ablation(data, out_dir, opts, "schedule", "schedules", "training-depth schedule")


def training_curves(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Training loss vs step, one line per model (mean over seeds, band min..max), one panel per task variant."""
    h = data.history
    if h is None or h.empty:
        raise MissingData("training curves need the history table (no rows in history/)")
    panels = [(v, extra, g) for v in sorted(h["task_variant"].unique())
              for extra, g in _facets(h[h["task_variant"] == v])]
    _theme()
    fig, axes = _grid(len(panels), w=_panel_width(5.6, max(g["model_key"].nunique() for *_, g in panels)), h=4.0,
                      cols=3)
    for ax, (variant, extra, g) in zip(axes, panels):
        names = _names(g)
        first = g.drop_duplicates("model_key").set_index("model_key", drop=False)
        keys = sorted(first.index, key=lambda k: (first.at[k, "K"], first.at[k, "L_t"], names[k]))
        colors = _palette(keys)
        seeds = g.groupby("model_key")["run_id"].nunique()
        curves = g.groupby(["model_key", "step"])["train_loss"].agg(["mean", "min", "max"]).reset_index()
        by_model = dict(list(curves.groupby("model_key")))
        for key in keys:  # legend order: by K, L_t, then what else tells them apart
            curve = by_model[key].sort_values("step")
            n = int(seeds[key])
            ax.plot(curve["step"], curve["mean"], color=colors[key],
                    label=_model_label(first.loc[key], names) + (f" ({n} seeds)" if n > 1 else ""))
            if n > 1:
                _band(ax, curve["step"].to_numpy(dtype=float), curve["min"].to_numpy(dtype=float),
                      curve["max"].to_numpy(dtype=float), colors[key])
        ax.set_xlabel("training step")
        ax.set_ylabel("training loss (ELBO, mean over loops)")
        _facet_title(ax, variant, extra)
        _legend(ax, len(keys), title="model (K x L_t)", fontsize=8, loc="upper right")
    fig.suptitle(f"{data.name}: training curves")
    _tight(fig)
    return save(fig, out_dir, "training_curves", opts.fmt)


def text8(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """The text8 NLL / BPC / perplexity table, with a bar chart of NLL (training curves: `training-curves`)."""
    table = text8_table(aggregated(data), split=opts.split)
    paths = [save_table(table, out_dir, "text8_table")]
    _theme()
    labels = [f"{m}, L_s = {ls}" for m, ls in zip(table["model"], table["L_s"])]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(table) + 2), 4))
    colors = [sns.color_palette("deep")[3] if lt == 1 else sns.color_palette("deep")[0] for lt in table["L_t"]]
    bars = ax.bar(labels, table["nll"], color=colors)
    for b, nll, bpc, ppl in zip(bars, table["nll"], table["bpc"], table["ppl"]):
        ax.annotate(f"{nll:.3f} nats\n{bpc:.3f} bpc\nppl {ppl:.1f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=7, textcoords="offset points", xytext=(0, 2))
    ax.set_ylabel("NLL bound (nats / char), lower is better")
    ax.set_xlabel("model (K x L_t) and sampling depth L_s; red: single pass")
    ax.set_ylim(0, table["nll"].max() * 1.3)
    ax.set_title(f"{data.name}: text8 likelihood")
    _tight(fig)
    paths = save(fig, out_dir, "text8_nll", opts.fmt) + paths
    return paths


def effective_params(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """What a loop is worth: each looped (K x L) placed on its family's single-pass metric-vs-parameters
    curve (monotone fit at each T) as m x its parameters, and m = L^beta across L.

    Left: the single-pass models (squares) and their monotone fit per T; each looped model drawn at the
    parameters it performs like, with its bootstrap interval (seeds and examples); a model beyond the
    single-pass range as a triangle at the range's edge (not extrapolated); each looped model is named
    once, beside its point at its largest T. Right: m against L on log
    axes with the fitted L^beta and its interval. Tables effective_params.csv and effective_beta.csv
    beside it."""
    from analysis.effective import ABOVE, IN_RANGE, cached, effective_tables

    eff = cached(data, opts.split)
    table, beta = effective_tables(eff)
    panels = list(eff.table.groupby(["task_variant", "family"], sort=True))
    _theme()
    fig, axes = plt.subplots(len(panels), 2, figsize=(12.5, 4.6 * len(panels) + 0.6), squeeze=False)
    for (ax, bx), ((variant, fam), t) in zip(axes, panels):
        c = eff.curves[(eff.curves["task_variant"] == variant) & (eff.curves["family"] == fam)]
        Ts = sorted(t["T"].unique())
        colors = dict(zip(Ts, sns.color_palette("viridis", max(len(Ts), 1))))
        Ls = sorted(t["L"].unique())
        markers = dict(zip(Ls, "oD^vP*X"))
        metric = t["metric"].iloc[0]
        last_T = t.groupby("model")["T"].max()
        for T in Ts:
            ct = c[c["T"] == T].sort_values("n_params")
            ax.plot(ct["n_params"], ct["fit"], color=colors[T], lw=1.5, label=f"T = {T}: single pass, monotone fit")
            ax.scatter(ct["n_params"], ct["value"], marker="s", color=colors[T], s=36, zorder=3)
            tt = t[t["T"] == T]
            # one artist per (T, L) and per side out of range, not one per model (a large sweep has hundreds)
            for L, r in tt[tt["where"] == IN_RANGE].groupby("L"):
                lo = np.where(np.isfinite(r["m_low"]), r["m_low"] * r["n_params"], r["equiv_params"])
                hi = np.where(np.isfinite(r["m_high"]), r["m_high"] * r["n_params"], ct["n_params"].max())
                ax.errorbar(r["equiv_params"], r["value"], xerr=[r["equiv_params"] - lo, hi - r["equiv_params"]],
                            fmt=markers[L], color=colors[T], mec="k", ms=7, capsize=3, zorder=4)
            edge = lambda where: ct["n_params"].max() if where == ABOVE else ct["n_params"].min()  # out of range
            for where, r in tt[tt["where"] != IN_RANGE].groupby("where"):
                ax.scatter([edge(where)] * len(r), r["value"], marker=">" if where == ABOVE else "<",
                           color=colors[T], edgecolor="k", s=70, zorder=4)
            # each model named once, at its largest T (named at every T, a large sweep's panel is a
            # block of overlapping labels)
            for r in tt[tt["T"] == last_T[tt["model"]].to_numpy()].itertuples():
                ax.annotate(r.model, (r.equiv_params if r.where == IN_RANGE else edge(r.where), r.value),
                            textcoords="offset points", xytext=(5, -10), fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("parameters (single-pass models; looped models at the parameters they perform like)")
        ax.set_ylabel(tasks.metric(metric).label)
        _rate_ylim(ax, metric)
        ax.set_title(f"{variant}{' ' + fam if fam else ''}: metric vs parameters, L_s = L_t", fontsize=10)
        ax.legend(fontsize=7, loc=_loc(metric))
        ok = t[t["where"] == IN_RANGE]
        for i, T in enumerate(Ts):
            g = ok[ok["T"] == T]
            if len(g):
                lo = (g["m"] - g["m_low"]).clip(lower=0)
                hi = (g["m_high"] - g["m"]).replace(np.inf, np.nan).fillna(0).clip(lower=0)
                dodge = 1 + 0.03 * (i - (len(Ts) - 1) / 2)  # the T of one L side by side
                bx.errorbar(g["L"] * dodge, g["m"], yerr=[lo, hi], fmt="o", color=colors[T], capsize=3,
                            label=f"T = {T}")
        b = beta[(beta["task_variant"] == variant) & (beta["family"] == fam) & (beta["T"] == "all")].iloc[0]
        if np.isfinite(b["beta"]):
            xs = np.linspace(1, max(Ls) * 1.1, 50)
            bx.plot(xs, xs ** b["beta"], color="0.2", lw=1.5,
                    label=f"m = L^beta, beta = {b['beta']:.2f} [{b['beta_low']:.2f}, {b['beta_high']:.2f}]")
            if np.isfinite(b["beta_low"]) and np.isfinite(b["beta_high"]):
                bx.fill_between(xs, xs ** b["beta_low"], xs ** b["beta_high"], color="0.5", alpha=0.2, lw=0)
        bx.plot([1, max(Ls) * 1.1], [1, max(Ls) * 1.1], color="0.6", ls=":", lw=1, label="m = L (a loop = a layer)")
        bx.set_xscale("log")
        bx.set_yscale("log")
        bx.set_xticks(Ls, [str(v) for v in Ls])
        bx.minorticks_off()
        y0, y1 = bx.get_ylim()
        ticks = [v for v in (0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 10, 15, 20, 30, 50, 100) if y0 <= v <= y1]
        bx.set_yticks(ticks, [f"{v:g}" for v in ticks])
        bx.set_xlabel("loops L (sampled at L_s = L)")
        bx.set_ylabel("parameter multiplier m (95% bootstrap interval)")
        out = int(b["out_of_range"])
        bx.set_title("what a loop is worth" + (f" ({out} point{'s' if out > 1 else ''} beyond the single-pass range left out)"
                                               if out else ""), fontsize=10)
        bx.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{data.name}: effective parameters of recursion")
    _tight(fig)
    return save(fig, out_dir, "effective_params", opts.fmt) + [
        save_table(table, out_dir, "effective_params"), save_table(beta, out_dir, "effective_beta")]


FIGURES = {
    "iso-param": iso_param,
    "iso-flop": iso_flop,
    "pareto": pareto,
    "compute": compute,
    "cross-depth": cross_depth,
    "mask-rate": mask_rate,
    "losses": losses,
    "schedules": schedules,
    "text8": text8,
    "training-curves": training_curves,
    "effective-params": effective_params,
}


def _tuning(data: StudyData, out_dir: str, opts: Options = Options()) -> list[str]:
    """Optimization history and parameter importances of results/<study>/optuna.* (written by `study tune`)."""
    from analysis.tuning import tuning

    return tuning(data, out_dir, opts)


FIGURES["tuning"] = _tuning
