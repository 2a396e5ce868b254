"""A hostile store: crafted weights/checkpoints never run code; study names never escape the store.

Run: pytest tests/test_security.py -q   (tiny real trainings in-process, two `study` subprocesses)
"""
from __future__ import annotations

import io
import os
import pathlib

import pytest
import torch

from model import Trainer
from model.train import CheckpointError
from store import Store, is_safe_name
from study.spec.grid import GridError, expand, load_grid
from study.engine.trial import execute
from study.engine.options import TrialOptions
from tests.helpers import study, tiny_grid

GRID = tiny_grid("sec", n_test=8, T="[2]", retries=None, axes="seed: [0, 1]")
PUZZLES = "12.43.12.14343.1\n.2343412214.4321\n"  # 4x4, '.' blanks; solution 1234/3412/2143/4321


class Crafted:
    """Unpickling it writes a marker file: what a crafted weights file would do to its loader."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.write_text, (pathlib.Path(self.marker), "code ran"))


def crafted_bytes(marker) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": Crafted(str(marker)), "step": 0}, buf)
    return buf.getvalue()


@pytest.fixture
def study_dir(tmp_path):
    (tmp_path / "sec.yaml").write_text(GRID)
    grid = load_grid(str(tmp_path / "sec.yaml"))
    return tmp_path, grid, Store(str(tmp_path / "results"), grid.study)


def test_crafted_weights_are_refused_by_study_eval_and_genuine_ones_load(study_dir):
    tmp, grid, store = study_dir
    run = grid.runs[0]
    execute(run, store, TrialOptions("test"))
    (tmp / "p.txt").write_text(PUZZLES)
    ok = study("eval", run.run_id, "--puzzles", str(tmp / "p.txt"), "--results", str(tmp / "results"))
    assert ok.returncode == 0, ok.stdout + ok.stderr  # genuine weights load with weights_only=True

    marker = tmp / "marker"
    store.write_bytes(store.weights_path(run.run_id), crafted_bytes(marker))
    r = study("eval", run.run_id, "--puzzles", str(tmp / "p.txt"), "--results", str(tmp / "results"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refused" in r.stderr and f"weights/{run.run_id}.pt" in r.stderr
    assert "Traceback" not in r.stderr
    assert not marker.exists()


def test_crafted_checkpoint_is_refused_on_resume_and_genuine_one_resumes(study_dir):
    # A crafted pickle never runs: it is refused, set aside under quarantine/ (the store heals: the run
    # trains from scratch instead of failing for good), and the file is kept, not deleted.
    tmp, grid, store = study_dir
    bad, good = grid.runs
    marker = tmp / "marker"
    store.write_bytes(store.checkpoint_path(bad.run_id), crafted_bytes(marker))
    assert execute(bad, store, TrialOptions("test"))["status"] == "done"
    log = store.read_bytes(store.path("logs", f"{bad.run_id}.log")).decode()
    assert f"checkpoints/{bad.run_id}.pt" in log and "refused" in log, log
    assert not marker.exists()
    store.write_bytes(store.weights_path(bad.run_id), crafted_bytes(marker))  # the weights path too
    assert execute(bad, store, TrialOptions("test"))["status"] == "done"
    log = store.read_bytes(store.path("logs", f"{bad.run_id}.log")).decode()
    assert f"weights/{bad.run_id}.pt" in log and "refused" in log, log
    assert not marker.exists()
    aside = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(store.dir, "quarantine")) for f in fs]
    assert len(aside) == 2 and all(open(p, "rb").read() == crafted_bytes(marker) for p in aside)

    # a genuine checkpoint at step 10 of 20: the run resumes from it and finishes
    from study.engine.trial import save_checkpoint
    from tasks import make_task

    task = make_task(good.task)
    task.prepare(store.data_dir())
    from model import SeqSpec

    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    tr = Trainer(good.model, good.train, spec, lambda step, g: task.train_batch(good.train.batch_size, g))
    tr.train(until=10)
    save_checkpoint(store, good, tr.state_dict())  # as the trainer writes it: naming the run, its digest beside
    row = execute(good, store, TrialOptions("test"))
    assert row["status"] == "done"
    log = store.read_bytes(store.path("logs", f"{good.run_id}.log")).decode()
    assert "resuming from checkpoint at step 10" in log
    assert sorted(store.read("history", filter_run=good.run_id).step) == [0, 5, 10, 15, 19]


def test_trainer_load_refuses_a_crafted_file(tmp_path):
    marker = tmp_path / "marker"
    (tmp_path / "evil.pt").write_bytes(crafted_bytes(marker))
    from model.train import load_state

    with pytest.raises(CheckpointError, match="refused"):
        load_state(str(tmp_path / "evil.pt"))
    (tmp_path / "cut.pt").write_bytes(crafted_bytes(marker)[:50])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_state(str(tmp_path / "cut.pt"))
    assert not marker.exists()


@pytest.mark.parametrize("name", ["name\n", "a..b", "../x", "a/b", ".hidden", "x" * 201, 7])
def test_one_name_rule_for_store_and_grid(tmp_path, name):
    """`^...$` let "name\n" through (a directory with a newline); "a..b" passed plan, failed status."""
    assert not is_safe_name(name)
    with pytest.raises(ValueError):
        Store(str(tmp_path), name)
    with pytest.raises(GridError, match="study"):
        expand({"study": name, "task": {"name": "sudoku", "n": 4}}, "g.yaml")
    assert os.listdir(tmp_path) == []


def test_a_grid_named_by_its_file_follows_the_rule_in_plan(tmp_path):
    (tmp_path / "a..b.yaml").write_text("task: {name: sudoku, n: 4}\n")
    r = study("plan", str(tmp_path / "a..b.yaml"))
    assert r.returncode == 2 and "study" in r.stderr and "a..b" in r.stderr and "Traceback" not in r.stderr
    r = study("status", str(tmp_path / "a..b.yaml"), "--results", str(tmp_path / "results"))
    assert r.returncode == 2 and "a..b" in r.stderr and "Traceback" not in r.stderr
    assert is_safe_name("a.b-c_1") and is_safe_name("x" * 200)


def test_every_reader_refuses_a_symlink_out_of_the_store(study_dir):
    """`study run` refuses a symlink out of the study's directory before writing; the read paths refuse it
    too: status, report and verify on a runs/ that links to an outside folder, eval on weights linked from
    outside, and the Python API (store.Store.refuse_links_out)."""
    import shutil

    from typer.testing import CliRunner

    from store import OutsideStore
    from study.cli import app

    tmp, grid, store = study_dir
    run = grid.runs[0]
    execute(run, store, TrialOptions("test"))
    (tmp / "p.txt").write_text(PUZZLES)
    results = str(tmp / "results")

    def cli(*args):
        return CliRunner().invoke(app, list(args))

    assert cli("status", str(tmp / "sec.yaml"), "--results", results).exit_code == 0  # before: all read
    outside = tmp / "outside"
    outside.mkdir()
    runs = store.path("runs")
    shutil.move(runs, outside / "runs")
    os.symlink(outside / "runs", runs)
    for args, code in ((("status", str(tmp / "sec.yaml")), 2),
                       (("report", "--study", "sec", "--out", str(tmp / "figs")), 2),
                       (("verify", "--study", "sec"), 1)):  # verify: a failed check of the store, exit 1
        r = cli(*args, "--results", results)
        assert r.exit_code == code, (args, r.exit_code, r.output)
        assert f"error: {runs} is a symlink to {outside}/runs, outside the store" in r.output, (args, r.output)
        assert len(r.output.strip().splitlines()) == 1, r.output
    assert not os.path.exists(tmp / "figs")
    import rmdm_study as rs

    with pytest.raises(OutsideStore, match="outside the store"):
        rs.open(results).study("sec")
    os.remove(runs)
    shutil.move(outside / "runs", runs)

    weights = store.weights_path(run.run_id)  # weights read through a link to a file outside
    shutil.move(weights, outside / "w.pt")
    os.symlink(outside / "w.pt", weights)
    r = cli("eval", run.run_id, "--puzzles", str(tmp / "p.txt"), "--results", results)
    assert r.exit_code == 2 and f"error: {weights} is a symlink to {outside}/w.pt, outside the store" in r.output, r.output


def test_prune_migrate_and_tune_refuse_a_runs_folder_linked_out_of_the_store(tmp_path):
    """The readers that also move or rewrite files (`study prune`, `study migrate`) and `study tune` refuse a
    runs/ that is a symlink out of the study's directory, in one line, exit 2, as `study run` does; the files
    the link points at are left as they were (before, prune and migrate read through it, tune trained)."""
    from typer.testing import CliRunner

    from store import format as store_format
    from study.cli import app

    root = pathlib.Path(__file__).resolve().parents[1]
    (tmp_path / "g.yaml").write_text(tiny_grid("lk"))
    results, outside = tmp_path / "results", tmp_path / "outside"
    outside.mkdir()
    (outside / "x.parquet").write_bytes(b"not the store's")
    for name in ("lk", "tune_sudoku_lr"):
        (results / name).mkdir(parents=True)
        (results / name / store_format.FILE).write_bytes(store_format.stamp_bytes())
        os.symlink(outside, results / name / "runs")
    for args, study_name in ((("prune", str(tmp_path / "g.yaml"), "--apply"), "lk"), (("migrate", "--study", "lk"), "lk"),
                             (("tune", str(root / "grids" / "tune_sudoku_lr.yaml")), "tune_sudoku_lr")):
        r = CliRunner().invoke(app, [*args, "--results", str(results)])
        runs = results / study_name / "runs"
        assert r.exit_code == 2, (args, r.exit_code, r.output)
        assert f"error: {runs} is a symlink to {outside}, outside the store" in r.output, (args, r.output)
        assert len(r.output.strip().splitlines()) == 1, r.output
    assert os.listdir(outside) == ["x.parquet"]
