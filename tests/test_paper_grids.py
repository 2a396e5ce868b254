"""The paper's studies as grids: paper scale, paper parameter counts. Run: pytest tests/test_paper_grids.py"""
from __future__ import annotations

import functools
import os

import pytest

from study.spec.grid import load_grid
from tasks import TASKS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# parameters of a K-layer model at d = 384, as the paper reports them
PAPER_PARAMS = {3: 5.5e6, 6: 10.6e6, 15: 26.7e6, 30: 53.1e6}
# grid file -> task it needs; one grid per experiment of the paper
PAPER_GRIDS = {
    "iso_flop_sudoku.yaml": "sudoku", "iso_param_sudoku.yaml": "sudoku", "sudoku25_mask.yaml": "sudoku",
    "cross_depth.yaml": "sudoku", "compute_budget.yaml": "sudoku", "loss_variants.yaml": "sudoku",
    "depth_schedules.yaml": "sudoku", "iso_flop_countdown.yaml": "countdown",
    "iso_param_countdown.yaml": "countdown", "text8.yaml": "text8",
}


def _grid(name: str):
    task = PAPER_GRIDS[name]
    # every paper grid's task must be registered: a missing task is a failure, never a skip
    assert task in TASKS, f"task {task!r} of grids/{name} is not registered (tasks/__init__.py TASKS)"
    return _load(name)


@functools.lru_cache(maxsize=None)
def _load(name: str):
    return load_grid(os.path.join(ROOT, "grids", name))


@pytest.mark.parametrize("name", sorted(PAPER_GRIDS))
def test_paper_grid_is_at_paper_scale(name):
    g = _grid(name)
    assert g.runs
    for r in g.runs:
        assert r.model.d_model == 384, (name, r.run_id)
        assert r.resources.gpu >= 1, f"{name}: a paper-scale trial asks for a GPU"
        if r.task.name == "sudoku":
            assert r.task.structural_pos is False, f"{name}: paper-faithful grids embed one id per cell"


@pytest.mark.parametrize("name", sorted(PAPER_GRIDS))
def test_parameter_counts_match_the_paper(name):
    g = _grid(name)
    seen = {}
    for r in g.runs:
        key = (r.task.model_dump_json(exclude={"mask_rate", "n_train", "n_test"}), r.model.K)
        if r.model.K in PAPER_PARAMS and key not in seen:
            seen[key] = r.costs()["n_params"]
            want = PAPER_PARAMS[r.model.K]
            assert abs(seen[key] / want - 1) <= 0.05, (
                f"{name}: K={r.model.K} has {seen[key]:,} parameters, the paper {want:,.0f}")
    if name != "text8.yaml":
        assert seen, f"{name}: no run with a layer count the paper reports ({sorted(PAPER_PARAMS)})"


def test_iso_flop_families_hold_the_papers_pairs():
    g = _grid("iso_flop_sudoku.yaml")
    pairs = {(r.model.K, r.model.L) for r in g.runs}
    assert {(6, 5), (30, 1)} <= pairs and all(k * l == 30 for k, l in pairs)
    assert len({r.costs()["flops_per_forward"] for r in g.runs}) == 1, "an iso-FLOP family has one FLOP count"
    g = _grid("iso_flop_countdown.yaml")
    pairs = {(r.model.K, r.model.L) for r in g.runs}
    assert {(3, 5), (15, 1)} <= pairs and all(k * l == 15 for k, l in pairs)
