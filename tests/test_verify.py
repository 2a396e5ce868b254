"""`study verify` on a real store: passes on a fresh study, names each damage it is shown.

Run: pytest tests/test_verify.py -q   (one real `study run` of a 4x4 Sudoku grid on a local Ray,
then `study verify` on copies of its store)
"""
from __future__ import annotations

import os
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import TINY, study


@pytest.fixture(scope="module")
def fresh(tiny_study, tmp_path_factory):
    """A tiny study trained and evaluated by a real `study run` (2 runs x 2 eval points; conftest.py)."""
    return tiny_study(tmp_path_factory.mktemp("verify")) / "results"


@pytest.fixture
def copy(tiny_study, tmp_path):
    """A private copy of the fresh store, to damage."""
    return tiny_study(tmp_path) / "results"


def verify(results) -> subprocess.CompletedProcess:
    return study("verify", "--study", TINY, "--results", str(results), timeout=300)


def a_file(results, table: str) -> str:
    for dirpath, _, names in sorted(os.walk(results / TINY / table)):
        for n in sorted(names):
            if n.endswith(".parquet"):
                return os.path.join(dirpath, n)
    raise AssertionError(f"no {table} file")


def test_verify_passes_on_a_fresh_study(fresh):
    r = verify(fresh)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: every check agrees" in r.stdout
    assert "2 runs (2 done)" in r.stdout and "4 eval points" in r.stdout
    assert "64 samples re-scored" in r.stdout  # 2 runs x 2 points x 16 examples, every one kept
    assert "Traceback" not in r.stderr


def test_verify_names_a_sample_whose_output_was_altered(copy):
    path = a_file(copy, "samples")
    t = pq.read_table(path)
    rows = t.to_pylist()
    # one free cell flipped between right and wrong: the stored cell accuracy (and VPR, if it was
    # 1) no longer holds for this output
    r0 = rows[0]
    i = r0["input"].index(".")
    ref = r0["reference"][i]
    new = ref if r0["output"][i] != ref else ("1" if ref != "1" else "2")
    r0["output"] = r0["output"][:i] + new + r0["output"][i + 1:]
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), path)
    r = verify(copy)
    assert r.returncode == 1, r.stdout
    assert f"{path} example 0" in r.stdout
    assert "re-score" in r.stdout


def test_verify_names_a_deleted_evals_row(copy):
    path = a_file(copy, "evals")
    t = pq.read_table(path)
    dropped = t.column("metric")[0].as_py()
    pq.write_table(t.slice(1), path)  # the first metric's row is gone
    run_id, key = path.split(os.sep)[-2], os.path.basename(path)[: -len(".parquet")]
    r = verify(copy)
    assert r.returncode == 1, r.stdout
    assert f"no evals row of metric {dropped} (run {run_id}, eval point {key})" in r.stdout


def test_verify_names_a_truncated_parquet_file(copy):
    path = a_file(copy, "history")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    r = verify(copy)
    assert r.returncode == 1, r.stdout
    assert f"unreadable file {path}" in r.stdout
    assert "Traceback" not in r.stderr


def test_verify_names_a_missing_eval_point_and_missing_weights(copy):
    path = a_file(copy, "evals")
    run_id = path.split(os.sep)[-2]
    os.remove(path)
    os.remove(copy / TINY / "samples" / run_id / os.path.basename(path))
    os.remove(copy / TINY / "weights" / f"{run_id}.pt")
    r = verify(copy)
    assert r.returncode == 1, r.stdout
    assert f"run {run_id} is done but eval point {os.path.basename(path)[:-8]}" in r.stdout
    assert f"run {run_id} is done but has no weights" in r.stdout


def test_verify_unknown_study_is_a_message(tmp_path):
    r = study("verify", "--study", "nope", "--results", str(tmp_path), timeout=120)
    assert r.returncode == 2 and "no study 'nope'" in r.stderr and "Traceback" not in r.stderr
