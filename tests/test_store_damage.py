"""A damaged store: one truncated or garbage Parquet file per table is named, skipped where safe,
and redone by the next `study run`.

Run: pytest tests/test_store_damage.py -q   (tiny real trainings in-process; one real `study run`
on a local Ray; `study status` and `study report` subprocesses)
"""
from __future__ import annotations

import os

import pytest

from store import Store
from study.spec.grid import load_grid
from study.engine.health import classify
from study.commands.status import counts, render, snapshot
from study.engine.trial import execute
from study.engine.options import TrialOptions
from tests.helpers import copy_store, study, tiny_grid

GRID = tiny_grid("dmg", n_test=8, retries=0, axes="seed: [0, 1, 2, 3]")
TABLES = ("runs", "evals", "history", "samples")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A finished 4-run study, trained and evaluated once by the real trial code (no Ray); never damaged."""
    d = tmp_path_factory.mktemp("dmg")
    (d / "dmg.yaml").write_text(GRID)
    grid = load_grid(str(d / "dmg.yaml"))
    store = Store(str(d / "results"), grid.study)
    for run in grid.runs:
        execute(run, store, TrialOptions("test"))
    return d / "results"


@pytest.fixture
def trained(pristine, tmp_path):
    """This test's own copy of the finished study, to damage."""
    gpath = tmp_path / "dmg.yaml"
    gpath.write_text(GRID)
    grid = load_grid(str(gpath))
    copy_store(pristine, tmp_path / "results")
    return gpath, grid, Store(str(tmp_path / "results"), grid.study)


def damage(store: Store, grid, how: str = "truncate") -> dict[str, str]:
    """One file of each table, each of another run: truncated to half, or overwritten with garbage."""
    hit = {}
    for table, run in zip(TABLES, grid.runs):
        rid = run.run_id
        if table in ("runs", "history"):
            path = store.path(table, f"{rid}.parquet")
        else:
            path = store.path(table, rid, f"{sorted(store.eval_keys(rid))[0]}.parquet")
        data = open(path, "rb").read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2] if how == "truncate" else b"not parquet at all\n" * 8)
        hit[table] = path
    return hit


@pytest.mark.parametrize("how", ["truncate", "garbage"])
def test_status_names_every_unreadable_file_and_counts_no_damaged_run_done(trained, how):
    gpath, grid, store = trained
    hit = damage(store, grid, how)
    fresh = Store(store.root, store.study)  # what a new `study status` sees
    st = snapshot(grid, fresh)
    assert counts(st)["done"] == 0  # each run has one damaged file (it said done 4/4 over a garbage evals file)
    text = render(grid, fresh, st)
    for path in hit.values():
        assert f"unreadable, skipped: {path}" in text

    r = study("status", str(gpath), "--results", store.root)
    assert r.returncode == 0, r.stderr
    assert "done 0/4" in r.stdout and "Traceback" not in r.stderr
    for path in hit.values():
        assert path in r.stdout


def test_report_skips_and_names_unreadable_files(trained):
    gpath, grid, store = trained
    hit = damage(store, grid)
    r = study("report", "--study", "dmg", "--results", store.root, "--figure", "iso-param",
              "--out", os.path.join(os.path.dirname(store.root), "fig"))
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode in (0, 1)  # a figure drawn, or "not drawn: <why>" from a 4x4 study; never a crash
    for table in ("runs", "evals", "history"):
        assert f"unreadable, skipped: {hit[table]}" in r.stderr


def test_rerun_redoes_what_each_damaged_file_held(trained):
    gpath, grid, store = trained
    before = {r.run_id: store.read("history", filter_run=r.run_id).step.tolist() for r in grid.runs}
    hit = damage(store, grid)
    plan = classify(grid, Store(store.root, store.study))
    assert not plan.done and len(plan.todo) == 4  # every run holds a damaged file: none is done

    # the real `study run`: dispatches all four (weights kept: evaluate what is missing, rewrite rows)
    r = study("run", str(gpath), "--results", store.root, "--num-cpus", "2", timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    for path in hit.values():
        assert f"unreadable: {path}" in r.stdout

    fresh = Store(store.root, store.study)
    assert counts(snapshot(grid, fresh))["done"] == 4
    assert not fresh.unreadable
    for table in TABLES:
        assert fresh.read(table).shape[0] > 0
    assert {r.run_id: fresh.read("history", filter_run=r.run_id).step.tolist() for r in grid.runs} == before
    assert classify(grid, fresh).done and not fresh.unreadable
    v = study("verify", "--study", "dmg", "--results", store.root)
    assert v.returncode == 0, v.stdout
