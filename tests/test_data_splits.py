"""Data that is what it says: train, test and val disjoint under the training stream as it is really
drawn (augmentation included) for every Sudoku size and for Countdown; what each task's generator
can make, checked by `study plan / run / tune` before anything runs; a mask-rate range in a report.
Real tasks, real CLI, a real tiny study (local Ray, Parquet). Run: pytest tests/test_data_splits.py"""
from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from study.cli import app
from tasks import DataBoundError, make_task
from tasks.countdown import CountdownConfig, count_instances, generate_split, instance_key
from tasks.sudoku import (REACHABLE, Sudoku, SudokuConfig, fingerprint, is_valid_solution, iter_solutions,
                          pattern_grid, split_grids)
from tests.helpers import ROOT, tiny_grid


def _keys(grids) -> set[bytes]:
    return {np.asarray(g, dtype=np.int8).tobytes() for g in grids}


def _train_stream(task, batches: int, batch_size: int, seed: int = 0) -> np.ndarray:
    """What training reads: `batches` batches of the task's own train_batch (augmentation included)."""
    gen = torch.Generator().manual_seed(seed)
    return np.concatenate([task.train_batch(batch_size, gen)[0].numpy() for _ in range(batches)])


# ---- Sudoku: disjoint under augmentation, at every size ----------------------------------------
@pytest.mark.parametrize("n, n_train, n_test, batches", [(4, 40, 40, 60), (9, 60, 20, 20), (16, 12, 4, 10),
                                                         (25, 6, 3, 4)])
def test_augmented_training_stream_never_holds_a_test_or_val_grid(n, n_train, n_test, batches):
    """The training stream as drawn (symmetry augmentation on wherever the config allows it) holds no
    test or val grid, and where the split is by symmetry class, no grid of a test or val class. 4x4 is
    split by grid: augmentation used to map training grids onto every test and val grid there."""
    task = Sudoku(SudokuConfig(n=n, n_train=n_train, n_test=n_test, n_val=n_test, mask_rate=0.4))
    task.prepare(None)
    test, val = task.eval_set("test").x0.numpy(), task.eval_set("val").x0.numpy()
    stream = _train_stream(task, batches, 64)
    assert all(is_valid_solution(g, n) for g in stream[:50])
    seen = _keys(stream)
    assert not seen & _keys(test) and not seen & _keys(val)
    if task.cfg.split_by == "class":
        assert task.cfg.augment and len(seen) > n_train  # augmentation is on: new grids, other than train's
        classes = {fingerprint(g, n) for g in stream[:: max(1, len(stream) // 300)]}
        assert not classes & {fingerprint(g, n) for g in test} and not classes & {fingerprint(g, n) for g in val}
    else:
        assert not task.cfg.augment and seen <= _keys(task.train_grids.numpy())


def test_a_split_by_grid_trains_without_augmentation_and_refuses_it_when_asked():
    assert SudokuConfig(n=4).augment is False and SudokuConfig(n=9).augment is True
    assert SudokuConfig(n=9, disjoint="grid").augment is False
    assert SudokuConfig(n=4, augment=False).augment is False
    for kw in (dict(n=4, augment=True), dict(n=9, disjoint="grid", augment=True)):
        with pytest.raises(ValidationError, match="augment: true cannot be used with a split by grid"):
            SudokuConfig(**kw)


def test_a_4x4_grid_asking_augmentation_fails_in_plan_naming_the_key(tmp_path):
    p = tmp_path / "aug4.yaml"
    p.write_text(tiny_grid("aug4").replace("n_test: 16}", "n_test: 16, augment: true}"))
    r = CliRunner().invoke(app, ["plan", str(p)])
    assert r.exit_code == 2 and str(p) in r.output and "'task'" in r.output, r.output
    assert "augment: true cannot be used with a split by grid" in r.output and r.output.count("\n") == 1


# ---- 4x4: what the generator can make ----------------------------------------------------------
def _all_4x4() -> set[bytes]:
    rows = list(itertools.permutations(range(4)))
    return {np.array(g).astype(np.int8).tobytes() for g in itertools.product(rows, repeat=4)
            if is_valid_solution(np.array(g).reshape(16), 4)}


def _symmetries(g: np.ndarray):
    """The generators of the symmetry group applied to one 4x4 grid (their closure is its orbit)."""
    for perm in ([1, 0, 2, 3], [0, 1, 3, 2], [2, 3, 0, 1]):  # lines within a band, bands
        yield g[perm]
        yield g[:, perm]
    yield g.T
    for a, b in itertools.combinations(range(4), 2):  # digit relabelings are made of transpositions
        lab = np.arange(4)
        lab[[a, b]] = [b, a]
        yield lab[g]


def _row_cycle_swaps(M: np.ndarray):
    """Every cycle swap `cycle_swap` can make on one grid: any band, ordered pair of its rows, start column."""
    for r1, r2 in ((0, 1), (1, 0), (2, 3), (3, 2)):
        for start in range(4):
            col_of = np.argsort(M[r1])
            cyc, cur = set(), start
            while cur not in cyc:
                cyc.add(cur)
                cur = col_of[M[r2, cur]]
            S = M.copy()
            idx = sorted(cyc)
            S[r1, idx], S[r2, idx] = M[r2, idx], M[r1, idx]
            yield S


def _grid(k: bytes) -> np.ndarray:
    return np.frombuffer(k, np.int8).reshape(4, 4).astype(np.int64)


@pytest.mark.timeout(120)  # the generator used to search forever past its 192nd grid
def test_the_4x4_chain_reaches_exactly_192_grids_and_then_stops():
    """Every state the chain of `swap_chain` can be in, by exhaustion: a random symmetry of the pattern
    grid (its orbit), then 48 steps of (a cycle swap between two rows of a band, a transposition).
    Each step's set holds 192 of the 288 grids; after 48 steps, one symmetry class."""
    valid = _all_4x4()
    assert len(valid) == 288
    orbit, todo = {pattern_grid(4).astype(np.int8).tobytes()}, [pattern_grid(4)]
    while todo:
        for h in _symmetries(todo.pop()):
            if (k := h.astype(np.int8).tobytes()) not in orbit:
                orbit.add(k)
                todo.append(h)
    states = orbit
    for _ in range(12 * 4):
        states = {np.ascontiguousarray(s.T).astype(np.int8).tobytes() for k in states
                  for s in _row_cycle_swaps(_grid(k))}
        assert len(states) == REACHABLE[4] == 192 and states <= valid
    assert len({fingerprint(_grid(k).reshape(16), 4) for k in states}) == 1
    made = list(iter_solutions(4, seed=0))  # ends after every reachable grid instead of spinning
    assert len(made) == 192 and _keys(made) == states
    with pytest.raises(ValueError, match="192 distinct solved grids: n_train \\+ n_test = 200"):
        split_grids(4, 150, 50, seed=0, by="grid")


def test_each_task_states_what_it_can_make():
    four = Sudoku(SudokuConfig(n=4, n_train=150, n_test=40, n_val=10))
    assert four.max_examples().count == 192
    four.check_data(("test",))  # 190 grids: feasible
    with pytest.raises(DataBoundError) as e:
        four.check_data(("test", "val"))  # 200
    assert e.value.key == "task.n_train + task.n_test + task.n_val" and "150 + 40 + 10 = 200" in str(e.value)
    assert "192" in str(e.value)
    assert Sudoku(SudokuConfig(n=9, n_train=10**7)).max_examples() is None  # classes beyond any split
    # Countdown: the exact count of (operand multiset, target) keys where the range is small
    easy = dict(n_operands=3, operand_min=1, operand_max=12, ops="+-", max_value=99, target_min=1, target_max=99)
    count, exact = count_instances(CountdownConfig(**easy))
    assert exact and count == 1264
    cfg = CountdownConfig(**easy, n_train=900, n_test=300)
    make_task(cfg).check_data(("test",))
    with pytest.raises(DataBoundError, match="task.n_val \\(default: n_test\\): 900 \\+ 300 \\+ 300 = 1500"):
        make_task(cfg).check_data(("test", "val"))
    tiny = CountdownConfig(n_operands=2, operand_min=1, operand_max=4, ops="+", max_value=99, target_min=1,
                           target_max=99, n_train=1, n_test=1)
    brute = {instance_key([a, b], a + b) for a in range(1, 5) for b in range(1, 5)}
    assert count_instances(tiny) == (len(brute), True)
    assert count_instances(CountdownConfig()) == (math.comb(102, 4) * 100, False)  # the bound of a wide range
    # Text8: the corpus slices bound the sequences
    from tasks.text8 import Text8Config

    make_task(Text8Config(seq_len=64, n_test=128)).check_data(("test", "val"))
    with pytest.raises(DataBoundError) as e:
        make_task(Text8Config(seq_len=256, n_test=256)).check_data(("test",))
    assert e.value.key == "task.n_test" and "75 sequences of seq_len 256" in str(e.value)
    make_task(Text8Config(path="no/such/text8")).check_data(("test",))  # read where the trial runs


def _grid_file(tmp_path, name: str, task: str, ev: str) -> str:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"study: {name}\ntask: {task}\nmodel: {{d_model: 16, n_heads: 2}}\n"
                 f"train: {{steps: 4, batch_size: 4}}\neval: {{T: [1], n_examples: 4{ev}}}\n")
    return str(p)


@pytest.mark.parametrize("name, task, ev, cmd, key, bound", [
    ("s4", "{name: sudoku, n: 4, n_train: 150, n_test: 50}", "", "plan",
     "task.n_train + task.n_test", "150 + 50 = 200 examples asked, but the task makes 192 distinct solved 4x4"),
    ("s4v", "{name: sudoku, n: 4, n_train: 150, n_test: 30}", ", split: val", "run",
     "task.n_train + task.n_test + task.n_val (default: n_test)", "150 + 30 + 30 = 210"),
    ("cd", "{name: countdown, n_operands: 3, operand_max: 12, ops: '+-', max_value: 99, target_max: 99, "
           "n_train: 1000, n_test: 300}", "", "plan", "task.n_train + task.n_test", "1,264 distinct (operand"),
    ("t8", "{name: text8, seq_len: 256, n_test: 100}", "", "run", "task.n_test", "holds 75 sequences"),
])
def test_plan_and_run_refuse_data_the_task_cannot_make(tmp_path, name, task, ev, cmd, key, bound):
    path = _grid_file(tmp_path, name, task, ev)
    args = [cmd, path] + (["--results", str(tmp_path / "results")] if cmd == "run" else [])
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {path}: key '{key}': ") and bound in r.output, r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output
    assert not (tmp_path / "results" / name).exists()  # nothing dispatched, nothing written
    # `study status` still reads such a grid (nothing to make there)
    assert CliRunner().invoke(app, ["status", path, "--results", str(tmp_path / "results")]).exit_code == 0


def test_study_tune_refuses_a_val_split_the_generator_cannot_make(tmp_path):
    """4x4, n_train 150 + n_test 30 fits the 192 grids, but tuning scores on val (n_val defaults to
    n_test): 210 grids. `study tune` used to start the trial, which searched for grids forever."""
    raw = {"study": "tv4", "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 150, "n_test": 30},
           "model": {"d_model": 16, "n_heads": 2}, "train": {"steps": 4, "batch_size": 4, "warmup": 1},
           "eval": {"T": [1], "n_examples": 4},
           "search": {"n_trials": 1, "metric": "val_loss", "mode": "min",
                      "params": {"lr": {"dist": "loguniform", "low": 1e-4, "high": 1e-2}}}}
    path = tmp_path / "tv4.yaml"
    path.write_text(yaml.safe_dump(raw))
    r = subprocess.run([sys.executable, "-m", "study.cli", "tune", str(path), "--results", str(tmp_path / "res")],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert f"{path}: key 'task.n_train + task.n_test + task.n_val (default: n_test)'" in r.stderr
    assert "150 + 30 + 30 = 210" in r.stderr and "192" in r.stderr
    assert not (tmp_path / "res" / "tv4").exists()


# ---- Countdown: disjoint as drawn --------------------------------------------------------------
def test_countdown_training_stream_never_holds_a_test_or_val_instance():
    """Countdown has no augmentation: training draws rows of the train split, and the split is one
    stream of distinct (operand multiset, target) keys; checked on what train_batch really returns."""
    cfg = CountdownConfig(n_operands=3, operand_max=12, ops="+-", max_value=99, target_max=99, n_train=300,
                          n_test=100, n_val=100)
    task = make_task(cfg)
    task.prepare(None)

    def keys(x0) -> set:
        return {instance_key(*task.decode_input(r)) for r in x0}

    test, val = keys(task.eval_set("test").x0), keys(task.eval_set("val").x0)
    stream = keys(torch.from_numpy(_train_stream(task, 40, 64)))
    assert len(test) == 100 and len(val) == 100 and not test & val
    assert not stream & test and not stream & val and len(stream) > 250
    full = generate_split(cfg, val=True)
    assert stream <= {instance_key(o, t) for o, t in zip(full["train_operands"].tolist(),
                                                         full["train_targets"].tolist())}


# ---- a mask-rate range reaches the report -------------------------------------------------------
# slow set (18 s of the default suite, measured under load); the default suite keeps test_figures_scale's mask-rate panels
@pytest.mark.slow
def test_report_of_a_study_with_a_mask_rate_range(tmp_path):
    """`mask_rate: [low, high]` (drawn per puzzle) used to fail `study report` with an internal error
    (TypeError: type list doesn't define __round__)."""
    from tests.helpers import study

    g = tmp_path / "mr.yaml"
    g.write_text(tiny_grid("mrange", steps=10, n_test=8, axes="L: [1]").replace("mask_rate: 0.4",
                                                                                 "mask_rate: [0.3, 0.5]"))
    res = str(tmp_path / "results")
    r = study("run", str(g), "--results", res, "--num-cpus", "1", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = study("report", "--figure", "all", "--results", res, "--study", "mrange", timeout=600)
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stdout + r.stderr
    md = open(os.path.join(res, "mrange", "figures", "report.md"), encoding="utf-8").read()
    assert "sudoku 4x4, 30-50% masked" in md
    assert "mask-rate: not drawn: mask-rate needs Sudoku runs of one grid size at two or more mask rates " \
           "(have sudoku 4x4, 30-50% masked)" in r.stderr
    from analysis.load import load_study

    runs = load_study(res, "mrange").runs
    assert runs["mask_rate"].isna().all() and list(runs["task_variant"]) == ["sudoku 4x4, 30-50% masked"]
