"""Sudoku's solved grids: the cycle-swap Markov chain, the search it is checked against, symmetry
fingerprints and the train / test / validation splits (see tasks/sudoku.py's docstring for the method).
Split out of tasks/sudoku.py; tasks.sudoku re-exports every public name."""
from __future__ import annotations

import hashlib
import itertools
import math
from typing import Iterator, Literal

import numpy as np

from tasks.base import torch  # imported on first use

DIGITS = "123456789ABCDEFGHIJKLMNOP"  # tokens 0..n-1 as shown: 1..n, then A..P

# ---- solved grids ------------------------------------------------------------------------
def pattern_grid(n: int) -> np.ndarray:
    """The textbook valid grid (n, n): row r is the digits shifted by b*(r % b) + r // b."""
    b = math.isqrt(n)
    r, c = np.arange(n)[:, None], np.arange(n)[None, :]
    return (b * (r % b) + r // b + c) % n


def symmetry_np(G: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One random validity-preserving symmetry per grid. G: (B, n, n)."""
    B, n, _ = G.shape
    b = math.isqrt(n)

    def line_perm() -> np.ndarray:  # (B, n): bands permuted, lines within each band permuted
        bands = np.argsort(rng.random((B, b)), axis=1)
        within = np.argsort(rng.random((B, b, b)), axis=2)
        return (bands[:, :, None] * b + within).reshape(B, n)

    rp, cp = line_perm(), line_perm()
    G = G[np.arange(B)[:, None, None], rp[:, :, None], cp[:, None, :]]
    flip = rng.random(B) < 0.5
    G = np.where(flip[:, None, None], G.transpose(0, 2, 1), G)
    relabel = np.argsort(rng.random((B, n)), axis=1)  # (B, n) new label of each digit
    return np.take_along_axis(relabel, G.reshape(B, n * n), axis=1).reshape(B, n, n)


def cycle_swap(G: np.ndarray, rng: np.random.Generator) -> None:
    """In place, per grid: swap one permutation cycle between two random rows of one band. G: (B, n, n)."""
    B, n, _ = G.shape
    b = math.isqrt(n)
    ar = np.arange(B)
    band = rng.integers(0, b, B)
    a1 = rng.integers(0, b, B)
    a2 = (a1 + rng.integers(1, b, B)) % b  # another row of the same band
    r1, r2 = band * b + a1, band * b + a2
    R1, R2 = G[ar, r1], G[ar, r2]  # (B, n)
    col_of = np.argsort(R1, axis=1)  # (B, n): column of each digit in row r1
    cur = rng.integers(0, n, B)  # a random column starts the cycle
    in_cycle = np.zeros((B, n), dtype=bool)
    for _ in range(n):  # a cycle has at most n columns; revisiting is harmless
        in_cycle[ar, cur] = True
        cur = col_of[ar, R2[ar, cur]]
    G[ar, r1] = np.where(in_cycle, R2, R1)
    G[ar, r2] = np.where(in_cycle, R1, R2)


def swap_chain(n: int, batch: int, rng: np.random.Generator, steps: int | None = None) -> np.ndarray:
    """`batch` independent chains of `steps` cycle swaps (default 12 n), rows and columns alternating. (B, n, n)"""
    steps = 12 * n if steps is None else steps
    G = symmetry_np(np.broadcast_to(pattern_grid(n), (batch, n, n)).copy(), rng)
    for _ in range(steps):
        cycle_swap(G, rng)
        G = np.ascontiguousarray(G.transpose(0, 2, 1))  # next step swaps within a stack
    return G


CHAINS_PER_BATCH = {4: 64, 9: 512, 16: 128, 25: 32}
# distinct solved grids the chain reaches where that is few: 4x4 has 288 valid grids in two symmetry
# classes (96 + 192); after any number of steps the chain is in one of 192 of them, one class at the
# default 12n steps (tests/test_data_splits.py enumerates every state). 9x9 and up have more grids
# and classes than any split asks
REACHABLE = {4: 192}


TRAIN_TEST_STREAM, VAL_STREAM = 0x5D, 0x5E


def iter_solutions(n: int, seed: int, steps: int | None = None, stream: int = TRAIN_TEST_STREAM
                   ) -> Iterator[np.ndarray]:
    """Distinct solved grids (n*n,), in an order fixed by (n, seed, stream): batch j of chains draws
    from its own stream seeded by (seed, n, stream, j), so grid i never depends on how many grids are
    asked for."""
    seen: set[bytes] = set()
    for j in itertools.count():
        if len(seen) == REACHABLE.get(n):
            return  # every grid the chain can reach was given: asking for more would search forever
        rng = np.random.default_rng([seed, n, stream, j])
        for g in swap_chain(n, CHAINS_PER_BATCH[n], rng, steps).reshape(-1, n * n):
            key = g.astype(np.int8).tobytes()
            if key not in seen:
                seen.add(key)
                yield g.astype(np.int64)


def generate_solutions(n: int, count: int, seed: int, steps: int | None = None) -> np.ndarray:
    """The first `count` distinct solved grids of `iter_solutions`, shape (count, n*n)."""
    _check_reachable(n, count, "count")
    it = iter_solutions(n, seed, steps)
    return np.stack([next(it) for _ in range(count)]).reshape(count, n * n)


def _check_reachable(n: int, asked: int, what: str) -> None:
    if asked > REACHABLE.get(n, asked):
        raise ValueError(f"the {n}x{n} generator makes {REACHABLE[n]} distinct solved grids: {what} = {asked} "
                         f"is too many")


def is_valid_solution(grid: np.ndarray, n: int) -> bool:
    """Every row, column and box holds each digit 0..n-1 exactly once."""
    g = np.asarray(grid).reshape(n, n)
    if g.min() < 0 or g.max() >= n:
        return False
    b = math.isqrt(n)
    want = np.arange(n)
    boxes = g.reshape(b, b, b, b).transpose(0, 2, 1, 3).reshape(n, n)
    return all((np.sort(m, axis=1) == want).all() for m in (g, g.T, boxes))


def fingerprint(grid: np.ndarray, n: int) -> str:
    """A symmetry-class invariant of a solved grid.

    For every pair of rows (i, j), the map "digit in row i -> digit in row j of the same column"
    is a permutation of the digits; its cycle type does not depend on the column order
    (column and stack moves), nor on digit labels (conjugation), nor on the pair's order
    (inverse). The multiset of (same band?, cycle type) over all row pairs is thus invariant
    under every row move that keeps bands; the same for columns; transposition swaps the two
    halves, so they are sorted.
    """
    g = np.asarray(grid).reshape(n, n)
    b = math.isqrt(n)
    i, j = np.triu_indices(n, 1)
    ar = np.arange(len(i))[:, None]
    ident = np.arange(n)
    halves = []
    for M in (g, g.T):
        col_of = np.argsort(M, axis=1)  # (n, n): column of digit v in line r
        P = M[j[:, None], col_of[i]]  # (pairs, n): digit v of line i -> digit below it in line j
        cur = np.broadcast_to(ident, P.shape).copy()
        length = np.zeros(P.shape, dtype=np.int64)  # cycle length of each digit
        for k in range(1, n + 1):
            cur = P[ar, cur]
            length = np.where((length == 0) & (cur == ident), k, length)
        length.sort(axis=1)  # digits in a cycle of length L appear L times: this is the cycle type
        same = (i // b == j // b).astype(np.int64)[:, None]
        keys = np.concatenate([same, length], axis=1)
        halves.append(keys[np.lexsort(keys.T[::-1])].tobytes())
    return hashlib.sha1(b"".join(sorted(halves))).hexdigest()[:16]


def split_grids(n: int, n_train: int, n_test: int, seed: int, by: Literal["class", "grid"] = "class"
                ) -> tuple[np.ndarray, np.ndarray]:
    """Train and test solved grids, disjoint by symmetry class (`fingerprint`) or by grid.

    Train is the first n_train grids of `iter_solutions` (so it does not depend on n_test);
    test takes the following grids whose key is not taken yet (test grids are distinct classes
    among themselves too)."""
    _check_reachable(n, n_train + n_test, "n_train + n_test")
    key = _grid_key(n, by)
    it = iter_solutions(n, seed)
    train = np.stack([next(it) for _ in range(n_train)])
    return train, _take_unseen(it, key, {key(g) for g in train}, n_test)


def val_grids(n: int, n_val: int, seed: int, train: np.ndarray, test: np.ndarray,
              by: Literal["class", "grid"] = "class") -> np.ndarray:
    """Validation solved grids: the same generator as train and test on its own stream (so the test
    split never depends on it), keeping only grids whose key (symmetry class or grid) is in neither
    train nor test, nor earlier in val."""
    _check_reachable(n, len(train) + len(test) + n_val, "n_train + n_test + n_val")
    key = _grid_key(n, by)
    taken = {key(g) for g in train} | {key(g) for g in test}
    return _take_unseen(iter_solutions(n, seed, stream=VAL_STREAM), key, taken, n_val)


def _grid_key(n: int, by: Literal["class", "grid"]):
    """What makes two solved grids the same for a split: their symmetry class, or the grid itself."""
    return (lambda g: fingerprint(g, n)) if by == "class" else (lambda g: g.astype(np.int8).tobytes())


def _take_unseen(it, key, taken: set, count: int) -> np.ndarray:
    """The next `count` grids of `it` whose key is not in `taken` nor earlier among them; `taken` grows."""
    out = []
    while len(out) < count:
        g = next(it, None)
        if g is None:  # the generator reached every grid it can (REACHABLE): never search forever
            raise ValueError(f"only {len(out)} of {count} grids could be drawn apart from the {len(taken) - len(out)} "
                             f"taken: the generator reaches no more")
        k = key(g)
        if k not in taken:
            taken.add(k)
            out.append(g)
    return np.stack(out)


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


# ---- external puzzle files ---------------------------------------------------------------
