"""Sudoku n x n (n in 4, 9, 16, 25): solved grids, puzzles, symmetry fingerprints and the Valid Puzzle Rate.

Solved grids come from a Markov chain on valid grids that leaves the single-orbit trap: start
from the pattern grid, apply a random symmetry, then make many *cycle swaps*. A cycle swap takes
two rows of one band, follows one cycle of the permutation "value in row r1 -> value in row r2
of the same column", and exchanges the two rows' cells on the columns of that cycle: every
column and box keeps its digits (cells move only within a column and a band) and each row keeps
its set of digits (a cycle is closed under the permutation), so the grid stays valid, yet a
cycle shorter than the row changes the symmetry class (symmetries only ever move whole rows,
columns or digit labels). Rows and columns alternate. The chain is vectorized over a batch of
independent chains in numpy; the old randomized MRV search (`random_solution`) is kept as the
reference the benchmark compares against (it cannot make 25x25 grids in useful time).

Train and test grids are kept in different symmetry classes with `fingerprint`, an invariant of
digit relabeling, transposition, band/stack and row/column-within-band permutations (equal
fingerprints do not prove equivalence, so the check is conservative: it may drop a test grid
that was in fact new, never keep one that is not). 4x4 Sudoku has only two classes, so its
split is disjoint by grid instead (`disjoint: auto`), and a split by grid trains without symmetry
augmentation: a symmetry maps a training grid onto other grids of its class, test and validation
grids among them (`augment` defaults to false there, and `augment: true` is refused). The 4x4
chain reaches 192 of the 288 solved grids, one class (`REACHABLE`): n_train + n_test (+ n_val)
above that is refused by `Sudoku.check_data` before anything runs. The validation split (`eval_set("val")`,
for selection and tuning) comes from the same generator on its own stream, disjoint from train
and test in the same way, so the test set does not depend on it. Symmetry transforms augment
the training split only. Tokens are digits 0..n-1 (shown 1..n, then A..P).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import random
from dataclasses import dataclass
from typing import Iterator, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from atomicio import open_regular
from tasks.base import (DataBound, EvalSet, InputFileError, Inputs, Metric, Task, TaskConfig, save_npz,
                        torch)  # torch: imported on first use

DIGITS = "123456789ABCDEFGHIJKLMNOP"


class SudokuConfig(TaskConfig):
    name: Literal["sudoku"] = "sudoku"
    n: int = Field(9, description="grid side: 4, 9, 16 or 25")
    mask_rate: float | tuple[float, float] = Field(
        0.3, description="share of cells blanked per puzzle: a number in (0, 1], or [low, high] drawn per puzzle")
    n_train: int = Field(2000, ge=1, description="distinct solved training grids (augmented by symmetry)")
    n_test: int = Field(500, ge=1, description="test puzzles (fixed; from grids never seen in training)")
    n_val: int | None = Field(None, ge=1, description="validation puzzles (disjoint from train and test "
                                                      "like the test split); default: n_test")
    structural_pos: bool = Field(True, description="embed positions as row + column + box ids; off = one id per cell")
    augment: bool = Field(True, description="random symmetry transforms of the training grids; only with a split by "
                                            "class (default false where the split is by grid, e.g. n=4)")
    disjoint: Literal["auto", "class", "grid"] = Field(
        "auto", description="train/test disjoint by symmetry class (fingerprint) or by grid; auto: class unless n=4")
    data_seed: int = 0

    @field_validator("n")
    @classmethod
    def _square(cls, v: int) -> int:
        if v not in (4, 9, 16, 25):
            raise ValueError(f"n must be one of 4, 9, 16, 25 (got {v})")
        return v

    @field_validator("mask_rate")
    @classmethod
    def _rate(cls, v):
        lo, hi = (v, v) if isinstance(v, float) else v
        if not (0 < lo <= hi <= 1):
            raise ValueError(f"mask_rate must be in (0, 1], or [low, high] with 0 < low <= high <= 1 (got {v})")
        return v

    @model_validator(mode="before")
    @classmethod
    def _augment_default(cls, data):
        """`augment` left out: on where the split is by symmetry class, off where it is by grid."""
        if isinstance(data, dict) and "augment" not in data:
            n, disjoint = data.get("n", 9), data.get("disjoint", "auto")
            if disjoint == "grid" or (disjoint == "auto" and n == 4):
                data = {**data, "augment": False}
        return data

    @model_validator(mode="after")
    def _split_possible(self) -> "SudokuConfig":
        if self.n == 4 and self.disjoint == "class":
            raise ValueError("disjoint: class is impossible for n=4 (4x4 Sudoku has only two symmetry classes); "
                             "use 'grid' or 'auto'")
        if self.augment and self.split_by == "grid":
            why = "n=4 splits by grid: it has only two symmetry classes" if self.n == 4 else "disjoint: grid"
            raise ValueError(f"augment: true cannot be used with a split by grid ({why}): a symmetry maps a training "
                             f"grid onto other grids of its class, test and validation grids among them; set "
                             f"augment: false" + ("" if self.n == 4 else " or disjoint: class"))
        return self

    @property
    def split_by(self) -> str:
        return ("grid" if self.n == 4 else "class") if self.disjoint == "auto" else self.disjoint

    # val is drawn disjoint from test, so which grids it holds depends on n_test too
    EVAL_FIELDS = {"test": ("n_test",), "val": ("n_test", "n_val")}


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


def generate_solutions(n: int, count: int, seed: int, method: Literal["swap", "search"] = "swap",
                       steps: int | None = None) -> np.ndarray:
    """The first `count` distinct solved grids of `iter_solutions`, shape (count, n*n)."""
    if method == "search":
        return _generate_by_search(n, count, seed)
    _check_reachable(n, count, "count")
    it = iter_solutions(n, seed, steps)
    return np.stack([next(it) for _ in range(count)]).reshape(count, n * n)


def _check_reachable(n: int, asked: int, what: str) -> None:
    if asked > REACHABLE.get(n, asked):
        raise ValueError(f"the {n}x{n} generator makes {REACHABLE[n]} distinct solved grids: {what} = {asked} "
                         f"is too many")


def random_solution(n: int, rng: random.Random, max_nodes: int = 200_000) -> list[int] | None:
    """One solved grid (row-major digits 0..n-1) by randomized MRV search; None if the node
    budget runs out (the caller restarts with fresh randomness). The benchmark's reference."""
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


def _generate_by_search(n: int, count: int, seed: int) -> np.ndarray:
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
class PuzzleFileError(InputFileError):
    """A puzzle file that cannot be read, with file and line number in the message."""


@dataclass
class PuzzleFile:
    """Puzzles read from a text or CSV file, in file order (all of them, or one chunk: see iter_puzzles)."""

    path: str
    n: int
    givens: np.ndarray  # (P, n*n) digits 0..n-1, -1 where blank
    solutions: np.ndarray | None  # (P, n*n) or None when the file has none
    fmt: Literal["lines", "csv"]
    blank: str  # the blank character of the input ('.' or '0')
    comments: list[str]  # per puzzle, the trailing text of its line (lines format)
    header: str = ""
    start: int = 0  # index in the file of the first puzzle here (a chunk); format_puzzles writes the header at 0


@functools.lru_cache(maxsize=None)
def _cell_codes(n: int, blanks: str) -> np.ndarray:
    """Code point (< 128) -> digit 0..n-1, -1 for a blank, -2 for anything else."""
    lut = np.full(128, -2, dtype=np.int64)
    for d, ch in enumerate(DIGITS[:n]):
        lut[ord(ch)] = lut[ord(ch.lower())] = d
    for b in blanks:
        lut[ord(b)] = -1
    return lut


def _cells(text: str, n: int, where: str, blanks: str) -> np.ndarray:
    if len(text) != n * n:
        raise PuzzleFileError(f"{where}: expected {n * n} cells for a {n}x{n} grid, got {len(text)} characters")
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # one code point per cell
    out = np.where(codes < 128, _cell_codes(n, blanks)[np.minimum(codes, 127)], -2)
    bad = np.flatnonzero(out == -2)
    if bad.size:
        k = int(bad[0])
        allowed = f"{DIGITS[:n]} or blanks {' '.join(repr(b) for b in blanks)}"
        raise PuzzleFileError(f"{where}: bad character {text[k].upper()!r} at cell {k + 1}; allowed: {allowed}")
    return out


def _contradictions(givens: np.ndarray, n: int) -> np.ndarray:
    """(P,) bool: a digit given twice in one row, column or box (no completion can keep such givens)."""
    b = math.isqrt(n)
    bad = np.zeros(len(givens), dtype=bool)
    for i in range(0, len(givens), 512):  # (512, n, n, n) booleans at a time: bounded memory for 25x25
        g = givens[i:i + 512].reshape(-1, n, n)
        onehot = g[..., None] == np.arange(n)  # (B, row, col, digit)
        boxes = onehot.reshape(-1, b, b, b, b, n).sum(axis=(2, 4))
        bad[i:i + 512] = ((onehot.sum(2) > 1).any((1, 2)) | (onehot.sum(1) > 1).any((1, 2))
                          | (boxes > 1).any((1, 2, 3)))
    return bad


def _contradiction(g: np.ndarray, n: int) -> str:
    """Which digit is given twice where, for the message (one puzzle)."""
    b = math.isqrt(n)
    grid = g.reshape(n, n)
    units = [(f"row {r + 1}", grid[r]) for r in range(n)] + [(f"column {c + 1}", grid[:, c]) for c in range(n)]
    units += [(f"box {k + 1}", grid[(k // b) * b:(k // b + 1) * b, (k % b) * b:(k % b + 1) * b].ravel())
              for k in range(n)]
    for name, cells in units:
        vals, counts = np.unique(cells[cells >= 0], return_counts=True)
        if (counts > 1).any():
            return f"digit {DIGITS[vals[counts > 1][0]]} is given twice in {name}"
    return "contradicting givens"


MAX_LINE = 1 << 16  # characters of a puzzle file's line: a 25x25 quiz and its solution are 1,251


def _open_lines(path: str):
    """Numbered lines of a regular UTF-8 file (a byte-order mark is dropped), read as they come, each at
    most MAX_LINE characters: a FIFO, a device (/dev/zero) or a line without end is refused, never
    waited on or held in memory."""
    import io

    f = io.TextIOWrapper(open_regular(path, "puzzle file", exc=PuzzleFileError), encoding="utf-8-sig", newline=None)

    def lines():
        with f:
            ln = 0
            try:
                for ln, raw in enumerate(iter(lambda: f.readline(MAX_LINE + 2), ""), 1):
                    if len(raw) > MAX_LINE + 1 or (len(raw) == MAX_LINE + 1 and not raw.endswith(("\n", "\r"))):
                        raise PuzzleFileError(f"{path}:{ln}: a line longer than {MAX_LINE:,} characters; a "
                                              f"puzzle line holds n*n cells (and a comment)")
                    yield ln, raw.rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise PuzzleFileError(f"{path}:{ln + 1}: not UTF-8 text ({e.reason})") from None
            except OSError as e:
                raise PuzzleFileError(f"{path}: cannot read the puzzle file ({e.strerror or e})") from None

    return lines()


CSV_HEADERS = ("quizzes,solutions", "quizzes")


def iter_puzzles(path: str, n: int = 9, chunk: int = 4096) -> Iterator[PuzzleFile]:
    """The puzzles of `path` in file order, at most `chunk` at a time: memory stays bounded whatever the
    file's size. Each chunk is a PuzzleFile (`start` = index of its first puzzle); `blank` is the first
    blank character seen so far in the file ('.' before any).

    Formats: one puzzle per line (`.` or `0` for blanks, optional trailing comment after whitespace or
    '#'; blank lines and lines starting with '#' skipped), or CSV with a `quizzes[,solutions]` header.
    Errors (PuzzleFileError) name the file and line: bad cells, a wrong CSV header, a digit given twice
    in a row, column or box, a solution that does not solve its quiz."""
    blanks = ".0" if n <= 9 else "."
    lines = _open_lines(path)
    first = next(((ln, s) for ln, s in lines if s.strip() and not s.lstrip().startswith("#")), None)
    if first is None:
        raise PuzzleFileError(f"{path}: no puzzles")
    head_ln, head_raw = first
    head = head_raw.strip().lower().replace(" ", "")
    cells0 = _cut_comment(head_raw.strip())  # a puzzle line's trailing comment may hold commas
    csv = head.startswith("quizzes") or "," in cells0 or ("," in head and not _is_cells(cells0, n, blanks))
    if csv and head not in CSV_HEADERS:
        ask = " or ".join(repr(h) for h in CSV_HEADERS)
        if _is_cells(head.split(",")[0], n, blanks):
            raise PuzzleFileError(f"{path}:{head_ln}: a CSV file starts with the header {ask} (got the data line "
                                  f"{head_raw.strip()[:100]!r})")
        raise PuzzleFileError(f"{path}:{head_ln}: CSV header must be {ask} (got {head_raw.strip()[:200]!r})")
    if not csv and len(cells0) != n * n and any(c.isalpha() and c.upper() not in DIGITS[:n] for c in cells0):
        raise PuzzleFileError(f"{path}:{head_ln}: neither a puzzle of {n * n} cells nor a CSV header "
                              f"({' or '.join(repr(h) for h in CSV_HEADERS)}) (got {head_raw.strip()[:200]!r})")
    cols = head.split(",") if csv else []
    state = {"blank": "", "start": 0}

    def make(givens, sols, comments, where) -> PuzzleFile:
        g = np.stack(givens)
        bad = _contradictions(g, n)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise PuzzleFileError(f"{where[i]}: the givens contradict each other ({_contradiction(g[i], n)}): "
                                  f"no grid can keep them")
        pf = PuzzleFile(path=path, n=n, givens=g, solutions=np.stack(sols) if sols else None,
                        fmt="csv" if csv else "lines", blank=state["blank"] or ".", comments=comments,
                        header=head_raw.strip() if csv else "", start=state["start"])
        state["start"] += len(g)
        return pf

    givens, sols, comments, where = [], [], [], []
    body = lines if csv else itertools.chain([(head_ln, head_raw)], lines)
    for ln, raw in body:
        s = raw.strip()
        if not s or (not csv and s.startswith("#")):
            continue
        at = f"{path}:{ln}"
        if csv:
            parts = [p.strip() for p in s.split(",")]
            if len(parts) != len(cols):
                raise PuzzleFileError(f"{at}: expected {len(cols)} comma-separated fields ({','.join(cols)}), "
                                      f"got {len(parts)}")
            cells, comment = parts[0], ""
        else:
            cells = _cut_comment(s)
            comment = s[len(cells):]
        g = _cells(cells, n, at, blanks)
        if csv and len(cols) == 2:
            sol = _cells(parts[1], n, at + " (solution)", "")
            if not is_valid_solution(sol, n) or (sol[g >= 0] != g[g >= 0]).any():
                raise PuzzleFileError(f"{at}: the solution is not a valid grid keeping the quiz's givens")
            sols.append(sol)
        state["blank"] = state["blank"] or next((c for c in cells if c in blanks), "")
        givens.append(g)
        comments.append(comment)
        where.append(at)
        if len(givens) == chunk:
            yield make(givens, sols, comments, where)
            givens, sols, comments, where = [], [], [], []
    if givens:
        yield make(givens, sols, comments, where)
    elif state["start"] == 0:
        raise PuzzleFileError(f"{path}: no puzzles")


def _cut_comment(s: str) -> str:
    """The cells of a stripped line: up to the first whitespace or '#'."""
    for k, ch in enumerate(s):
        if ch.isspace() or ch == "#":
            return s[:k]
    return s


def _is_cells(text: str, n: int, blanks: str) -> bool:
    try:
        _cells(text, n, "", blanks)
        return True
    except PuzzleFileError:
        return False


def format_puzzles(pf: PuzzleFile, outputs: np.ndarray) -> str:
    """The completed grids in the input's order and format (CSV: quizzes,solutions). For a chunk of
    iter_puzzles, the text of that chunk: the CSV header only with the first (start 0)."""
    def cells(g: np.ndarray) -> str:
        return "".join(DIGITS[v] if 0 <= v < pf.n else pf.blank for v in g)

    if pf.fmt == "csv":
        rows = ["quizzes,solutions"] * (pf.start == 0) + [f"{cells(q)},{cells(o)}" for q, o in zip(pf.givens, outputs)]
    else:
        rows = [cells(o) + c for o, c in zip(outputs, pf.comments)]
    return "\n".join(rows) + "\n"


class Sudoku(Task):
    name = "sudoku"
    metrics = (Metric("vpr", "valid puzzle rate (VPR)", "rate", unit=True, threshold=0.95),
               Metric("cell_acc", "cell accuracy", "mean", unit=True, needs_reference=True),
               Metric("exact", "exact match rate", "rate", unit=True, needs_reference=True))
    primary_metric = "vpr"
    describe_fields = ("n", "mask_rate")

    def __init__(self, cfg: SudokuConfig):
        super().__init__(cfg)
        self.cfg: SudokuConfig = cfg
        self.n = cfg.n
        lo, hi = (cfg.mask_rate, cfg.mask_rate) if isinstance(cfg.mask_rate, float) else cfg.mask_rate
        self.blank_range = (max(1, round(lo * cfg.n * cfg.n)), max(1, round(hi * cfg.n * cfg.n)))
        self.train_grids: torch.Tensor | None = None
        self.test: EvalSet | None = None
        self.val: EvalSet | None = None  # made on first use (tuning, selection): training never waits for it
        self._test_grids: np.ndarray | None = None
        self._data_path: str | None = None  # the cache file train and test came from

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

    def free_positions(self) -> tuple[int, int]:
        return self.blank_range  # round(mask_rate * n * n), at least 1, as `_givens` blanks them

    @classmethod
    def variant_name(cls, params: dict) -> str:
        """'sudoku 9x9, 30% masked' ('30-50% masked' for a rate drawn per puzzle)."""
        n, rate = params.get("n"), params.get("mask_rate")
        if isinstance(rate, (list, tuple)) and len(rate) == 2:  # drawn per puzzle in [low, high]
            lo, hi = (round(100 * r) for r in rate)
            masked = f", {lo}-{hi}% masked" if lo != hi else f", {lo}% masked"
        else:
            masked = f", {round(100 * rate)}% masked" if _fixed_rate(rate) is not None else ""
        return f"sudoku {n}x{n}{masked}"

    run_column_names = ("sudoku_n", "mask_rate")
    aliases = ("mask_rate",)  # `mask_rate: [0.3, 0.5]` as an axis is task.mask_rate

    @classmethod
    def run_columns(cls, params: dict) -> dict:
        """sudoku_n, and mask_rate as a number (None for a [low, high] range, which the variant names)."""
        return {"sudoku_n": params.get("n"), "mask_rate": _fixed_rate(params.get("mask_rate"))}

    # ---- data ------------------------------------------------------------------------------
    DATA_VERSION = 3  # bump when generation changes; a study's older files are still used (see prepare)
    VAL_MASK_SEED = 104_729  # the test split's givens use data_seed + 7919

    def _data_key(self, version: int = DATA_VERSION) -> str:
        c = self.cfg
        d = {"v": version, "n": c.n, "n_train": c.n_train, "n_test": c.n_test, "seed": c.data_seed}
        if version >= 2:
            d["by"] = c.split_by
        return hashlib.sha256(json.dumps(d).encode()).hexdigest()[:12]

    def _meta(self) -> dict:
        """What a cached data file holds, recorded inside it (`meta`) and checked on every load."""
        c = self.cfg
        return {"version": self.DATA_VERSION, "n": c.n, "n_train": c.n_train, "n_test": c.n_test,
                "seed": c.data_seed, "split_by": c.split_by}

    def _file_meta(self, z, version: int) -> dict:
        if "meta" in z.files:
            return json.loads(str(z["meta"]))
        # files from before the meta was recorded: their key says everything but the split of v1,
        # which the MRV-search generator always made by grid
        return {**self._meta(), "version": version, "split_by": "grid" if version == 1 else self.cfg.split_by}

    @staticmethod
    def _same_data(have: dict, want: dict) -> bool:
        return all(have.get(k) == want[k] for k in want if k != "version")

    def prepare(self, cache_dir: str | None) -> None:
        if self.train_grids is not None:
            return
        want = self._meta()
        path = os.path.join(cache_dir, f"sudoku{self.n}-{self._data_key()}.npz") if cache_dir else None
        # a study keeps the data it started with: a file an older generator made for the same config
        # (v2: the same chain, other batch streams; v1: the MRV search) is used before new data is made,
        # so runs resumed after an upgrade train on their study's grids -- but only when it holds the same
        # split (a v1 file is split by grid: never reused for a class-disjoint config, whose data is made
        # anew under today's key instead)
        train = test = None
        for v in range(self.DATA_VERSION, 0, -1) if path else ():
            p = path if v == self.DATA_VERSION else os.path.join(cache_dir, f"sudoku{self.n}-{self._data_key(v)}.npz")
            if not os.path.exists(p):
                continue
            with np.load(p) as z:
                have = self._file_meta(z, v)
                if self._same_data(have, want) and len(z["train"]) == self.cfg.n_train \
                        and len(z["test"]) == self.cfg.n_test:
                    train, test, self._data_path = z["train"], z["test"], p
                    break
            if p == path:
                raise ValueError(f"{p}: cached Sudoku data holds {have}, but the config asks for {want}; "
                                 f"move the file away to regenerate it")
        if train is None:
            train, test = split_grids(self.n, self.cfg.n_train, self.cfg.n_test, self.cfg.data_seed,
                                      self.cfg.split_by)
            if path:
                save_npz(path, train=train, test=test, meta=np.array(json.dumps(want)))
                self._data_path = path
        self.train_grids = torch.from_numpy(train)
        self._test_grids = test
        test_x0 = torch.from_numpy(test)
        gen = torch.Generator().manual_seed(self.cfg.data_seed + 7919)
        self.test = EvalSet(test_x0, self._givens(test_x0.shape[0], gen))

    def _make_val(self) -> EvalSet:
        c = self.cfg
        path = f"{self._data_path[:-len('.npz')]}-val{c.val_size}.npz" if self._data_path else None
        want = {"n_val": c.val_size, "split_by": c.split_by, "stream": VAL_STREAM,
                "of": os.path.basename(self._data_path or "")}
        if path and os.path.exists(path):
            with np.load(path) as z:
                have = json.loads(str(z["meta"]))
                if have != want:
                    raise ValueError(f"{path}: cached validation grids hold {have}, but {want} is asked; "
                                     f"move the file away to regenerate it")
                grids = z["val"]
        else:
            grids = val_grids(self.n, c.val_size, c.data_seed, self.train_grids.numpy(), self._test_grids,
                              c.split_by)
            if path:
                save_npz(path, val=grids, meta=np.array(json.dumps(want)))
        x0 = torch.from_numpy(grids)
        gen = torch.Generator().manual_seed(c.data_seed + self.VAL_MASK_SEED)
        return EvalSet(x0, self._givens(x0.shape[0], gen))

    def _givens(self, B: int, gen: torch.Generator) -> torch.Tensor:
        """(B, N) bool: n_blank cells per puzzle are blank (fixed, or drawn per puzzle in the range)."""
        N = self.n * self.n
        lo, hi = self.blank_range
        rank = torch.argsort(torch.rand(B, N, generator=gen), dim=1).argsort(dim=1)
        if lo == hi:
            return rank >= lo
        n_blank = torch.randint(lo, hi + 1, (B, 1), generator=gen)
        return rank >= n_blank

    def train_batch(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, self.train_grids.shape[0], (batch_size,), generator=gen)
        x0 = self.train_grids[idx]
        if self.cfg.augment:
            x0 = random_symmetry(x0, self.n, gen)
        return x0, self._givens(batch_size, gen)

    def eval_set(self, split: str = "test") -> EvalSet:
        if self.cfg.split_of(split) == "test":
            return self.test
        if self.val is None:
            self.val = self._make_val()
        return self.val

    def max_examples(self) -> DataBound | None:
        """4x4 (split by grid): the 192 grids the chain reaches. Larger sizes: no bound a split meets
        (9x9 alone has about 5.5e9 symmetry classes)."""
        n = self.n
        if n in REACHABLE and self.cfg.split_by == "grid":
            return DataBound(REACHABLE[n], f"distinct solved {n}x{n} grids (its generator reaches one symmetry class, "
                                           f"192 of the 288 grids; train, test and val are disjoint by grid)")
        return None

    # ---- scoring ---------------------------------------------------------------------------
    def score(self, output: torch.Tensor, ev: EvalSet) -> list[dict[str, float]]:
        return self.score_arrays(output.cpu().numpy(), ev.x0.cpu().numpy(), ev.cond.cpu().numpy())

    def score_arrays(self, out: np.ndarray, ref: np.ndarray, cond: np.ndarray) -> list[dict[str, float]]:
        """`score` on NumPy arrays (B, N): outputs, references, givens mask (`rescore` calls it without torch)."""
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
        t = tokens.tolist()
        keep = cond.tolist() if cond is not None else [True] * len(t)
        return "".join(DIGITS[v] if k and 0 <= v < self.n else "." for v, k in zip(t, keep))

    def rescore(self, input_text: str, output_text: str, reference_text: str | None) -> dict[str, float]:
        digits, cells = DIGITS[: self.n], self.n * self.n
        for what, text in (("input", input_text), ("output", output_text), ("reference", reference_text)):
            if text is not None and len(text) != cells:
                raise ValueError(f"{what} has {len(text)} cells, a {self.n}x{self.n} grid has {cells}")

        def tokens(text: str, blank: int) -> np.ndarray:
            return np.array([[digits.index(ch) if ch in digits else blank for ch in text]], dtype=np.int64)

        cond = np.array([[ch != "." for ch in input_text]], dtype=bool)
        has_ref = reference_text is not None
        x_ref = tokens(reference_text if has_ref else input_text, 0)  # no reference: the givens only
        scores = self.score_arrays(tokens(output_text, -1), x_ref, cond)[0]  # '.' in an output: never filled
        return scores if has_ref else {m: scores[m] for m in self.metrics_without_reference()}

    # ---- external puzzle files (`study eval`) -----------------------------------------------
    def read_inputs(self, path: str, chunk: int) -> Iterator[Inputs]:
        for pf in iter_puzzles(path, self.n, chunk):
            givens = torch.from_numpy(pf.givens)
            cond = givens >= 0
            ref = torch.from_numpy(pf.solutions) if pf.solutions is not None else None
            yield Inputs(torch.where(cond, givens, torch.zeros_like(givens)), cond, ref, pf.start, pf)

    def format_outputs(self, inputs: Inputs, output: torch.Tensor) -> str:
        return format_puzzles(inputs.source, output.numpy())


def _fixed_rate(rate) -> float | None:
    return float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) else None
