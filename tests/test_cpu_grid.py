"""The CPU-scale reproduction grid, end to end on a cut-down budget: real Ray, real Parquet, real
(tiny) models. Slow. Run: pytest -m slow tests/test_cpu_grid.py"""
from __future__ import annotations

import os

import pytest
import yaml

from study.spec.grid import expand, load_grid
from study.engine.runner import run_grid
from store import Store
from tests.helpers import check_forward_passes, check_rows_against_samples
from study.engine.options import RunOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_GRIDS = sorted(f for f in os.listdir(os.path.join(ROOT, "grids", "cpu")) if f.endswith(".yaml"))


def _cut_down(raw: dict) -> dict:
    """Same grid (groups, axes, eval points), tiny budget: a few steps of a narrow model on few puzzles."""
    raw = yaml.safe_load(yaml.safe_dump(raw))
    raw["study"] = "cpu_sudoku_small"
    raw["task"].update(n_train=64, n_test=24)
    raw["model"].update(d_model=32, n_heads=4)
    raw["train"].update(steps=12, batch_size=16, warmup=2, checkpoint_every=5, log_every=4)
    raw["eval"]["n_examples"] = 24
    return raw


def test_cpu_grids_are_cpu_sized():
    """Every CPU grid asks for no GPU and for at most one CPU per trial (two trials share the 2 cores)."""
    assert {"sudoku.yaml", "countdown.yaml", "text8.yaml"} <= set(CPU_GRIDS)
    for name in CPU_GRIDS:
        g = load_grid(os.path.join(ROOT, "grids", "cpu", name))
        assert all(r.resources.gpu == 0 and r.resources.cpu <= 1 for r in g.runs), name
        # the ladder's held-out target is wider on purpose (2x the ladder's largest model, trained once
        # to check `study predict`; the two-step ladder's target likewise); every other CPU grid stays at d_model <= 128
        widest = 192 if name in ("ladder_target.yaml", "ladder_two_step_target.yaml") else 128
        assert all(r.model.d_model <= widest for r in g.runs), name


@pytest.mark.slow
def test_cpu_sudoku_grid_runs_end_to_end(tmp_path):
    with open(os.path.join(ROOT, "grids", "cpu", "sudoku.yaml")) as f:
        raw = _cut_down(yaml.safe_load(f))
    grid = expand(raw, str(tmp_path / "cpu_sudoku_small.yaml"))
    results = str(tmp_path / "results")
    assert run_grid(grid, results, RunOptions(num_cpus=2, echo=lambda *_: None)) == 0

    store = Store(results, "cpu_sudoku_small")
    runs = store.read("runs")
    assert len(runs) == 4 and (runs.status == "done").all()
    assert sorted(zip(runs.K, runs.L_t, runs.schedule)) == [(1, 1, "fixed"), (1, 3, "fixed"), (1, 3, "reverse"),
                                                            (3, 1, "fixed")]
    # iso-parameter and iso-FLOP partners, as the claims need them
    by = {(k, l): r for k, l, r in zip(runs.K, runs.L_t, runs.itertuples())}
    assert by[(1, 1)].n_params == by[(1, 3)].n_params < by[(3, 1)].n_params
    assert by[(1, 3)].flops_per_forward == by[(3, 1)].flops_per_forward
    evals = store.read("evals")
    evals = evals[evals.sampler != "likelihood"]  # sampled points only (sampler "likelihood": test_continuous.py)
    want = sum(len(r.eval_points()) for r in grid.runs) * 3  # vpr, cell_acc, exact
    assert len(evals) == want
    rec = evals[evals.run_id.isin(runs.run_id[runs.L_t == 3]) & (evals.metric == "vpr")]
    assert set(rec.L_s) == {1, 2, 3, 4, 6}  # cross-depth: sampled above the training depth
    check_forward_passes(store, grid, evals, str(tmp_path / "scratch"))
    check_rows_against_samples(evals, store.read("samples"))  # 24 examples: every one kept
