"""Ray workers and names: the trials import the installed project whatever the driver's working directory
holds, and a sweep whose trials cannot even start stops, saying why in one line. Real local Ray.

Run: pytest tests/test_workers.py
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from store import Store
from study.engine.placement import NEVER_STARTED_LIMIT
from study.spec.grid import load_grid
from study.engine.options import RunOptions

GRID = """study: shadow
task: {name: sudoku, n: 4, mask_rate: 0.4, n_train: 30, n_test: 16}
model: {d_model: 16, n_heads: 2}
train: {steps: 4, batch_size: 8, warmup: 2, log_every: 2}
eval: {T: [1], L_s: [train], n_examples: 16}
axes:
  seed: [0, 1]
"""
STUDY = os.path.join(os.path.dirname(sys.executable), "study")  # the console script, as users run it
GUARD_S = 600  # only against a hang (the bug this file pins): a passing run takes well under a minute of work


# slow set (13 s of the default suite, measured under load); the default suite keeps test_cli_errors' shadowing message
@pytest.mark.slow
def test_a_results_folder_named_like_a_package_does_not_shadow_it_in_the_workers(tmp_path):
    """`study run g.yaml --results store` in a folder: its `store/` (the results, no __init__.py) stood first
    on every worker's sys.path and every trial failed with `cannot import name 'Store' from 'store'`."""
    (tmp_path / "g.yaml").write_text(GRID)
    for name in ("store", "study", "tasks", "model"):  # results folders named like the project's packages
        (tmp_path / name).mkdir()
    p = subprocess.run([STUDY, "run", "g.yaml", "--results", "store", "--num-cpus", "2"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=GUARD_S)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "ImportError" not in p.stdout + p.stderr
    runs = Store(str(tmp_path / "store"), "shadow").read("runs")
    assert len(runs) == 2 and (runs.status == "done").all()


# slow set (11 s of the default suite, measured under load); the default suite keeps test_ray_start's resources-the-cluster-lacks tests
@pytest.mark.slow
def test_trials_that_fail_before_their_code_starts_stop_the_sweep_with_one_line(tmp_path):
    """Workers whose environment cannot import the project (here: a `torch` that raises on import, on the
    workers' PYTHONPATH only): the sweep stops after NEVER_STARTED_LIMIT such failures, exit 2, one line
    naming the cause; no run is recorded as failed (their code never ran)."""
    import ray

    from study.engine.runner import run_grid

    broken = tmp_path / "broken"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise ImportError('this worker has no usable torch (test)')\n")
    g = tmp_path / "g.yaml"
    g.write_text(GRID.replace("seed: [0, 1]", "seed: [0, 1, 2, 3, 4]"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": str(broken)}})
    try:
        lines: list[str] = []
        assert run_grid(load_grid(str(g)), str(tmp_path / "res"), RunOptions(echo=lines.append)) == 2
    finally:
        ray.shutdown()
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, lines
    assert f"{NEVER_STARTED_LIMIT} trials in a row failed before their code started" in errors[0], errors
    assert "this worker has no usable torch (test)" in errors[0], errors
    assert "\n" not in errors[0]
    runs = Store(str(tmp_path / "res"), "shadow").read("runs")
    assert runs is None or runs.empty


def test_plan_measures_whatever_the_working_directory_holds(tmp_path):
    """`study plan --measure` times a step in a child `python -c`, which put its working directory first on
    sys.path: beside a results folder `store` it failed with `cannot import name 'NAME_RULE' from 'store'`."""
    (tmp_path / "g.yaml").write_text(GRID)
    (tmp_path / "store").mkdir()
    p = subprocess.run([STUDY, "plan", "g.yaml", "--remeasure"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=GUARD_S, env={**os.environ, "RMDM_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "measured" in p.stdout and "ImportError" not in p.stdout + p.stderr
