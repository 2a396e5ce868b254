"""The store's format version (store/format.py) and `study migrate`: a store without one (written by the code
before it was recorded) is refused by every command in one line, and migrated, it verifies and reads as the
code that wrote it read it.

One real tiny study (`study run` of a 4x4 Sudoku grid on a local Ray), copied per test; its FORMAT file
removed makes it a store of the code before the version (which wrote the same files otherwise).

Run: pytest tests/test_migrate.py -q
"""
from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from store.format import VERSION
from tests.helpers import TINY as STUDY


@pytest.fixture(scope="module")
def fresh(tiny_study, tmp_path_factory):
    """The session's tiny study (conftest.py), a real `study run`: its results and g.yaml."""
    return tiny_study(tmp_path_factory.mktemp("migrate"))


@pytest.fixture
def old(tiny_study, tmp_path):
    """The study as the code before the format version left it: everything but FORMAT."""
    tiny_study(tmp_path)
    (tmp_path / "results" / STUDY / "FORMAT").unlink()
    return tmp_path


def cli(*args: str):
    from typer.testing import CliRunner

    from study.cli import app

    return CliRunner().invoke(app, list(args))


def null_columns(path, cols) -> None:
    """Rewrite a table file with `cols` null: the shape rows had before those columns were recorded."""
    t = pq.read_table(path)
    for c in cols:
        t = t.set_column(t.schema.get_field_index(c), c, pa.nulls(len(t), t.schema.field(c).type))
    pq.write_table(t, path)


def test_a_run_records_the_format(fresh):
    assert (fresh / "results" / STUDY / "FORMAT").read_text() == f"{VERSION}\n"


@pytest.mark.parametrize("argv", [("status", "{g}"), ("verify", "--study", STUDY), ("report", "--study", STUDY),
                                  ("run", "{g}", "--num-cpus", "1"), ("prune", "{g}")])
def test_every_command_refuses_a_store_without_a_version(old, argv):
    results = str(old / "results")
    r = cli(*[a.format(g=old / "g.yaml") for a in argv], "--results", results)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "format none recorded (version 0)" in lines[0] and f"format version {VERSION}" in lines[0]
    assert f"`study migrate --study {STUDY} --results {results}`" in lines[0]
    assert not (old / "results" / STUDY / "FORMAT").exists()  # a refusal writes nothing


def test_another_version_is_refused_by_name(old):
    (old / "results" / STUDY / "FORMAT").write_text("7\n")
    r = cli("verify", "--study", STUDY, "--results", str(old / "results"))
    assert r.exit_code == 2 and f"format version 7; this code reads and writes format version {VERSION}" in r.stderr
    r = cli("migrate", "--study", STUDY, "--results", str(old / "results"))
    assert r.exit_code == 2 and "not a format this code can migrate from" in r.stderr


def test_migrate_then_verify_and_idempotent(old, fresh):
    results = str(old / "results")
    r = cli("migrate", "--study", STUDY, "--results", results)
    assert r.exit_code == 0, r.output
    assert f"format version 0 -> {VERSION}" in r.stdout and "1 change(s)" in r.stdout  # only FORMAT was missing
    assert (old / "results" / STUDY / "FORMAT").read_text() == f"{VERSION}\n"
    r = cli("verify", "--study", STUDY, "--results", results)
    assert r.exit_code == 0, r.output
    r = cli("migrate", "--study", STUDY, "--results", results)
    assert r.exit_code == 0 and "already of the current store format" in r.stdout, r.output
    r = cli("status", str(old / "g.yaml"), "--results", results)
    assert r.exit_code == 0, r.output


def test_migrate_fills_what_older_stores_left_null(old, fresh):
    """Rows of older stores: no digests, no forward_passes_mean, no kind. Migrated, they equal the rows written
    whole."""
    from store import Store

    d = old / "results" / STUDY
    for f in (d / "runs").glob("*.parquet"):
        null_columns(f, ("weights_sha256", "history_sha256", "row_sha256"))
    for f in (d / "evals").glob("*/*.parquet"):
        null_columns(f, ("forward_passes_mean", "kind", "point_sha256", "weights_sha256"))  # (digests: since)
    r = cli("migrate", "--study", STUDY, "--results", str(old / "results"))
    assert r.exit_code == 0, r.output
    assert "filled history_sha256, row_sha256, weights_sha256" in r.stdout
    assert "filled forward_passes_mean" in r.stdout and ".parquet: filled point_sha256, weights_sha256" in r.stdout
    assert "nll-test.parquet: kind nll" in r.stdout and ".parquet: kind sample" in r.stdout  # the kind filled
    want, got = Store(str(fresh / "results"), STUDY), Store(str(old / "results"), STUDY)
    for table in ("runs", "evals"):
        a = want.read(table).sort_values(list(want.read(table).columns[:2])).reset_index(drop=True)
        b = got.read(table).sort_values(list(got.read(table).columns[:2])).reset_index(drop=True)
        assert a.equals(b), table
    r = cli("verify", "--study", STUDY, "--results", str(old / "results"))
    assert r.exit_code == 0, r.output


def test_migrate_never_runs_beside_a_driver(old):
    from store import Store
    from store.lease import acquire

    lease = acquire(Store(str(old / "results"), STUDY, check_format=False), "run")
    try:
        r = cli("migrate", "--study", STUDY, "--results", str(old / "results"))
    finally:
        lease.release()
    assert r.exit_code == 2 and "is being run by" in r.stderr, r.output
    assert not (old / "results" / STUDY / "FORMAT").exists()


def test_a_new_study_is_stamped_with_its_first_file(tmp_path):
    from store import Store

    s = Store(str(tmp_path), "new")
    assert not (tmp_path / "new").exists()  # opening writes nothing
    s.write_config("r1", {"run_id": "r1"})
    assert (tmp_path / "new" / "FORMAT").read_text() == f"{VERSION}\n"


@pytest.mark.parametrize("col", ["weights_sha256", "history_sha256", "row_sha256"])
def test_a_current_store_with_a_digest_missing_fails_verify(fresh, tmp_path, col):
    """Nulls a store of this format cannot hold (migrate fills them in older ones): a problem, not a note."""
    shutil.copytree(fresh / "results", tmp_path / "results", ignore=shutil.ignore_patterns(".ray"))
    (f, *_) = sorted((tmp_path / "results" / STUDY / "runs").glob("*.parquet"))
    null_columns(f, (col,))
    if col != "row_sha256":  # keep the row's own digest right: only the one field is missing
        from store.digest import row_sha256

        t = pq.read_table(f)
        t = t.set_column(t.schema.get_field_index("row_sha256"), "row_sha256",
                         pa.array([row_sha256(t.to_pylist()[0])], pa.string()))
        pq.write_table(t, f)
    r = cli("verify", "--study", STUDY, "--results", str(tmp_path / "results"))
    assert r.exit_code == 1, r.output
    assert any("PROBLEM" in ln and f"field {col} is empty" in ln and f.stem in ln for ln in r.stdout.splitlines()), \
        r.stdout


def test_migrate_adopts_the_grid_of_a_study_run_before_grids_were_recorded(old):
    import json

    d = old / "results" / STUDY
    shutil.rmtree(d / "grids")  # the shape of a study run before grids were recorded: its grid.yaml alone
    r = cli("migrate", "--study", STUDY, "--results", str(old / "results"))
    assert r.exit_code == 0, r.output
    from store.provenance import grid_sha

    sha = grid_sha((d / "grid.yaml").read_text())
    assert f"adopted grid.yaml as grid {sha}" in r.stdout
    log = [json.loads(x) for x in (d / "grids" / "log.jsonl").read_text().splitlines()]
    assert [(e["grid"], e["command"], e["path"]) for e in log] == [(sha, "adopted", "grid.yaml")] and log[0]["time"]
    assert (d / "grids" / f"{sha}.yaml").read_text() == (d / "grid.yaml").read_text()
    r = cli("verify", "--study", STUDY, "--results", str(old / "results"))
    assert r.exit_code == 0, r.output


def test_migrate_drops_the_ppl_rows_of_a_likelihood_point(tmp_path):
    """Older text8 stores held a `ppl` row (exp of nll) in each likelihood point; today the analysis derives it.
    Migrated, the evals equal those written today, and verify (which no longer knows a stored ppl) passes."""
    import math

    from study.commands.verify import verify_study
    from study.engine.options import TrialOptions
    from study.engine.trial import execute
    from study.spec.grid import expand
    from store import Store
    from tests.test_tasks_text8 import GRID as T8

    grid = {**T8, "task": {**T8["task"], "n_test": 8, "n_t": 4}, "train": {**T8["train"], "steps": 5},
            "eval": {"T": [4], "n_examples": 8, "n_samples_kept": 2}}
    fresh = tmp_path / "fresh"
    execute(expand(grid, "t8.yaml").runs[0], Store(str(fresh), "t8"), TrialOptions("test"))
    shutil.copytree(fresh, tmp_path / "results")
    d = tmp_path / "results" / "t8"
    (d / "FORMAT").unlink()
    (f,) = [p for p in (d / "evals").glob("*/*.parquet") if not p.stem.endswith("-gen")]
    null_columns(f, ("point_sha256",))  # older stores' rows record no point digest
    t = pq.read_table(f)
    nll = next(r for r in t.to_pylist() if r["metric"] == "nll")
    ppl = {**nll, "metric": "ppl", **{k: math.exp(nll[k]) for k in ("value", "ci_low", "ci_high")}}
    pq.write_table(pa.concat_tables([t, pa.Table.from_pylist([ppl], schema=t.schema)]), f)
    r = cli("verify", "--study", "t8", "--results", str(tmp_path / "results"))
    assert r.exit_code == 2 and "format none recorded (version 0)" in r.stderr, r.output
    r = cli("migrate", "--study", "t8", "--results", str(tmp_path / "results"))
    assert r.exit_code == 0, r.output
    assert "dropped the derived ppl row (exp of nll)" in r.stdout
    a, b = Store(str(fresh), "t8").read("evals"), Store(str(tmp_path / "results"), "t8").read("evals")
    key = ["eval_key", "metric"]
    assert a.sort_values(key).reset_index(drop=True).equals(b.sort_values(key).reset_index(drop=True))
    v = verify_study(Store(str(tmp_path / "results"), "t8"))
    assert v.problems == [], v.problems[:3]


def test_a_current_store_with_its_grid_yaml_but_no_grid_record_fails_verify(fresh, tmp_path):
    """The shape of a study from before grids were recorded (grid.yaml alone, runs naming no grid) is migrate's
    to adopt; in a store of this format it is a deleted record, not a grid.yaml to fall back on."""
    from store.digest import row_sha256

    shutil.copytree(fresh / "results", tmp_path / "results", ignore=shutil.ignore_patterns(".ray"))
    d = tmp_path / "results" / STUDY
    shutil.rmtree(d / "grids")
    for f in (d / "runs").glob("*.parquet"):
        null_columns(f, ("grid",))
        t = pq.read_table(f)
        t = t.set_column(t.schema.get_field_index("row_sha256"), "row_sha256",
                         pa.array([row_sha256(r) for r in t.to_pylist()], pa.string()))
        pq.write_table(t, f)
    r = cli("verify", "--study", STUDY, "--results", str(tmp_path / "results"))
    assert r.exit_code == 1, r.output
    problems = [ln for ln in r.stdout.splitlines() if "PROBLEM" in ln]
    assert any("log.jsonl: missing or empty, but the study keeps its grid.yaml" in ln for ln in problems), r.stdout


def test_migrate_clears_temp_files_under_earlier_names(old):
    """`<name>.tmp-<pid>[.npz]` temp files of earlier versions (today's readers know only `.<name>.<8 hex>.tmp`)."""
    import os
    import time

    d = old / "results" / STUDY
    rid = sorted(p.stem for p in (d / "runs").glob("*.parquet"))[0]
    (d / "data").mkdir(exist_ok=True)
    temps = [d / "weights" / f"{rid}.pt.tmp-4242", d / "data" / "sudoku4-x.npz.tmp-77.npz",
             d / "weights" / f"{rid}.pt.0123abcd.part"]
    for p in temps:
        p.write_bytes(b"half a file")
        os.utime(p, (time.time() - 3600, time.time() - 3600))
    r = cli("migrate", "--study", STUDY, "--results", str(old / "results"))
    assert r.exit_code == 0, r.output
    for p in temps:
        assert f"{p}: removed (a temp file left by an interrupted write)" in r.stdout, r.stdout
        assert not p.exists()
    r = cli("verify", "--study", STUDY, "--results", str(old / "results"))
    assert r.exit_code == 0, r.output


def test_a_store_written_by_an_older_commit_is_refused_then_migrated_and_verified(tmp_path):
    """tests/fixtures/format1: a store the code of an older commit wrote (format 1, no evals `kind`). Every reader
    refuses it in one line naming `study migrate`; migrated, every evals row names its kind and is otherwise the
    row it was; it verifies, and --deep evaluates its points again from its weights to the same numbers."""
    import pandas as pd

    from store import digest

    fixture = __import__("pathlib").Path(__file__).parent / "fixtures" / "format1"
    shutil.copytree(fixture, tmp_path / "results", ignore=shutil.ignore_patterns("README.md"))
    results = str(tmp_path / "results")
    for argv in (("verify",), ("report",)):
        r = cli(*argv, "--study", "old", "--results", results)
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
        assert f"is of format version 1; this code reads and writes format version {VERSION}: run `study migrate " \
               f"--study old --results {results}` first" in r.stderr, r.stderr
    before = {p.relative_to(tmp_path): pd.read_parquet(p) for p in (tmp_path / "results").rglob("evals/*/*.parquet")}
    r = cli("migrate", "--study", "old", "--results", results)
    assert r.exit_code == 0, r.output
    assert f"format version 1 -> {VERSION}" in r.stdout and "nll-val.parquet: kind nll" in r.stdout, r.stdout
    assert "nll-val.parquet: filled point_sha256, weights_sha256" in r.stdout, r.stdout
    weights = digest.sha256((tmp_path / "results" / "old" / "weights" / "0e7c3cc7a2af.pt").read_bytes())
    for rel, was in before.items():
        now = pd.read_parquet(tmp_path / rel)
        assert "kind" not in was and set(now["kind"]) == {"nll" if rel.stem.startswith("nll-") else "sample"}, rel
        assert set(now["weights_sha256"]) == {weights} and now["point_sha256"].notna().all(), rel
        # kind, weights_sha256 and point_sha256: columns the older commit did not write
        pd.testing.assert_frame_equal(now.drop(columns=["kind", "weights_sha256", "point_sha256"]), was)
    r = cli("verify", "--study", "old", "--results", results, "--deep")
    assert r.exit_code == 0 and "OK: every check agrees" in r.stdout, r.output
    assert "--deep: 1 of 1 eval points evaluated again" in r.stdout and "2 of 2 continuous-quantity" in r.stdout
