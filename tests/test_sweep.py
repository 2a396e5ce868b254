"""A real sweep: real local Ray, real Parquet, real tiny models. Run: pytest tests/test_sweep.py"""
from __future__ import annotations

import os
import subprocess
import sys


from study.spec.grid import load_grid
from study.engine.runner import run_grid
from store import Store
from tests.helpers import check_forward_passes, check_rows_against_samples
from study.engine.options import RunOptions

GRID = """
study: sweep2
task: {name: sudoku, n: 4, mask_rate: 0.4, n_train: 30, n_test: 16}
model: {d_model: 16, n_heads: 2}
train: {steps: 12, batch_size: 8, warmup: 2, checkpoint_every: 5, log_every: 4}
eval: {T: [1, 3], L_s: [train, 1], n_examples: 16}
axes:
  L: [1, 2]
"""


def test_two_run_sweep_writes_expected_rows_and_a_figure(tmp_path):
    gpath = tmp_path / "sweep2.yaml"
    gpath.write_text(GRID)
    results = str(tmp_path / "results")
    grid = load_grid(str(gpath))
    assert run_grid(grid, results, RunOptions(num_cpus=2, echo=lambda *_: None)) == 0

    store = Store(results, "sweep2")
    runs = store.read("runs")
    assert sorted(runs.run_id) == sorted(r.run_id for r in grid.runs)
    assert (runs.status == "done").all() and runs.final_loss.notna().all()
    assert sorted(runs.L_t) == [1, 2] and (runs.n_params == runs.n_params.iloc[0]).all()
    all_evals = store.read("evals")
    evals = all_evals[all_evals.sampler != "likelihood"]  # sampled points only (sampler "likelihood": test_continuous.py)
    # L=1: T in {1,3} at L_s=1 -> 2 points; L=2: T x L_s in {2, 1} -> 4 points; 3 metrics each
    assert len(evals) == (2 + 4) * 3
    assert set(evals.metric) == {"vpr", "cell_acc", "exact"}
    check_forward_passes(store, grid, evals, str(tmp_path / "scratch"))
    samples = store.read("samples")
    samples = samples[~samples.eval_key.str.startswith("nll-")]  # as evals: the sampled points' rows
    assert len(samples) == 6 * 16 and samples.output.str.len().eq(16).all()
    check_rows_against_samples(evals, samples)
    hist = store.read("history")
    assert set(hist.run_id) == set(runs.run_id)

    # a second run of the same grid trains nothing and writes no duplicate rows
    assert run_grid(grid, results, RunOptions(num_cpus=2, echo=lambda *_: None)) == 0
    assert len(store.read("evals")) == len(all_evals) and len(store.read("runs")) == 2

    # the report draws from the store alone
    r = subprocess.run([sys.executable, "-m", "study.cli", "report", "--figure", "iso-param", "--results", results],
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr
    png = [line for line in r.stdout.splitlines() if line.endswith(".png")][0]
    assert os.path.getsize(png) > 10_000


def test_plan_of_a_seed_sweep_builds_one_model_per_architecture(tmp_path):
    """Costs depend on task and model only: 2 archs x 30 seeds x 2 lr plan with 2 model builds, same numbers."""
    import json

    from typer.testing import CliRunner

    import study.spec.grid as sg
    from study.cli import app

    p = tmp_path / "wide.yaml"
    p.write_text("study: wide\ntask: {name: sudoku, n: 4, mask_rate: 0.4, n_train: 40, n_test: 8}\n"
                 "model: {d_model: 16, n_heads: 2}\naxes:\n  K: [1, 2]\n  lr: [0.001, 0.003]\n"
                 f"  seed: {list(range(30))}\n")
    sg._costs.cache_clear()
    r = CliRunner().invoke(app, ["plan", str(p), "--json"])
    assert r.exit_code == 0, r.output
    rows = [x for x in map(json.loads, r.stdout.splitlines()) if not x.get("totals")]  # + a totals line
    assert len(rows) == 120 and sg._costs.cache_info().misses == 2
    runs = {r.run_id: r for r in sg.load_grid(str(p)).runs}
    for row in rows[::7]:  # the shared count is the count of the run's own model
        run = runs[row["run_id"]]
        own = dict(sg._costs.__wrapped__(run.task.name, run.task.model_dump_json(), run.model.model_dump_json()))
        assert {k: row[k] for k in own} == own
