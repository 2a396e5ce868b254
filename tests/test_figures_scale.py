"""Figures of a large sweep stay readable, and drawing them in worker processes gives the same report.

A sweep over shape and learning rate put every model in one panel (a 100-model store drew a
400-entry legend over the compute figure, and thirty iso-FLOP panels in one row). Panels now split
by the fields that tell their models apart once they would hold more than MAX_MODELS models.

Run: pytest tests/test_figures_scale.py -q   (a real store written by the store's own writer; ~1 min)
"""
from __future__ import annotations

import os
import re
import sys

import pytest
from typer.testing import CliRunner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from analysis import figures as F  # noqa: E402
from analysis import plotting as P  # noqa: E402
from analysis.load import load_study  # noqa: E402
from benchmarks.store_scale import build  # noqa: E402

LRS = [0.001, 0.002, 0.003]
GRID = f"""
study: wide
task: {{name: sudoku, n: 4, mask_rate: 0.5}}
model: {{d_model: 16, n_heads: 2}}
train: {{steps: 10, batch_size: 8}}
eval: {{T: [1, 2, 4], L_s: [1, 2, 3], n_examples: 200, n_samples_kept: 2}}
axes:
  K: [1, 2, 3]
  L: [1, 2, 3]
  lr: {LRS}
  seed: [0, 1]
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wide")
    gpath = tmp / "wide.yaml"
    gpath.write_text(GRID)
    build(str(tmp / "results"), str(gpath), workers=4)
    return str(tmp / "results")


def drawn(monkeypatch, data, name):
    """The figure `name` draws: (title of every visible panel, its number of legend entries)."""
    got = []

    def keep(fig, out_dir, fname, fmt):
        for ax in fig.axes:
            if ax.get_visible() and ax.get_title():
                leg = ax.get_legend()
                got.append((ax.get_title(), len(leg.get_texts()) if leg else 0))
        return []  # the figure is not pyplot's (analysis.plotting.figure): nothing to close

    monkeypatch.setattr(F, "save", keep)
    F.FIGURES[name](data, "unused", F.Options())
    return got


def test_iso_param_splits_a_panel_of_many_models_by_what_else_differs(store, monkeypatch):
    data = load_study(store, "wide")
    panels = drawn(monkeypatch, data, "iso-param")
    # 9 models per K (3 L x 3 lr) > MAX_MODELS: one panel per (K, lr), its three L as lines
    assert len(panels) == 3 * len(LRS), panels
    for K in (1, 2, 3):
        titles = [t for t, _ in panels if f"K = {K}" in t]
        assert sorted(t.split("\n")[1] for t in titles) == [f"lr={lr:g}" for lr in LRS], titles
    assert all(n == 3 for _, n in panels)


def test_compute_has_a_legend_entry_per_model_and_depth_not_per_line(store, monkeypatch):
    data = load_study(store, "wide")
    panels = drawn(monkeypatch, data, "compute")
    # 27 models > MAX_MODELS: a panel per lr, 9 models each, still too many: per lr and training depth
    # (3 models each); the legend: 3 models + 3 sampling depths + the two line styles (solid: L_s = L_t,
    # dashed) + the threshold's dotted line, not 3 x 3 lines
    assert len(panels) == 3 * len(LRS), panels
    assert sorted(t.split("\n")[1] for t, _ in panels) == sorted(f"lr={lr:g}, L_t = {L}" for lr in LRS for L in (1, 2, 3))
    assert all(n == 3 + 3 + 2 + 1 for _, n in panels), panels


def test_a_small_study_keeps_one_panel(tmp_path, monkeypatch):
    gpath = tmp_path / "narrow.yaml"
    gpath.write_text(GRID.replace("study: wide", "study: narrow").replace(f"lr: {LRS}", "lr: [0.001, 0.002]")
                     .replace("K: [1, 2, 3]", "K: [1]").replace("L: [1, 2, 3]", "L: [1, 2]"))
    build(str(tmp_path / "results"), str(gpath), workers=2)
    panels = drawn(monkeypatch, load_study(str(tmp_path / "results"), "narrow"), "iso-param")
    assert len(panels) == 1 and panels[0][1] == 4  # (1 x 1), (1 x 2) at two lr: 4 lines, one panel


@pytest.mark.slow  # two whole reports of 108 runs; workers also: test_imports.py's report with workers
def test_figures_drawn_by_two_workers_are_the_report_one_process_writes(store, tmp_path):
    from study.cli import app

    outs = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        r = CliRunner().invoke(app, ["report", "--study", "wide", "--figure", "all", "--results", store,
                                     "--out", str(out), "--jobs", str(jobs)])
        assert r.exit_code == 0, r.output
        report = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "<time>", (out / "report.md").read_text())
        outs[jobs] = (r.output.replace(str(out), "OUT"), sorted(os.listdir(out)), report.replace(str(out), "OUT"))
    assert outs[1][1] == outs[2][1]  # the same files
    assert {"iso_param.png", "compute.png", "effective_params.png", "report.md"} <= set(outs[2][1])
    assert "effective parameters" in outs[2][2].lower()  # computed in a worker, its table in the report
    assert outs[1][0] == outs[2][0]  # the same lines printed, in the same order
    assert outs[1][2] == outs[2][2]  # the same report (but the minute it was written)


def test_tick_values_are_thinned_to_about_nine_spread_over_the_axis():
    """A compute axis of T x L_s values (1, 2, 3, 4, 6, 8, 12, 16, ... 160) printed every one of them
    on top of each other; now at most about nine, first and last kept, spread on the log axis."""
    values = sorted({t * ls for t in (1, 2, 4, 8, 16, 24, 32, 40) for ls in (1, 2, 3, 4)})
    ticks = P.thin(values, 9, log=True)
    assert ticks[0] == 1 and ticks[-1] == 160 and len(ticks) <= 10 and set(ticks) <= set(values)
    assert P.thin([1, 2, 4, 8], 9, log=True) == [1, 2, 4, 8]
    gaps = [b / a for a, b in zip(ticks, ticks[1:])]
    assert min(gaps[:-1]) >= 1.5, ticks  # no two neighbours crowded (the last may sit closer)


def test_bands_and_seed_bars_keep_each_lines_color():
    """_line gathers an axes' bands and bars into one artist each: every band and bar keeps its own
    line's color (two colors once read as one (color, alpha) pair: every band took the first)."""
    import matplotlib
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd
    from matplotlib.collections import LineCollection, PolyCollection

    from analysis.plotting import flush_bands as _flush_bands, line as _line

    fig, ax = plt.subplots()
    red, blue = (0.8, 0.1, 0.1), (0.1, 0.2, 0.8)
    for color, base in ((red, 0.2), (blue, 0.5)):
        g = pd.DataFrame({"T": [1, 2, 4], "value": [base, base + 0.1, base + 0.2], "split": "test",
                          "ci_low": [base - 0.05] * 3, "ci_high": [base + 0.25] * 3, "n_seeds": 3,
                          "seed_sd": [0.01, np.nan, 0.02]})
        _line(ax, g, "T", None, color)
    _flush_bands(fig)
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    bars = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(bands) == 1 and len(bars) == 1
    assert np.allclose(bands[0].get_facecolors(), [(*red, 0.15), (*blue, 0.15)])
    assert np.allclose(bars[0].get_colors(), [(*red, 1)] * 3 + [(*blue, 1)] * 3)
    lo, hi = ax.get_ylim()
    assert lo <= 0.15 and hi >= 0.75  # the limits hold the bands, not only the lines
    plt.close(fig)
    assert matplotlib.get_backend().lower() == "agg"


def test_a_rate_panel_leaves_its_y_labels_to_a_left_neighbour_of_the_same_metric():
    import matplotlib.pyplot as plt

    from analysis.plotting import grid as _grid, outer_y_labels as _outer_y_labels, rate_ylim as _rate_ylim

    fig, axes = _grid(6, cols=3)  # two rows of three
    for i, ax in enumerate(axes):
        metric = "rtr" if i == 5 else "vpr"
        _rate_ylim(ax, metric)
        ax.set_ylabel(metric)
    _outer_y_labels(fig)
    shown = [ax.get_ylabel() for ax in axes]
    assert shown == ["vpr", "", "", "vpr", "", "rtr"]  # each row's first; a different metric keeps its own
    ticks = [any(t.get_visible() for t in ax.get_yticklabels()) for ax in axes]
    assert ticks == [True, False, False, True, False, True]
    plt.close(fig)


def test_a_line_refuses_two_rows_at_one_x_and_draws_in_x_order():
    import matplotlib.pyplot as plt
    import pandas as pd
    import pytest

    from analysis.plotting import line as _line

    fig, ax = plt.subplots()
    g = pd.DataFrame({"T": [4, 1, 2], "value": [0.9, 0.1, 0.5], "ci_low": 0.0, "ci_high": 1.0, "n_seeds": 1,
                      "seed_sd": 0.0, "split": "test"})
    _line(ax, g, "T", "a", "C0")
    assert list(ax.lines[0].get_xdata()) == [1, 2, 4] and list(ax.lines[0].get_ydata()) == [0.1, 0.5, 0.9]
    with pytest.raises(ValueError, match="two rows at one T"):
        _line(ax, pd.concat([g, g.iloc[:1]]), "T", "b", "C1")
    plt.close(fig)
