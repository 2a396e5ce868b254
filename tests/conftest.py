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
