"""Sudoku n x n (n a square): generator of solved grids, puzzles, and the Valid Puzzle Rate.

Solved grids come from a randomized depth-first search with constraint propagation
(minimum-remaining-values cell choice, shuffled digit order) started from an empty grid, so
they fall in many symmetry classes; symmetry transforms of a grid (relabeling, row/column
moves within bands/stacks, band/stack moves, transposition) are used only to augment the
training split, never to make new test grids. Tokens are digits 0..n-1 (shown 1..n).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
from typing import Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from tasks.base import EvalSet, Task, TaskConfig


class SudokuConfig(TaskConfig):
    name: Literal["sudoku"] = "sudoku"
    n: int = Field(9, description="grid side: 4, 9, 16 or 25")
    mask_rate: float = Field(0.3, gt=0, le=1, description="share of cells blanked in each puzzle")
    n_train: int = Field(2000, ge=1, description="distinct solved training grids (augmented by symmetry)")
    n_test: int = Field(500, ge=1, description="test puzzles (fixed; from grids never seen in training)")
    structural_pos: bool = Field(True, description="embed positions as row + column + box ids; off = one id per cell")
    augment: bool = True
    data_seed: int = 0

    @field_validator("n")
    @classmethod
    def _square(cls, v: int) -> int:
        if v not in (4, 9, 16, 25):
            raise ValueError(f"n must be one of 4, 9, 16, 25 (got {v})")
        return v


def random_solution(n: int, rng: random.Random, max_nodes: int = 200_000) -> list[int] | None:
    """One solved grid (row-major digits 0..n-1) by randomized MRV search; None if the node
    budget runs out (the caller restarts with fresh randomness)."""
    b = math.isqrt(n)
    full = (1 << n) - 1
    rows, cols, boxes = [0] * n, [0] * n, [0] * n
    grid = [-1] * (n * n)
    box_of = [(i // n // b) * b + (i % n) // b for i in range(n * n)]
    empty = set(range(n * n))
    nodes = 0

    def solve() -> bool:
        nonlocal nodes
        nodes += 1
        if nodes > max_nodes:
            return False
        if not empty:
            return True
        best, best_cand, best_cnt = -1, 0, n + 1
        for i in empty:
            cand = full & ~(rows[i // n] | cols[i % n] | boxes[box_of[i]])
            cnt = cand.bit_count()
            if cnt < best_cnt:
                best, best_cand, best_cnt = i, cand, cnt
                if cnt <= 1:
                    break
        if best_cnt == 0:
            return False
        r, c, bx = best // n, best % n, box_of[best]
        digits = [d for d in range(n) if best_cand >> d & 1]
        rng.shuffle(digits)
        empty.discard(best)
        for d in digits:
            bit = 1 << d
            rows[r] |= bit; cols[c] |= bit; boxes[bx] |= bit
            grid[best] = d
            if solve():
                return True
            rows[r] &= ~bit; cols[c] &= ~bit; boxes[bx] &= ~bit
            if nodes > max_nodes:
                break
        grid[best] = -1
        empty.add(best)
        return False

    return grid if solve() else None


def generate_solutions(n: int, count: int, seed: int) -> np.ndarray:
    """`count` distinct solved grids, shape (count, n*n), deterministic from the seed."""
    rng = random.Random(seed)
    seen: set[bytes] = set()
    out = []
    while len(out) < count:
        g = random_solution(n, rng)
        if g is None:
            continue
        key = bytes(g)
        if key not in seen:
            seen.add(key)
            out.append(g)
    return np.asarray(out, dtype=np.int64)


def is_valid_solution(grid: np.ndarray, n: int) -> bool:
    """Every row, column and box holds each digit 0..n-1 exactly once."""
    g = np.asarray(grid).reshape(n, n)
    if g.min() < 0 or g.max() >= n:
        return False
    b = math.isqrt(n)
    want = np.arange(n)
    boxes = g.reshape(b, b, b, b).transpose(0, 2, 1, 3).reshape(n, n)
    return all((np.sort(m, axis=1) == want).all() for m in (g, g.T, boxes))


def random_symmetry(grids: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """Apply one random validity-preserving transform per grid. grids: (B, n*n)."""
    B = grids.shape[0]
    b = math.isqrt(n)
    g = grids.view(B, n, n)

    def line_perm() -> torch.Tensor:  # (B, n): bands permuted, rows within each band permuted
        bands = torch.argsort(torch.rand(B, b, generator=gen), dim=1)  # (B, b)
        within = torch.argsort(torch.rand(B, b, b, generator=gen), dim=2)  # (B, b, b)
        return (bands.unsqueeze(2) * b + within).reshape(B, n)

    rp, cp = line_perm(), line_perm()
    g = torch.gather(g, 1, rp.unsqueeze(2).expand(B, n, n))
    g = torch.gather(g, 2, cp.unsqueeze(1).expand(B, n, n))
    flip = torch.rand(B, generator=gen) < 0.5
    g = torch.where(flip.view(B, 1, 1), g.transpose(1, 2), g)
    relabel = torch.argsort(torch.rand(B, n, generator=gen), dim=1)  # (B, n)
    g = torch.gather(relabel, 1, g.reshape(B, n * n))
    return g.reshape(B, n * n)


class Sudoku(Task):
    name = "sudoku"
    metric_names = ("vpr", "cell_acc", "exact")
    primary_metric = "vpr"

    def __init__(self, cfg: SudokuConfig):
        super().__init__(cfg)
        self.cfg: SudokuConfig = cfg
        self.n = cfg.n
        self.n_blank = max(1, round(cfg.mask_rate * cfg.n * cfg.n))
        self.train_grids: torch.Tensor | None = None
        self.test: EvalSet | None = None

    @property
    def vocab_size(self) -> int:
        return self.n

    def pos_ids(self) -> tuple[tuple[int, ...], ...]:
        n, b = self.n, math.isqrt(self.n)
        if self.cfg.structural_pos:
            return tuple((i // n, i % n, (i // n // b) * b + (i % n) // b) for i in range(n * n))
        return tuple((i,) for i in range(n * n))

    def pos_sizes(self) -> tuple[int, ...]:
        return (self.n, self.n, self.n) if self.cfg.structural_pos else (self.n * self.n,)

    # ---- data ------------------------------------------------------------------------------
    def _data_key(self) -> str:
        c = self.cfg
        blob = json.dumps({"v": 1, "n": c.n, "n_train": c.n_train, "n_test": c.n_test, "seed": c.data_seed})
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def prepare(self, cache_dir: str | None) -> None:
        if self.train_grids is not None:
            return
        path = os.path.join(cache_dir, f"sudoku{self.n}-{self._data_key()}.npz") if cache_dir else None
        if path and os.path.exists(path):
            with np.load(path) as z:
                train, test = z["train"], z["test"]
        else:
            grids = generate_solutions(self.n, self.cfg.n_train + self.cfg.n_test, self.cfg.data_seed)
            train, test = grids[: self.cfg.n_train], grids[self.cfg.n_train :]
            if path:
                os.makedirs(cache_dir, exist_ok=True)
                tmp = f"{path}.tmp-{os.getpid()}.npz"
                np.savez_compressed(tmp, train=train, test=test)
                os.replace(tmp, path)
        self.train_grids = torch.from_numpy(train)
        test_x0 = torch.from_numpy(test)
        gen = torch.Generator().manual_seed(self.cfg.data_seed + 7919)
        self.test = EvalSet(test_x0, self._givens(test_x0.shape[0], gen))

    def _givens(self, B: int, gen: torch.Generator) -> torch.Tensor:
        """(B, N) bool: exactly n_blank cells per puzzle are blank, the rest given."""
        N = self.n * self.n
        rank = torch.argsort(torch.rand(B, N, generator=gen), dim=1).argsort(dim=1)
        return rank >= self.n_blank

    def train_batch(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, self.train_grids.shape[0], (batch_size,), generator=gen)
        x0 = self.train_grids[idx]
        if self.cfg.augment:
            x0 = random_symmetry(x0, self.n, gen)
        return x0, self._givens(batch_size, gen)

    def eval_set(self, split: str = "test") -> EvalSet:
        if split != "test":
            raise ValueError(f"unknown split {split!r}; sudoku has: test")
        return self.test

    # ---- scoring ---------------------------------------------------------------------------
    def score(self, output: torch.Tensor, ev: EvalSet) -> list[dict[str, float]]:
        out = output.cpu().numpy()
        ref, cond = ev.x0.cpu().numpy(), ev.cond.cpu().numpy()
        rows = []
        for o, r, c in zip(out, ref, cond):
            keeps = bool((o[c] == r[c]).all())
            valid = keeps and is_valid_solution(o, self.n)
            free = ~c
            rows.append({
                "vpr": float(valid),
                "cell_acc": float((o[free] == r[free]).mean()) if free.any() else 1.0,
                "exact": float((o == r).all()),
            })
        return rows

    def render(self, tokens: torch.Tensor, cond: torch.Tensor | None = None) -> str:
        digits = "123456789ABCDEFGHIJKLMNOP"
        t = tokens.tolist()
        keep = cond.tolist() if cond is not None else [True] * len(t)
        return "".join(digits[v] if k and 0 <= v < self.n else "." for v, k in zip(t, keep))
