"""Solved-grid generation speed, one core: the cycle-swap chain (tasks.sudoku.generate_solutions)
against the randomized MRV search it replaced (method="search"), measured in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sudoku_gen.py [--quick]

Prints distinct grids per second (and distinct symmetry classes by fingerprint) per size, and
the ratio swap / search. The search gets a fixed time budget per size; at 25x25 it usually
finishes no grid at all within it, which is reported as 0 grids/s.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from tasks.sudoku import fingerprint, generate_solutions, is_valid_solution  # noqa: E402


def _search(n: int, count: int, q) -> None:
    t0 = time.perf_counter()
    grids = generate_solutions(n, count, seed=0, method="search")
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
