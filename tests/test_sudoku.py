"""Sudoku generator, puzzles and VPR on hand-made grids. Run: pytest tests/test_sudoku.py"""
from __future__ import annotations

import numpy as np
import torch

from tasks.base import EvalSet
from tasks.sudoku import Sudoku, SudokuConfig, generate_solutions, is_valid_solution, random_symmetry

VALID = np.array([int(c) - 1 for c in (
    "534678912672195348198342567859761423426853791713924856961537284287419635345286179")])


def test_generated_grids_are_valid_distinct_and_deterministic():
    a = generate_solutions(9, 30, seed=3)
    assert all(is_valid_solution(g, 9) for g in a)
    assert len({g.tobytes() for g in a}) == 30
    assert (a == generate_solutions(9, 30, seed=3)).all()
    assert not (a == generate_solutions(9, 30, seed=4)).all()


def test_symmetry_augmentation_keeps_grids_valid():
    grids = torch.from_numpy(generate_solutions(9, 8, seed=0))
    out = random_symmetry(grids, 9, torch.Generator().manual_seed(0))
    assert all(is_valid_solution(g, 9) for g in out.numpy())
    assert not torch.equal(out, grids)


def test_vpr_on_hand_made_grids():
    task = Sudoku(SudokuConfig(n=9))
    ref = torch.from_numpy(VALID).unsqueeze(0)
    cond = torch.zeros_like(ref, dtype=torch.bool)
    cond[0, :40] = True
    ev = EvalSet(ref, cond)
    assert task.score(ref, ev)[0]["vpr"] == 1.0
    # a swap of two digits in a row breaks the column rule
    bad = ref.clone()
    bad[0, 79], bad[0, 80] = bad[0, 80].item(), bad[0, 79].item()
    assert task.score(bad, ev)[0]["vpr"] == 0.0
    # a different valid grid (relabelled) that changes a given is not valid for this puzzle
    relabel = torch.from_numpy((VALID + 1) % 9).unsqueeze(0)
    assert is_valid_solution(relabel[0].numpy(), 9)
    assert task.score(relabel, ev)[0]["vpr"] == 0.0
    # ... but it is when nothing was given
    assert task.score(relabel, EvalSet(ref, torch.zeros_like(cond)))[0]["vpr"] == 1.0
    # a leftover mask token (id 9) is never valid
    masked = ref.clone()
    masked[0, 50] = 9
    assert task.score(masked, ev)[0]["vpr"] == 0.0


def test_puzzles_blank_the_configured_share(tiny_sudoku):
    x0, cond = tiny_sudoku.train_batch(16, torch.Generator().manual_seed(0))
    assert ((~cond).sum(1) == round(0.4 * 16)).all()
    assert all(is_valid_solution(g, 4) for g in x0.numpy())


# ---- generator at every size, symmetry classes, splits ------------------------------------

import pytest  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from tasks.sudoku import (PuzzleFileError, fingerprint, format_puzzles, iter_puzzles, pattern_grid,  # noqa: E402
                          split_grids, symmetry_np)


@pytest.mark.parametrize("n, count", [(4, 30), (16, 20), (25, 6)])
def test_generator_handles_every_size(n, count):
    a = generate_solutions(n, count, seed=1)
    assert a.shape == (count, n * n) and all(is_valid_solution(g, n) for g in a)
    assert len({g.tobytes() for g in a}) == count
    assert (a == generate_solutions(n, count, seed=1)).all()


@pytest.mark.parametrize("n", [9, 16])
def test_fingerprint_is_a_symmetry_invariant(n):
    grids = generate_solutions(n, 12, seed=5)
    moved = random_symmetry(torch.from_numpy(grids), n, torch.Generator().manual_seed(2)).numpy()
    also = symmetry_np(grids.reshape(-1, n, n), np.random.default_rng(3)).reshape(-1, n * n)
    for g, h, k in zip(grids, moved, also):
        assert not (g == h).all()
        assert fingerprint(g, n) == fingerprint(h, n) == fingerprint(k, n)


def test_generator_leaves_the_single_orbit():
    """Symmetries of one base grid all share one fingerprint; generated grids almost never do."""
    base = np.broadcast_to(pattern_grid(9), (50, 9, 9)).copy()
    orbit = symmetry_np(base, np.random.default_rng(0)).reshape(50, 81)
    assert len({fingerprint(g, 9) for g in orbit}) == 1
    for n, count in ((9, 200), (25, 10)):
        fps = {fingerprint(g, n) for g in generate_solutions(n, count, seed=0)}
        assert len(fps) >= 0.98 * count, (n, len(fps))


def test_train_and_test_share_no_symmetry_class():
    task = Sudoku(SudokuConfig(n=9, n_train=300, n_test=100, data_seed=4))
    task.prepare(None)
    train = {fingerprint(g, 9) for g in task.train_grids.numpy()}
    test = [fingerprint(g, 9) for g in task.test.x0.numpy()]
    assert len(test) == 100 and len(set(test)) == 100 and not train & set(test)
    # 4x4 has two classes: its split is disjoint by grid, and 'class' is refused
    tr, te = split_grids(4, 40, 20, seed=1, by="grid")
    assert not {g.tobytes() for g in tr} & {g.tobytes() for g in te}
    with pytest.raises(ValidationError, match="only two symmetry classes"):
        SudokuConfig(n=4, disjoint="class")


def test_data_is_cached_once_and_reloaded(tmp_path):
    a = Sudoku(SudokuConfig(n=9, n_train=30, n_test=10))
    a.prepare(str(tmp_path))
    assert len(list(tmp_path.iterdir())) == 1
    b = Sudoku(SudokuConfig(n=9, n_train=30, n_test=10))
    b.prepare(str(tmp_path))
    assert torch.equal(a.train_grids, b.train_grids) and torch.equal(a.test.cond, b.test.cond)


def test_mask_rate_fixed_share_or_range():
    fixed = Sudoku(SudokuConfig(n=25, mask_rate=0.8, n_train=4, n_test=3))
    assert ((~fixed._givens(5, torch.Generator().manual_seed(0))).sum(1) == 500).all()
    rng = Sudoku(SudokuConfig(n=9, mask_rate=(0.2, 0.6), n_train=4, n_test=3))
    blanks = (~rng._givens(400, torch.Generator().manual_seed(0))).sum(1)
    assert blanks.min() >= round(0.2 * 81) and blanks.max() <= round(0.6 * 81) and len(set(blanks.tolist())) > 20
    for bad in (0.0, 1.5, (0.6, 0.2), (0.0, 0.5)):
        with pytest.raises(ValidationError, match="mask_rate"):
            SudokuConfig(mask_rate=bad)


# ---- external puzzle files ----------------------------------------------------------------
SOL = "".join(str(d + 1) for d in VALID)
QUIZ = "".join("." if i % 3 == 0 else ch for i, ch in enumerate(SOL))


def test_read_lines_with_dots_zeros_and_comments(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text(f"# a header comment\n{QUIZ}  easy one\n\n{QUIZ.replace('.', '0')}\t#2\n{SOL}\n")
    (pf,) = iter_puzzles(str(p))  # one chunk: the whole file
    assert pf.fmt == "lines" and pf.givens.shape == (3, 81) and pf.solutions is None
    assert (pf.givens[0] == pf.givens[1]).all() and (pf.givens[0] == -1).sum() == 27
    assert pf.comments == ["  easy one", "\t#2", ""]
    out = format_puzzles(pf, np.stack([VALID] * 3)).splitlines()
    assert out == [SOL + "  easy one", SOL + "\t#2", SOL]


def test_read_csv_quizzes_solutions(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text(f"quizzes,solutions\n{QUIZ.replace('.', '0')},{SOL}\n{SOL},{SOL}\n")
    (pf,) = iter_puzzles(str(p))  # one chunk: the whole file
    assert pf.fmt == "csv" and (pf.solutions[0] == VALID).all() and (pf.givens[1] == VALID).all()
    out = format_puzzles(pf, np.stack([VALID] * 2)).splitlines()
    assert out[0] == "quizzes,solutions" and out[1] == f"{QUIZ.replace('.', '0')},{SOL}"


@pytest.mark.parametrize("text, where, what", [
    (f"{QUIZ}\n{QUIZ[:80]}\n", ":2:", "expected 81 cells"),
    (f"{QUIZ}\n\n{QUIZ[:40]}x{QUIZ[41:]}\n", ":3:", "bad character 'X' at cell 41"),
    (f"quizzes,answers\n{QUIZ},{SOL}\n", ":1:", "CSV header"),
    (f"quizzes,solutions\n{QUIZ},{SOL}\n{QUIZ}\n", ":3:", "expected 2 comma-separated fields"),
    (f"quizzes,solutions\n{QUIZ},{SOL[::-1]}\n", ":2:", "not a valid grid keeping"),
    ("\n\n", "", "no puzzles"),
])
def test_malformed_puzzle_files_fail_with_the_line_number(tmp_path, text, where, what):
    p = tmp_path / "bad.txt"
    p.write_text(text)
    with pytest.raises(PuzzleFileError) as e:
        list(iter_puzzles(str(p)))
    assert str(e.value).startswith(str(p) + where) and what in str(e.value), str(e.value)


def test_train_grids_do_not_depend_on_n_test():
    """n_test is an evaluation-only field (not in the run id): the training grids must not move with it."""
    a_train, a_test = split_grids(9, 40, 10, seed=2)
    b_train, b_test = split_grids(9, 40, 30, seed=2)
    assert (a_train == b_train).all() and (a_test == b_test[:10]).all()
    assert (generate_solutions(9, 20, seed=2) == generate_solutions(9, 700, seed=2)[:20]).all()


def test_a_study_keeps_data_an_older_generator_cached(tmp_path):
    cfg = SudokuConfig(n=4, n_train=12, n_test=6)
    old = Sudoku(cfg)
    legacy = tmp_path / f"sudoku4-{old._data_key(1)}.npz"
    grids = generate_solutions(4, 18, seed=9)  # any grids but the config's (v1 was the MRV search)
    np.savez_compressed(legacy, train=grids[:12], test=grids[12:])
    task = Sudoku(cfg)
    task.prepare(str(tmp_path))  # a reader reads today's format only: the older file is not read
    assert not (task.train_grids.numpy() == grids[:12]).all()
    (tmp_path / f"sudoku4-{old._data_key()}.npz").unlink()
    task = Sudoku(cfg)  # `study migrate` adopts it under today's key
    assert task.upgrade_data(str(tmp_path)) == [f"{tmp_path}/sudoku4-{old._data_key()}.npz: the study's Sudoku data "
                                                f"of generator v1 ({legacy.name}) adopted"]
    task.prepare(str(tmp_path))
    assert (task.train_grids.numpy() == grids[:12]).all() and len(list(tmp_path.iterdir())) == 2
    assert task.upgrade_data(str(tmp_path)) == []  # once


# ---- validation split ----------------------------------------------------------------------
def _split_hash(ev: EvalSet) -> str:
    import hashlib

    return hashlib.sha256(ev.x0.numpy().tobytes() + ev.cond.numpy().tobytes()).hexdigest()[:16]


def test_val_split_is_disjoint_from_train_and_test_and_test_is_unchanged(tmp_path):
    from tasks.sudoku import fingerprint

    for kw, key, test_hash in ((dict(n=9, n_train=60, n_test=20, data_seed=1), "class", "d58caedea3956ab5"),
                               (dict(n=4, n_train=30, n_test=12), "grid", "4784b503c3937621")):
        task = Sudoku(SudokuConfig(**kw, n_val=15))
        task.prepare(str(tmp_path))
        test, val = task.eval_set("test"), task.eval_set("val")
        assert _split_hash(test) == test_hash  # the test set made before a val split existed
        n = kw["n"]
        k = (lambda g: fingerprint(g.numpy(), n)) if key == "class" else (lambda g: bytes(g.tolist()))
        tr, te, va = ({k(g) for g in grids} for grids in (task.train_grids, test.x0, val.x0))
        assert len(va) == len(val) == 15 and not va & tr and not va & te and not te & tr
        assert all(is_valid_solution(g.numpy(), n) for g in val.x0)
        assert (val.cond.sum(1) == test.cond.sum(1)[0]).all()  # the same masking as the test puzzles
        again = Sudoku(SudokuConfig(**kw, n_val=15))  # from the cache: the same val set
        again.prepare(str(tmp_path))
        assert _split_hash(again.eval_set("val")) == _split_hash(val)


def test_cached_data_of_another_split_is_never_reused(tmp_path):
    """A v1 cache file (MRV search, split by grid) used to be loaded for a class-disjoint config."""
    cfg = SudokuConfig(n=9, n_train=20, n_test=5)
    task = Sudoku(cfg)
    fake = np.stack([VALID] * 25)  # what an old grid-split file would hold
    old = tmp_path / f"sudoku9-{task._data_key(1)}.npz"
    np.savez(old, train=fake[:20], test=fake[20:])
    assert task.upgrade_data(str(tmp_path)) == []
    task.prepare(str(tmp_path))
    assert not (task.train_grids.numpy() == VALID).all(axis=1).any()  # regenerated, not the v1 file
    new = tmp_path / f"sudoku9-{task._data_key()}.npz"
    with np.load(new) as z:
        assert '"split_by": "class"' in str(z["meta"]) and '"version": 3' in str(z["meta"])
    # a grid-split config may still take over its study's v1 file
    g = Sudoku(SudokuConfig(n=9, n_train=20, n_test=5, disjoint="grid"))
    np.savez(tmp_path / f"sudoku9-{g._data_key(1)}.npz", train=fake[:20], test=fake[20:])
    assert len(g.upgrade_data(str(tmp_path))) == 1
    g.prepare(str(tmp_path))
    assert (g.train_grids.numpy() == VALID).all()
    # a file under today's key that records another split fails clearly instead of being used
    c = Sudoku(SudokuConfig(n=9, n_train=20, n_test=5, data_seed=4))
    np.savez(tmp_path / f"sudoku9-{c._data_key()}.npz", train=fake[:20], test=fake[20:],
             meta=np.array('{"version": 3, "n": 9, "n_train": 20, "n_test": 5, "seed": 4, "split_by": "grid"}'))
    import pytest

    with pytest.raises(ValueError, match="split_by"):
        c.prepare(str(tmp_path))
