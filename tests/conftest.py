"""Shared fixtures. Run the default suite with `pytest`; slow tests with `pytest -m slow`."""
from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
# the tests' fault injection (tests/faults/faultplug.py): armed here, and in the Ray workers this process starts
FAULTS = os.path.join(ROOT, "tests", "faults")
sys.path.insert(0, FAULTS)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [FAULTS, os.environ.get("PYTHONPATH")]))
os.environ["RMDM_FAULT_FILE"] = os.path.join(tempfile.mkdtemp(prefix="rmdm-faults-"), "faults.json")
__import__("faultplug").arm()

torch.set_num_threads(1)
# `auto` attention/precision caches its measured choice per machine (model/precision.py): tests,
# and the Ray workers they start, keep theirs out of the user's cache
os.environ.setdefault("RMDM_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"rmdm-test-cache-{os.getuid()}"))


@pytest.fixture
def tiny_sudoku():
    from tasks.sudoku import Sudoku, SudokuConfig

    task = Sudoku(SudokuConfig(n=4, mask_rate=0.4, n_train=40, n_test=20, data_seed=1))
    task.prepare(None)
    return task


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """copy(dst) -> (results, run_id): a copy at `dst` of one tiny 4x4 run (4 steps, one eval point) trained
    and evaluated once per session by the real trial code in this process (no Ray). Tests write to the
    stores they are given (eval rows, damage), so each module or test takes its own copy, never this one."""
    import yaml

    from store import Store
    from study.engine.options import TrialOptions
    from study.engine.trial import execute
    from study.spec.grid import expand
    from tests.helpers import TINY, copy_store, tiny_grid

    root = tmp_path_factory.mktemp("tiny-run")
    raw = yaml.safe_load(tiny_grid(TINY, steps=4, n_test=8, T="[1]", retries=None, axes="seed: [0]"))
    run = expand(raw, f"{TINY}.yaml").runs[0]
    execute(run, Store(str(root), TINY), TrialOptions("test"))

    def copy(dst) -> tuple[str, str]:
        copy_store(root, dst)
        return str(dst), run.run_id

    return copy


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory):
    """copy(dst) -> dst: a copy, at dst/results with its grid at dst/g.yaml, of a tiny 4x4 study (tiny_grid:
    2 runs x 2 eval points, every sample kept) trained once per session by a real `study run` on a local Ray.
    As with tiny_run, each module or test takes its own copy."""
    import shutil

    from tests.helpers import TINY, copy_store, study, tiny_grid

    d = tmp_path_factory.mktemp("tiny-study")
    (d / "g.yaml").write_text(tiny_grid(TINY, retries=0, eval_extra=", n_samples_kept: 16"))
    r = study("run", str(d / "g.yaml"), "--results", str(d / "results"), "--num-cpus", "2", timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr

    def copy(dst):
        copy_store(d / "results", dst / "results")
        shutil.copy(d / "g.yaml", dst / "g.yaml")
        return dst

    return copy


@pytest.fixture
def faults():
    """inject(RMDM_FAULT_...=...): the faults of tests/faults/faultplug.py for this test, read by every run that
    starts, in this process and in the Ray workers it started (whenever they were started)."""
    import json

    path = os.environ["RMDM_FAULT_FILE"]

    def inject(**env) -> None:
        with open(path, "w") as f:
            json.dump(env, f)

    yield inject
    if os.path.exists(path):
        os.remove(path)
