"""Every figure the report draws can be read: no legend covers a panel (its own lines or a neighbour's), no
text is smaller than 8 points, and no y label is taller than its panel (it ran off the figure).

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
from tests.test_analysis_data import write_all  # noqa: E402

MIN_POINTS = 8


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """{figure name: its Figure, laid out as it is saved}, for every figure the two stores support."""
    root = str(tmp_path_factory.mktemp("results"))
    write_all(root)
    figs, mp = {}, pytest.MonkeyPatch()
    for study in ("paper", "ablation"):
        data = load_study(root, study)
        for name in F.FIGURES:
            mp.setattr(F, "save", lambda fig, out_dir, fname, fmt: figs.setdefault(f"{study}/{name}", fig) and [])
            try:
                F.FIGURES[name](data, str(tmp_path_factory.mktemp("out")), F.Options())
            except MissingData:
                pass
    mp.undo()
    assert {"paper/iso-param", "paper/compute", "paper/training-curves", "paper/iso-flop", "paper/mask-rate",
            "paper/pareto", "paper/effective-params"} <= set(figs), sorted(figs)
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
