"""Solved-grid generation speed, one core: the cycle-swap chain (tasks.sudoku.generate_solutions)
against the randomized MRV search it replaced (`random_solution`, kept here), measured in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sudoku_gen.py [--quick]

Prints distinct grids per second (and distinct symmetry classes by fingerprint) per size, and
the ratio swap / search. The search gets a fixed time budget per size; at 25x25 it usually
finishes no grid at all within it, which is reported as 0 grids/s.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import random
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from tasks.sudoku import fingerprint, generate_solutions, is_valid_solution  # noqa: E402


def random_solution(n: int, rng: random.Random, max_nodes: int = 200_000) -> list[int] | None:
    """One solved grid (row-major digits 0..n-1) by randomized MRV search; None if the node
    budget runs out (the caller restarts with fresh randomness). The reference this benchmark compares against."""
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


def generate_by_search(n: int, count: int, seed: int) -> np.ndarray:
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


def _search(n: int, count: int, q) -> None:
    t0 = time.perf_counter()
    grids = generate_by_search(n, count, seed=0)
    q.put((len(grids), time.perf_counter() - t0))


def search_rate(n: int, count: int, budget: float) -> tuple[int, float]:
    """(grids, seconds) of the MRV search; run in a child process so a stuck 25x25 search can be cut off."""
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_search, args=(n, count, q))
    t0 = time.perf_counter()
    p.start()
    p.join(budget)
    if p.is_alive():
        p.terminate()  # our own child, by its handle
        p.join()
        return 0, time.perf_counter() - t0
    return q.get()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer grids")
    args = ap.parse_args()
    sizes = {9: (2000, 200), 16: (300, 20), 25: (100, 2)} if not args.quick else {9: (500, 50), 16: (60, 5), 25: (20, 1)}
    budget = 30.0 if not args.quick else 10.0
    print(f"{'n':>3} {'swap grids/s':>13} {'classes':>9} {'search grids/s':>15} {'ratio':>8} {'fingerprints/s':>15}")
    for n, (count, s_count) in sizes.items():
        t0 = time.perf_counter()
        grids = generate_solutions(n, count, seed=0)
        swap_s = time.perf_counter() - t0
        assert all(is_valid_solution(g, n) for g in grids)
        t0 = time.perf_counter()
        fps = {fingerprint(g, n) for g in grids}
        fp_s = time.perf_counter() - t0
        k, secs = search_rate(n, s_count, budget)
        swap_rate, search = count / swap_s, k / secs
        ratio = f"{swap_rate / search:8.1f}" if search > 0 else f"{'inf':>8}"
        print(f"{n:>3} {swap_rate:>13.1f} {len(fps):>9} {search:>15.2f} {ratio} {count / fp_s:>15.1f}"
              + ("" if k else f"   (search: no grid in {budget:.0f}s)"))


if __name__ == "__main__":
    main()
