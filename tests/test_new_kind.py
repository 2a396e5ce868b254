"""An evaluation kind added in one file: `best`, the best per-example score of a grid's point (a best-of-n look),
defined and registered here, written beside a real tiny study's points, and checked by `study verify` by its own
rules (its key, its rows' derivation, its cost) and by `--deep` (made again from the stored weights). Nothing
outside this file names it; without its registration the store's `best` rows are a kind verify does not know.

Run: pytest tests/test_new_kind.py -q   (one real `study run` of a 4x4 Sudoku grid on a local Ray)
"""
from __future__ import annotations

import dataclasses
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from study.engine.kinds import KINDS, Kind, register
from tests.helpers import TINY as STUDY


# ---- the kind ----------------------------------------------------------------------------------
class Best(Kind):
    """Each metric's best per-example score at a grid's point, no interval; key `best-<point key>`."""

    name = "best"

    def point(self, v, path, key, rows, known, run, task):
        return next((pt for pt in known.values() if f"best-{pt.key}" == key), False)

    def derive(self, v, path, r, scores, task):
        vals = [s[r["metric"]] for s in scores if r["metric"] in s]
        return {"value": max(vals), "ci_low": None, "ci_high": None} if len(vals) == len(scores) else None

    def evaluate(self, run_id, pt, model, task, ev, keep, precision):
        from study.engine.evaluate import evaluate

        e = evaluate(model, task, pt, ev, run_id, keep=keep, precision=precision, key=f"best-{pt.key}", kind=self.name)
        e.evals = [dataclasses.replace(r, value=max(s[r.metric] for s in e.scores), ci_low=None, ci_high=None)
                   for r in e.evals]
        return [e]


register(Best())


# ---- the test ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def results(tiny_study, tmp_path_factory):
    """A real tiny study (conftest.py), then one `best` point of its first run written beside the grid's."""
    from store import Store
    from study.commands.puzzles import load_run_model
    from study.commands.verify.runs import run_of_config
    from study.engine.evaluate import write
    from tasks import make_task

    d = tiny_study(tmp_path_factory.mktemp("kind"))
    store = Store(str(d / "results"), STUDY)
    rid = sorted(store.read("runs")["run_id"])[0]
    cfg, _, model = load_run_model(store, rid)
    run = run_of_config(cfg, STUDY)
    task = make_task(run.task)  # with its evaluation fields (n_test: the config's task_eval)
    with store.task_data() as data:
        task.prepare(data)
    pt = run.eval_points()[0]
    ev = task.eval_set(pt.split).head(pt.n_examples)
    for e in KINDS["best"].evaluate(rid, pt, model, task, ev, min(run.eval.n_samples_kept, len(ev)), "float32"):
        write(store, rid, e)
    return d / "results", rid, f"best-{pt.key}"


def verify(res, *args: str) -> subprocess.CompletedProcess:
    """`study verify` in this process: the kind registered above is known to it."""
    from typer.testing import CliRunner

    from study.cli import app

    argv = ["verify", "--study", STUDY, "--results", str(res), *args]
    r = CliRunner().invoke(app, argv)
    return subprocess.CompletedProcess(argv, r.exit_code, r.stdout, "")


def test_a_new_kind_is_verified_by_its_own_rules(results, monkeypatch):
    res, rid, key = results
    path = res / STUDY / "evals" / rid / f"{key}.parquet"
    rows = pq.read_table(path).to_pylist()
    assert {r["kind"] for r in rows} == {"best"} and all(r["ci_low"] is None for r in rows)
    r = verify(res)
    assert r.returncode == 0, r.stdout
    assert " 5 eval points, " in r.stdout, r.stdout  # 2 runs x 2 grid points, and the best one
    r = verify(res, "--deep", "--point", f"{rid}/{key}")
    assert r.returncode == 0 and "--deep: 1 of 5 eval points evaluated again" in r.stdout, r.stdout

    # its value is derived again by its own rule (the max): a mean in its place is named
    t = pq.read_table(path)
    saved = t.to_pylist()
    rows = [{**x, "value": 0.5} if x["metric"] == rows[0]["metric"] else x for x in saved]
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), path)
    r = verify(res)
    assert r.returncode == 1 and f"{path}: field value of {rows[0]['metric']} is 0.5 but the 16 per-example " \
                                 f"scores give" in r.stdout, r.stdout
    pq.write_table(pa.Table.from_pylist(saved, schema=t.schema), path)

    # unregistered, its rows are a kind this code does not know
    monkeypatch.delitem(KINDS, "best")
    r = verify(res)
    assert r.returncode == 1 and f"{path}: field kind is 'best': one evaluation kind this code knows" in r.stdout
