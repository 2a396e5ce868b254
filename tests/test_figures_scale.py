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
        F.plt.close(fig)
        return []

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
    # (3 models each); the legend: 3 models + 3 sampling depths, not 3 x 3 lines
    assert len(panels) == 3 * len(LRS), panels
    assert sorted(t.split("\n")[1] for t, _ in panels) == sorted(f"lr={lr:g}, L_t = {L}" for lr in LRS for L in (1, 2, 3))
    assert all(n == 3 + 3 for _, n in panels), panels


def test_a_small_study_keeps_one_panel(tmp_path, monkeypatch):
    gpath = tmp_path / "narrow.yaml"
    gpath.write_text(GRID.replace("study: wide", "study: narrow").replace(f"lr: {LRS}", "lr: [0.001, 0.002]")
                     .replace("K: [1, 2, 3]", "K: [1]").replace("L: [1, 2, 3]", "L: [1, 2]"))
    build(str(tmp_path / "results"), str(gpath), workers=2)
    panels = drawn(monkeypatch, load_study(str(tmp_path / "results"), "narrow"), "iso-param")
    assert len(panels) == 1 and panels[0][1] == 4  # (1 x 1), (1 x 2) at two lr: 4 lines, one panel


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
    ticks = F._thin(values, 9, log=True)
    assert ticks[0] == 1 and ticks[-1] == 160 and len(ticks) <= 10 and set(ticks) <= set(values)
    assert F._thin([1, 2, 4, 8], 9, log=True) == [1, 2, 4, 8]
    gaps = [b / a for a, b in zip(ticks, ticks[1:])]
    assert min(gaps[:-1]) >= 1.5, ticks  # no two neighbours crowded (the last may sit closer)
