"""Every figure the report draws can be read: no legend covers a panel (its own lines or a neighbour's), no
text is smaller than 8 points, and no y label is taller than its panel (it ran off the figure); pareto's
labels never overprint, each line style drawn is in its panel's legend, lines of different models have
different colours (colour-blind safe), and a title and an axis say the same of the bands.

Run: pytest tests/test_figures_readable.py -q   (the analysis tests' stores, real Parquet; ~30 s)
"""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from analysis import figures as F  # noqa: E402
from analysis import plotting as P  # noqa: E402
from analysis.load import MissingData, load_study  # noqa: E402
from store import Store  # noqa: E402
from tests.test_analysis_data import TS, _write, eval_row, run_row, write_all  # noqa: E402

MIN_POINTS = 8


def write_first(root: str) -> None:
    """A first study as the README's: (1 x 1), (1 x 2) and (2 x 1) reaching VPR 0.95 at the same T, two seeds,
    (1 x 2) sampled at L_s = 1 too; (1 x 1) and (1 x 2) have the same parameters (one point in pareto)."""
    vals = {(1, 1): [0.5, 0.96, 0.97, 0.98], (1, 2): [0.6, 0.97, 0.98, 0.99], (2, 1): [0.7, 0.96, 0.99, 0.99]}
    for (K, L), vs in vals.items():
        for seed in (0, 1):
            run = run_row("first", "sudoku", {"n": 4, "mask_rate": 0.5}, K, L, seed=seed)
            ev = [eval_row(run, T, L, "vpr", v - 0.01 * seed) for T, v in zip(TS, vs)]
            ev += [eval_row(run, T, 1, "vpr", v - 0.2) for T, v in zip(TS, vs) if L > 1]
            _write(Store(root, "first"), run, ev)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """{figure name: its Figure, laid out as it is saved}, for every figure the two stores support."""
    root = str(tmp_path_factory.mktemp("results"))
    write_all(root)
    write_first(root)
    figs, mp = {}, pytest.MonkeyPatch()
    for study in ("paper", "ablation", "first"):
        data = load_study(root, study)
        for name in F.FIGURES:
            mp.setattr(F, "save", lambda fig, out_dir, fname, fmt: figs.setdefault(f"{study}/{name}", fig) and [])
            try:
                F.FIGURES[name](data, str(tmp_path_factory.mktemp("out")), F.Options())
            except MissingData:
                pass
    mp.undo()
    assert {"paper/iso-param", "paper/compute", "paper/training-curves", "paper/iso-flop", "paper/mask-rate",
            "paper/pareto", "paper/effective-params", "first/pareto", "first/compute"} <= set(figs), sorted(figs)
    for fig in figs.values():
        fig.set_dpi(P.PNG_DPI)
        fig.canvas.draw()
    yield figs
    figs.clear()  # the figures are not pyplot's (analysis.plotting.figure): nothing to close, dropped they are freed


def panels(fig):
    return [ax for ax in fig.axes if ax.get_visible() and ax.axison]


def test_no_legend_covers_a_panel(drawn):
    for name, fig in drawn.items():
        r = fig.canvas.get_renderer()
        for ax in panels(fig):
            leg = ax.get_legend()
            if leg is None:
                continue
            box = leg.get_window_extent(r)
            for other in panels(fig):
                assert not box.overlaps(other.get_window_extent(r)), \
                    f"{name}: the legend of {ax.get_title()!r} lies over the panel {other.get_title()!r}"


def test_every_text_is_readable(drawn):
    from matplotlib.text import Text

    for name, fig in drawn.items():
        for t in fig.findobj(Text):
            if t.get_visible() and t.get_text().strip():
                assert t.get_fontsize() >= MIN_POINTS, f"{name}: {t.get_text()!r} at {t.get_fontsize()} pt"


def test_no_y_label_is_taller_than_its_panel(drawn):
    for name, fig in drawn.items():
        r = fig.canvas.get_renderer()
        for ax in panels(fig):
            label = ax.yaxis.label
            if label.get_visible() and label.get_text():
                assert label.get_window_extent(r).height <= ax.get_window_extent(r).height, \
                    f"{name}: the y label {label.get_text()!r} runs past its panel"


def test_pareto_reads_at_a_glance(drawn):
    from matplotlib.text import Annotation

    for name in ("paper/pareto", "first/pareto"):
        fig = drawn[name]
        r = fig.canvas.get_renderer()
        for ax in panels(fig):
            boxes = [(a.get_text(), a.get_window_extent(r)) for a in ax.findobj(Annotation)]
            assert len(boxes) >= 3
            for i, (ta, a) in enumerate(boxes):
                for tb, b in boxes[i + 1:]:
                    assert not a.overlaps(b), f"{name}: the labels {ta} and {tb} overprint"
            # the recursive circle over the single-pass square, and smaller: both seen where they meet
            points = {c.get_label(): c for c in ax.collections if c.get_label().startswith(("recursive", "single"))}
            rec, single = points["recursive (L > 1)"], points["single pass (L = 1)"]
            assert rec.get_zorder() > single.get_zorder() and rec.get_sizes()[0] < single.get_sizes()[0]
            # the front is a line one can see, in the panel and in the legend
            (front,) = [ln for ln in ax.get_lines() if ln.get_label() == "non-dominated front"]
            xy = ax.transData.transform(front.get_xydata())
            assert (xy.max(axis=0) - xy.min(axis=0)).max() > 20
            (handle,) = [h for h, t in zip(ax.get_legend().legend_handles, ax.get_legend().get_texts())
                         if t.get_text() == "non-dominated front"]
            assert handle.get_linestyle() not in ("None", "", " ") and handle.get_linewidth() >= 1
            lo, hi = sorted(ax.get_ylim())
            assert sum(lo <= t <= hi for t in ax.get_yticks()) >= 2, f"{name}: one y tick"
        assert "steps needed" in fig._suptitle.get_text()


def test_pareto_of_forward_passes_says_so(tmp_path):
    write_first(str(tmp_path))
    got = F.FIGURES["pareto"](load_study(str(tmp_path), "first"), None, F.Options(pareto_x="forward_passes"))
    assert "forward passes needed" in got[0]._suptitle.get_text()


def test_every_line_style_is_in_the_legend_and_each_model_has_its_own_colour(drawn):
    import seaborn as sns
    from matplotlib.colors import to_hex

    safe = {to_hex(c) for c in sns.color_palette("colorblind")}
    for name in ("first/compute", "paper/compute", "paper/iso-param"):
        for ax in panels(drawn[name]):
            leg = ax.get_legend()
            handles = leg.legend_handles
            drawn_styles = {ln.get_linestyle() for ln in ax.get_lines() if ln.get_linestyle() != "None"}
            assert drawn_styles <= {h.get_linestyle() for h in handles}, name
            models = [to_hex(h.get_color()) for h, t in zip(handles, leg.get_texts()) if t.get_text().startswith("(")]
            assert len(models) >= 2 and len(set(models)) == len(models) and set(models) <= safe, (name, models)
    assert "--" in {ln.get_linestyle() for ax in panels(drawn["first/compute"]) for ln in ax.get_lines()}


def test_the_title_and_the_axis_say_the_same_of_the_bands(drawn):
    for name in ("first/iso-param", "first/compute", "paper/iso-param"):
        fig = drawn[name]
        title = fig._suptitle.get_text().replace("\n", " ")
        labels = [ax.get_ylabel().replace("\n", " ") for ax in panels(fig) if ax.get_ylabel()]  # outer panels'
        assert labels and all("band: 95% CI" in t for t in labels), (name, labels)
        if "seeds" in title:
            assert "band: 95% CI" in title and "bars: +-1 s.d." in title, title
