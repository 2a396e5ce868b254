"""`study verify` against every tamper the store's own digests, shapes and grids let it see, `--deep` against a
consistent forgery, and `study run` / `study eval` refusing swapped weights and redoing a done run that misses
a file.

One real tiny study (a `study run` of a 4x4 Sudoku grid on a local Ray: K in {1, 2} x seed in {0, 1}, 2 eval
points of 16 examples, every output kept), copied per test, one thing changed: exit 1, and the message names
the file and the field. Each of these passed `study verify` (exit 0) on the code before.

Run: pytest tests/test_verify_digests.py -q
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import edit, study, tiny_grid

STUDY = "vdg"
GRID = tiny_grid(STUDY, retries=0, axes="K: [1, 2]\n  seed: [0, 1]", eval_extra=", n_samples_kept: 16")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    d = tmp_path_factory.mktemp("digests")
    (d / "g.yaml").write_text(GRID)
    r = study("run", str(d / "g.yaml"), "--results", str(d / "results"), "--num-cpus", "2", timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return d


@pytest.fixture
def copy(fresh, tmp_path):
    shutil.copytree(fresh / "results", tmp_path / "results", ignore=shutil.ignore_patterns(".ray"))
    shutil.copy(fresh / "g.yaml", tmp_path / "g.yaml")
    return tmp_path / "results"


def verify(results, *args: str) -> subprocess.CompletedProcess:
    """`study verify` in this process (typer's runner: no torch import per call)."""
    from typer.testing import CliRunner

    from study.cli import app

    argv = ["verify", "--study", STUDY, "--results", str(results), *args]
    r = CliRunner().invoke(app, argv)
    return subprocess.CompletedProcess(argv, r.exit_code, r.stdout, r.stderr)


def failed_naming(results, path, fld: str, *args: str) -> str:
    r = verify(results, *args)
    assert r.returncode == 1, r.stdout + r.stderr
    hits = [ln for ln in r.stdout.splitlines() if "PROBLEM" in ln and str(path) in ln and f"field {fld}" in ln]
    assert hits, f"no problem naming {path} and field {fld}:\n{r.stdout}"
    return r.stdout


def runs(results) -> dict[tuple[int, int], str]:
    """(K, seed) -> run id."""
    out = {}
    for p in (results / STUDY / "runs").glob("*.parquet"):
        row = pq.read_table(p).to_pylist()[0]
        out[(row["K"], row["seed"])] = row["run_id"]
    return out


def a_point(results, rid: str) -> tuple[str, str]:
    """(evals path, samples path) of the run's first eval point."""
    (p, *_) = sorted((results / STUDY / "evals" / rid).glob("*.parquet"))
    return str(p), str(results / STUDY / "samples" / rid / p.name)


def test_a_fresh_store_passes_deep_and_records_digests(fresh):
    t0 = time.perf_counter()
    r = verify(fresh / "results", "--deep")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: every check agrees" in r.stdout and "4 runs (4 done)" in r.stdout
    assert "--deep: 8 of 8 eval points evaluated again from the stored weights" in r.stdout
    assert "written before digests were recorded" not in r.stdout
    print(f"verify --deep on 4 runs x 2 points x 16 examples: {time.perf_counter() - t0:.1f} s")
    for p in (fresh / "results" / STUDY / "runs").glob("*.parquet"):
        row = pq.read_table(p).to_pylist()[0]
        assert all(len(row[c]) == 64 for c in ("weights_sha256", "history_sha256", "row_sha256"))


# ---- what the runs row recorded ----------------------------------------------------------------------
def test_weights_of_another_run_of_the_same_shape_are_named(copy):
    ids = runs(copy)
    dst = copy / STUDY / "weights" / f"{ids[(1, 1)]}.pt"
    shutil.copy(copy / STUDY / "weights" / f"{ids[(1, 0)]}.pt", dst)
    failed_naming(copy, dst, "weights_sha256")


def test_weights_of_another_shape_are_named(copy):
    ids = runs(copy)
    dst = copy / STUDY / "weights" / f"{ids[(1, 0)]}.pt"
    shutil.copy(copy / STUDY / "weights" / f"{ids[(2, 0)]}.pt", dst)  # (2 x 1) over (1 x 1)
    out = failed_naming(copy, dst, "model")
    assert "K 1" in out


def test_a_deleted_history_is_named(copy):
    rid = runs(copy)[(1, 0)]
    path = copy / STUDY / "history" / f"{rid}.parquet"
    os.remove(path)
    r = verify(copy)
    assert r.returncode == 1 and f"PROBLEM: {path}: missing: run {rid} is done" in r.stdout, r.stdout


@pytest.mark.parametrize("column,value", [("loss", lambda x: x * 0.5), ("loop_losses", lambda x: [y + 0.1 for y in x])])
def test_a_middle_history_row_edited_is_named(copy, column, value):
    path = copy / STUDY / "history" / f"{runs(copy)[(1, 0)]}.parquet"
    n = pq.read_table(path).num_rows
    assert n >= 3
    edit(path, column, value, row=n // 2)
    failed_naming(copy, path, "history_sha256")


@pytest.mark.parametrize("status", ["failed", "pruned"])
def test_a_status_flipped_from_done_is_named(copy, status):
    path = copy / STUDY / "runs" / f"{runs(copy)[(1, 0)]}.parquet"
    edit(path, "status", status)
    edit(path, "error", f"{status} at step 10")  # as a real failed or pruned row says
    out = failed_naming(copy, path, "status")
    assert f"{path}: field row_sha256" in out


# ---- what the task and the grids declare -------------------------------------------------------------
def test_a_fabricated_metric_row_is_named(copy):
    path, _ = a_point(copy, runs(copy)[(1, 0)])
    t = pq.read_table(path)
    rows = t.to_pylist()
    rows.append({**rows[0], "metric": "vpr_best", "value": 0.99, "ci_low": 0.95, "ci_high": 1.0})
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), path)
    failed_naming(copy, path, "metric")


def test_a_deleted_grid_log_is_named(copy):
    log = copy / STUDY / "grids" / "log.jsonl"
    os.remove(log)
    failed_naming(copy, log, "grid")


def test_a_run_of_the_grid_with_no_row_yet_is_owed_not_damage(copy):
    """A run the grid lists that left nothing (never started, interrupted, or every file gone): owed, named with
    the command that finishes it, exit 0; its row back, and the study verifies as before (issue 47)."""
    rid = runs(copy)[(2, 1)]
    for p in sorted((copy / STUDY).rglob(f"*{rid}*")):
        shutil.rmtree(p) if p.is_dir() else os.remove(p)
    r = verify(copy)
    assert r.returncode == 0 and "PROBLEM" not in r.stdout, r.stdout
    owed = [ln for ln in r.stdout.splitlines() if "owed by a grid, not yet run: 1 run(s) of grid" in ln]
    assert owed and f"`study run {copy / STUDY / 'grids'}/" in owed[0] and f"--results {copy}`" in owed[0], r.stdout


def test_a_run_interrupted_while_evaluating_is_owed_not_damage(copy):
    """Killed after some of a run's points were written and before its runs row: owed, exit 0; its row back, a
    samples file without its evals file is damage again."""
    rid = runs(copy)[(2, 1)]
    row = copy / STUDY / "runs" / f"{rid}.parquet"
    saved = row.read_bytes()
    row.unlink()
    ev = sorted((copy / STUDY / "evals" / rid).glob("T*.parquet"))[0]
    ev.unlink()  # killed between a point's samples and its evals file
    r = verify(copy)
    assert r.returncode == 0 and "PROBLEM" not in r.stdout, r.stdout
    assert "owed by a grid, not yet run: 1 run(s) of grid" in r.stdout, r.stdout
    row.write_bytes(saved)
    failed = verify(copy)
    assert failed.returncode == 1 and f"orphan file {copy / STUDY / 'samples' / rid / ev.name}: samples without an " \
                                      f"evals file" in failed.stdout, failed.stdout


@pytest.mark.parametrize("kind", ["ext", "likelihood", "nll", "toy"])
def test_an_evals_file_relabelled_as_another_kind_is_named(copy, kind):
    """A grid's sampled point whose rows claim another kind (whose rules would check less) is named."""
    path = sorted((copy / STUDY / "evals" / runs(copy)[(1, 0)]).glob("T*.parquet"))[0]
    edit(str(path), "kind", kind)
    failed_naming(copy, path, "kind")


def test_deep_point_of_no_stored_name_is_a_usage_error_listing_the_points(copy):
    r = verify(copy, "--deep", "--point", "bogus")
    assert r.returncode == 2 and "disagrees" not in r.stdout + r.stderr, r.stdout + r.stderr
    line = (r.stderr or r.stdout).strip()
    assert line.startswith("error: --point bogus: no stored eval point of that name"), line
    keys = sorted({p.stem for p in (copy / STUDY / "evals").rglob("*.parquet")})
    assert f"(of 4 run(s)): {', '.join(keys)}" in line and "\n" not in line, line


# ---- --deep ----------------------------------------------------------------------------------------------
def forge(results, rid: str) -> tuple[str, int]:
    """A consistent forgery: one kept output the model got wrong replaced by its reference, its scores re-scored
    by the task, and every evals value and interval recomputed from the per-example scores. (samples path,
    the example)"""
    from study.engine.evaluate import metric_rows
    from tasks import TASKS, make_task

    for path, spath in [a_point(results, rid)]:
        srows = sorted(pq.read_table(spath).to_pylist(), key=lambda s: s["example"])
        i = next(s["example"] for s in srows if s["output"] != s["reference"])
        row = pq.read_table(results / STUDY / "runs" / f"{rid}.parquet").to_pylist()[0]
        task = make_task(TASKS["sudoku"][0].model_validate(json.loads(row["task_params"])))
        s = srows[i]
        scores = task.rescore(s["input"], s["reference"], s["reference"])
        s.update(output=s["reference"], score=scores[task.primary_metric],
                 scores=json.dumps({m: scores[m] for m in json.loads(s["scores"])}))
        t = pq.read_table(spath)
        pq.write_table(pa.Table.from_pylist(srows, schema=t.schema), spath)
        per = [json.loads(x["scores"]) for x in srows]
        et = pq.read_table(path)
        erows = et.to_pylist()
        for e in erows:
            want = metric_rows(per, [e["metric"]], {})[0]
            e.update(value=want["value"], ci_low=want["ci_low"], ci_high=want["ci_high"])
        pq.write_table(pa.Table.from_pylist(_redigested(erows), schema=et.schema), path)
        return spath, i


def _redigested(erows: list[dict]) -> list[dict]:
    """An eval point's rows with their field point_sha256 recomputed, as a consistent forger does."""
    from store.digest import point_sha256

    return [{**e, "point_sha256": point_sha256(erows)} for e in erows]


def test_a_consistent_forgery_passes_the_plain_check_and_fails_deep(copy):
    ids = runs(copy)
    spath, i = forge(copy, ids[(1, 0)])
    r = verify(copy)
    assert r.returncode == 0, r.stdout  # nothing in the store disagrees with itself: only the weights can say
    key = os.path.basename(spath)[: -len(".parquet")]
    r = verify(copy, "--deep", "--point", f"{ids[(1, 0)]}/{key}")
    assert r.returncode == 1, r.stdout
    assert f"{spath} example {i}: field output" in r.stdout and "1 of 8 eval points evaluated again" in r.stdout


def test_another_seeds_point_copied_under_a_runs_id_fails_the_plain_check(copy):
    """Seed 0's evals and samples of a point copied onto seed 1 (run ids rewritten, the point's digest recomputed):
    every value derives from its samples, but the rows name seed 0's weights, not seed 1's."""
    ids = runs(copy)
    src, dst = ids[(1, 0)], ids[(1, 1)]
    for (path, spath), (dpath, dspath) in zip([a_point(copy, src)], [a_point(copy, dst)]):
        for frm, to, redo in ((spath, dspath, lambda rows: rows), (path, dpath, _redigested)):
            t = pq.read_table(frm)
            rows = [{**r, "run_id": dst} for r in t.to_pylist()]
            pq.write_table(pa.Table.from_pylist(redo(rows), schema=t.schema), to)
        assert pq.read_table(dpath)["weights_sha256"].to_pylist()[0] is not None
        failed_naming(copy, dpath, "weights_sha256")


def test_deep_fraction_picks_some_points_and_flags_need_deep(copy):
    r = verify(copy, "--deep", "--fraction", "0.25")
    assert r.returncode == 0 and "--deep: 2 of 8 eval points" in r.stdout, r.stdout
    r = verify(copy, "--fraction", "0.5")
    assert r.returncode == 2 and "add --deep" in r.stderr


# ---- the readers that load: `study eval` and `study run` -------------------------------------------------
def test_study_eval_refuses_swapped_weights(copy):
    from store import Store
    from study.commands.puzzles import EvalError, load_run_model

    ids = runs(copy)
    shutil.copy(copy / STUDY / "weights" / f"{ids[(1, 0)]}.pt", copy / STUDY / "weights" / f"{ids[(1, 1)]}.pt")
    with pytest.raises(EvalError, match="field weights_sha256"):
        load_run_model(Store(str(copy), STUDY), ids[(1, 1)])
    load_run_model(Store(str(copy), STUDY), ids[(1, 0)])  # its own weights load


def test_study_run_redoes_swapped_weights_and_any_missing_file(copy):
    ids = runs(copy)
    d = copy / STUDY
    swapped = d / "weights" / f"{ids[(1, 1)]}.pt"
    shutil.copy(d / "weights" / f"{ids[(1, 0)]}.pt", swapped)
    _, spath = a_point(copy, ids[(2, 0)])
    os.remove(spath)
    hpath = d / "history" / f"{ids[(2, 1)]}.parquet"
    os.remove(hpath)
    half = [d / "samples" / ids[(2, 1)] / "nll-test.parquet", d / "evals" / ids[(1, 0)] / "nll-test.parquet"]
    for p in half:  # a continuous point half there: the other file of its pair stays
        os.remove(p)
    r = study("run", str(copy.parent / "g.yaml"), "--results", str(copy), "--num-cpus", "2", timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.exists(spath) and hpath.exists() and all(p.exists() for p in half)
    row = pq.read_table(d / "runs" / f"{ids[(1, 1)]}.parquet").to_pylist()[0]
    from model.train import load_state
    from store.digest import sha256

    assert row["weights_sha256"] == sha256(swapped.read_bytes())
    assert any(ids[(1, 1)] in p.name for p in (d / "quarantine" / "weights").iterdir())  # set aside, kept
    assert load_state(str(swapped))["step"] == 20  # trained again
    r = verify(copy)
    assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("table", ["samples", "evals"])
def test_a_done_run_with_half_a_continuous_point_is_not_done(copy, table):
    """A done run whose nll-test point lost one file of its pair (its samples, or its evals file) is planned
    for re-evaluation, as verify names it a problem: `study run` said "0 to run" while verify failed."""
    from store import Store
    from study.engine.health import classify
    from study.spec.grid import load_grid

    rid = runs(copy)[(2, 1)]
    os.remove(copy / STUDY / table / rid / "nll-test.parquet")
    assert verify(copy).returncode == 1
    grid = load_grid(str(copy.parent / "g.yaml"))
    plan = classify(grid, Store(str(copy), STUDY))
    assert [r.run_id for r in plan.todo] == [rid], plan.why
    assert plan.why[rid] == "re-evaluate: eval point(s) nll-test missing or unreadable", plan.why
