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
