"""`study verify` catches every stored number it can recompute: each field tampered with, one at a time.

One real tiny study (two `study run`s of two grids on a local Ray: 2 runs x 9 eval points, 16 examples
per point of which 5 keep their text), copied per test, one field changed, `study verify` run on the
copy: exit 1, and the message names the file and the field. A fresh store passes.

Run: pytest tests/test_verify_tamper.py -q
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import edit, study, tiny_grid

STUDY = "vtp"
# grid A: 9 eval points (enough files for the read index); 16 examples evaluated, 5 outputs kept
GRID_A = tiny_grid(STUDY, retries=0, T="[1, 2, 3, 4, 5, 6, 7, 8, 9]", eval_extra=", n_samples_kept: 5")
# grid B, run after A: the same runs, fewer points (nothing to do, but it is the last grid.yaml)
GRID_B = tiny_grid(STUDY, retries=0, T="[1, 2]", eval_extra=", n_samples_kept: 5")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    d = tmp_path_factory.mktemp("tamper")
    (d / "a.yaml").write_text(GRID_A)
    (d / "b.yaml").write_text(GRID_B)
    results = d / "results"
    for g in ("a.yaml", "b.yaml"):
        r = study("run", str(d / g), "--results", str(results), "--num-cpus", "2", timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
    # the read index, as a report or `study status` leaves it: files written over some seconds (the index
    # takes only files older than the newest by its racy window), then one bulk read
    for table in ("evals", "samples", "runs", "history"):
        paths = sorted(p for p in (results / STUDY / table).rglob("*.parquet"))
        for i, p in enumerate(paths):
            os.utime(p, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))
    from store import Store

    s = Store(str(results), STUDY)
    s.read("evals")
    s.summary()
    assert (results / STUDY / "_index" / "evals.parquet").exists()
    return results


@pytest.fixture
def copy(fresh, tmp_path):
    dst = tmp_path / "results"
    shutil.copytree(fresh, dst, ignore=shutil.ignore_patterns(".ray"))
    return dst


def verify(results) -> subprocess.CompletedProcess:
    """`study verify` on a copy, in this process (the CLI itself, through typer's runner: a fresh
    interpreter per tamper would cost a torch import each, most of this module's time)."""
    from typer.testing import CliRunner

    from study.cli import app

    args = ["verify", "--study", STUDY, "--results", str(results)]
    r = CliRunner().invoke(app, args)
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def runs_by_L(results) -> dict[int, str]:
    out = {}
    for p in (results / STUDY / "runs").glob("*.parquet"):
        row = pq.read_table(p).to_pylist()[0]
        out[row["L_t"]] = row["run_id"]
    return out


def eval_file(results, L: int = 2, T: int = 2, table: str = "evals") -> str:
    rid = runs_by_L(results)[L]
    (p,) = [p for p in (results / STUDY / "evals" / rid).glob(f"T{T}-Ls{L}-*.parquet")]
    return str(results / STUDY / table / rid / p.name)


def failed_naming(results, path: str, fld: str) -> str:
    r = verify(results)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    hits = [line for line in r.stdout.splitlines() if "PROBLEM" in line and path in line and f"field {fld}" in line]
    assert hits, f"no problem naming {path} and field {fld}:\n{r.stdout}"
    return r.stdout


def test_a_fresh_store_passes(fresh):
    r = verify(fresh)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: every check agrees" in r.stdout
    assert "2 runs (2 done)" in r.stdout and "18 eval points" in r.stdout
    # 2 runs x 9 points x 5 kept outputs re-scored; the other 11 of 16 per point taken as stored, and said so
    assert "90 samples re-scored" in r.stdout and "198 per-example scores taken as stored" in r.stdout
    assert "2 configs re-hashed" in r.stdout and "2 grids" in r.stdout
    assert " 0 index entries" not in r.stdout and "index entries checked" in r.stdout
    assert "not re-derived:" in r.stdout and "train_seconds" in r.stdout


# ---- evals rows --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fld,value", [
    ("n_examples", 4000), ("n_examples", 12), ("ci_low", lambda x: x + 0.01), ("ci_high", lambda x: x + 0.01),
    ("split", "val"), ("T", 3), ("L_s", 1), ("forward_passes", lambda x: x + 1),
    ("eval_flops", lambda x: x * 2), ("forward_passes_mean", lambda x: x + 0.5),
    ("value", lambda x: x + 0.05),  # 5 of 16 outputs kept: re-derived from the per-example scores all the same
])
def test_an_evals_field_changed_is_named(copy, fld, value):
    path = eval_file(copy)
    edit(path, fld, value, row=0)
    failed_naming(copy, path, fld)


def test_an_eval_key_that_no_point_owns_is_named(copy):
    path = eval_file(copy, T=1)
    new = os.path.join(os.path.dirname(path), "T1-Ls2-confidence-0badc0de.parquet")
    spath, snew = eval_file(copy, T=1, table="samples"), new.replace(f"{os.sep}evals{os.sep}", f"{os.sep}samples{os.sep}")
    for a, b in ((path, new), (spath, snew)):
        os.rename(a, b)
        edit(b, "eval_key", "T1-Ls2-confidence-0badc0de")
    r = verify(copy)
    assert r.returncode == 1, r.stdout
    assert f"{new}: eval_key T1-Ls2-confidence-0badc0de is not the key" in r.stdout


# ---- samples -------------------------------------------------------------------------------------------
def test_a_deleted_samples_file_is_an_error(copy):
    path, spath = eval_file(copy), eval_file(copy, table="samples")
    os.remove(spath)
    r = verify(copy)
    assert r.returncode == 1, r.stdout
    assert f"PROBLEM: {path}: no samples file {spath}" in r.stdout


def test_a_per_example_score_of_an_output_not_kept_is_caught_by_the_mean(copy):
    spath = eval_file(copy, table="samples")
    edit(spath, "scores", lambda s: json.dumps({**json.loads(s), "cell_acc": 1.0}), row=12)  # text not kept
    failed_naming(copy, eval_file(copy), "value")


# ---- runs rows and configs --------------------------------------------------------------------------
@pytest.mark.parametrize("fld,value", [
    ("L_t", 3), ("K", 2), ("n_params", lambda x: x + 1), ("n_params_non_embedding", lambda x: x - 1),
    ("flops_per_forward", lambda x: x * 2), ("lr", 0.5), ("seed", 7), ("batch", 64), ("steps", 10),
    ("d_model", 32), ("status", "failed"), ("final_loss", lambda x: x / 2),
])
def test_a_runs_field_changed_is_named(copy, fld, value):
    rid = runs_by_L(copy)[2]
    path = str(copy / STUDY / "runs" / f"{rid}.parquet")
    edit(path, fld, value)
    failed_naming(copy, path, fld)


@pytest.mark.parametrize("dotted,value", [("model.L", 3), ("train.lr", 0.5), ("eval.n_examples", 8),
                                          ("train.seed", 3)])
def test_an_edited_config_file_is_named(copy, dotted, value):
    rid = runs_by_L(copy)[2]
    path = str(copy / STUDY / "configs" / f"{rid}.json")
    cfg = json.loads(open(path).read())
    sec, key = dotted.split(".")
    cfg[sec][key] = value
    open(path, "w").write(json.dumps(cfg, indent=2, sort_keys=True))
    failed_naming(copy, path, dotted)


def test_a_run_id_that_is_not_its_config_hash_is_named(copy):
    rid = runs_by_L(copy)[2]
    path = str(copy / STUDY / "runs" / f"{rid}.parquet")
    edit(path, "config", lambda c: json.dumps({**json.loads(c), "model": {**json.loads(c)["model"], "L": 3}}))
    r = verify(copy)
    assert r.returncode == 1, r.stdout
    assert f"{path} field config: run id {rid} is not the hash of its training config" in r.stdout


# ---- the read index ------------------------------------------------------------------------------------
def test_an_edited_index_value_is_named(copy):
    ipath = str(copy / STUDY / "_index" / "evals.parquet")
    f = pq.ParquetFile(ipath)
    t = f.read()
    vals = t.column("value").to_pylist()
    vals[0] = vals[0] + 0.25
    t = t.set_column(t.schema.get_field_index("value"), "value", pa.array(vals, pa.float64()))
    pq.write_table(t.replace_schema_metadata(f.schema_arrow.metadata), ipath)
    failed_naming(copy, ipath, "value")


# ---- provenance: every grid the study ran ------------------------------------------------------------
def test_a_point_owed_by_an_earlier_grid_deleted_is_an_error(copy):
    path = eval_file(copy, T=9)  # grid A's point; the last grid.yaml (grid B) has T = [1, 2] only
    spath = eval_file(copy, T=9, table="samples")
    os.remove(path)
    os.remove(spath)
    rid, key = path.split(os.sep)[-2], os.path.basename(path)[: -len(".parquet")]
    r = verify(copy)
    assert r.returncode == 1, r.stdout
    assert f"run {rid} is done but eval point {key} has no readable evals rows" in r.stdout


def test_every_grid_is_kept_with_its_time_and_runs_name_theirs(fresh):
    log = [json.loads(x) for x in (fresh / STUDY / "grids" / "log.jsonl").read_text().splitlines()]
    assert [e["command"] for e in log] == ["run", "run"] and all(e["time"] for e in log)
    a, b = log[0]["grid"], log[1]["grid"]
    assert a != b and (fresh / STUDY / "grids" / f"{a}.yaml").exists() and (fresh / STUDY / "grids" / f"{b}.yaml").exists()
    for p in (fresh / STUDY / "runs").glob("*.parquet"):
        row = pq.read_table(p).to_pylist()[0]
        assert row["grid"] == a  # grid B had nothing left to run
        assert json.loads((fresh / STUDY / "configs" / f"{row['run_id']}.json").read_text())["grid"] == a


def test_an_edited_grid_record_is_named(copy):
    log = [json.loads(x) for x in (copy / STUDY / "grids" / "log.jsonl").read_text().splitlines()]
    path = copy / STUDY / "grids" / f"{log[0]['grid']}.yaml"
    path.write_text(path.read_text().replace("- 9\n", "", 1))  # grid A without its T = 9 points
    r = verify(copy)
    assert r.returncode == 1, r.stdout
    assert f"{path}: its content hashes to" in r.stdout


def test_samples_hold_every_example_with_text_for_the_kept_ones(fresh):
    """The samples contract: rows 0..n-1 of every evaluated example, scores for all, text for the first
    n_samples_kept; each evals value the mean of its metric over them."""
    import pandas as pd

    for p in (fresh / STUDY / "evals").rglob("*.parquet"):
        ev = pq.read_table(p).to_pandas()
        sm = pq.read_table(str(p).replace(f"{os.sep}evals{os.sep}", f"{os.sep}samples{os.sep}")).to_pandas()
        if p.stem.startswith("nll-"):  # the continuous quantities: nothing generated, so no text (test_continuous.py)
            assert sm.output.isna().all() and sm.steps.isna().all() and sorted(sm.example) == list(range(len(sm)))
            continue
        n = int(ev.n_examples.iloc[0])
        assert n == 16 and sorted(sm.example) == list(range(n))
        assert sm.output.notna().tolist() == [True] * 5 + [False] * 11
        per = [json.loads(s) for s in sm.sort_values("example").scores]
        for r in ev.itertuples():
            assert r.value == pytest.approx(sum(x[r.metric] for x in per) / n)
        assert pd.notna(sm.passes).all() and pd.notna(sm.steps).all()
