"""`study eval --puzzles` reads, samples and scores a puzzle file a chunk at a time: the same
outputs, rows and --out file as one pass over the whole file, in memory that does not grow with
the file. A real tiny 4x4 Sudoku run, real Parquet. Run: pytest tests/test_puzzles_stream.py"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from store import Store
from study.commands.puzzles import EvalError, evaluate_puzzles
from tasks.sudoku import DIGITS, PuzzleFileError, generate_solutions
from tests.helpers import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def trained(tiny_run, tmp_path_factory):
    root, run_id = tiny_run(tmp_path_factory.mktemp("results"))  # conftest.py: this module's copy
    return root, run_id, Store(root, TINY)


def write_puzzles(path, count: int, seed: int = 0, csv: bool = False) -> None:
    """`count` 4x4 puzzles (6 blanks each, '0' for blanks in CSV, '.' otherwise), one per line."""
    rng = np.random.default_rng(seed)
    sols = generate_solutions(4, 64, seed=seed + 1)[rng.integers(0, 64, count)]
    holes = rng.random((count, 16)).argsort(1)[:, :6]
    quiz = sols.copy()
    np.put_along_axis(quiz, holes, -1, axis=1)
    blank = "0" if csv else "."
    text = lambda g: "".join(DIGITS[v] if v >= 0 else blank for v in g)  # noqa: E731
    with open(path, "w") as f:
        f.write("quizzes,solutions\n" if csv else "# generated\n")
        for i, (q, s) in enumerate(zip(quiz, sols)):
            f.write(f"{text(q)},{text(s)}\n" if csv else f"{text(q)}  #{i}\n")


def _rows(store: Store, run_id: str, key: str):
    ev = store.read("evals", run_id)
    ev = ev[ev.eval_key == key].sort_values("metric").reset_index(drop=True)
    sm = store.read("samples", run_id)
    sm = sm[sm.eval_key == key].sort_values("example").reset_index(drop=True)
    return ev, sm


@pytest.mark.parametrize("csv", [False, True])
def test_chunks_give_the_outputs_and_rows_of_one_pass(trained, tmp_path, csv):
    """600 puzzles in chunks of 256 (three chunks, the last partial) against one chunk of them all
    (the whole file at once, as before streaming): same --out bytes, samples and evals rows."""
    root, run_id, store = trained
    src = tmp_path / ("ext.csv" if csv else "ext.txt")
    write_puzzles(src, 600, csv=csv)
    got = {}
    for chunk in (256, 1024):
        out = tmp_path / f"out-{chunk}"
        s = evaluate_puzzles(run_id, str(src), results=root, T=2, out=str(out), n_samples_kept=None,
                             device="cpu", chunk=chunk)
        assert s["n"] == 600 and s["out"] == str(out)
        got[chunk] = (out.read_bytes(), *_rows(store, run_id, s["eval_key"]), s["metrics"])
    (out_a, ev_a, sm_a, m_a), (out_b, ev_b, sm_b, m_b) = got[256], got[1024]
    assert out_a == out_b and len(out_a.splitlines()) == 600 + csv
    assert sm_a.equals(sm_b) and list(sm_a.example) == list(range(600))
    assert list(ev_a.metric) == (["cell_acc", "exact", "vpr"] if csv else ["vpr"])
    same = ["n_examples", "forward_passes", "forward_passes_mean", "eval_flops", "T", "L_s", "split"]
    assert ev_a[same].equals(ev_b[same]) and (ev_a.n_examples == 600).all()
    for col in ("value", "ci_low", "ci_high"):  # running sums: equal to rounding
        assert ev_a[col].to_numpy() == pytest.approx(ev_b[col].to_numpy(), rel=1e-12, abs=1e-15)
    assert m_a.keys() == m_b.keys() and all(m_a[k] == pytest.approx(m_b[k], rel=1e-12) for k in m_a)
    # the row's VPR is the mean of the stored per-puzzle scores
    assert ev_a.set_index("metric").value["vpr"] == pytest.approx(sm_a.score.mean())
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]  # no temp file of --out left


def test_samples_table_keeps_the_first_puzzles(trained, tmp_path):
    root, run_id, store = trained
    src = tmp_path / "ext.txt"
    write_puzzles(src, 600, seed=1)
    s = evaluate_puzzles(run_id, str(src), results=root, T=1, n_samples_kept=300, device="cpu", chunk=256)
    ev, sm = _rows(store, run_id, s["eval_key"])
    # a row per puzzle (its scores: the evals rows are their means), the text of the first 300 only
    assert list(sm.example) == list(range(600)) and (ev.n_examples == 600).all()
    assert sm.output.notna().tolist() == [True] * 300 + [False] * 300 and sm.scores.notna().all()
    s = evaluate_puzzles(run_id, str(src), results=root, T=1, device="cpu")  # the default: the first 1,000
    assert len(_rows(store, run_id, s["eval_key"])[1]) == 600 and _rows(store, run_id, s["eval_key"])[1].output.notna().all()


def _external(store: Store, run_id: str) -> int:
    return int(store.read("evals", run_id)["split"].str.startswith("external:").sum())


def test_library_call_checks_out_before_writing_rows(trained, tmp_path):
    """evaluate_puzzles (not only the CLI) refuses an --out it cannot write before any store row."""
    root, run_id, store = trained
    src = tmp_path / "p.txt"
    write_puzzles(src, 10)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    before = _external(store, run_id)
    with pytest.raises(EvalError, match="no such directory"):
        evaluate_puzzles(run_id, str(src), results=root, out=str(blocker / "out.txt"), device="cpu")
    with pytest.raises(EvalError, match="is a directory"):
        evaluate_puzzles(run_id, str(src), results=root, out=str(tmp_path), device="cpu")
    assert _external(store, run_id) == before


def test_bad_line_late_in_the_file_writes_nothing(trained, tmp_path):
    """A bad puzzle after the first chunk: refused (file and line) before any sampling; no rows, no --out."""
    root, run_id, store = trained
    src = tmp_path / "p.txt"
    write_puzzles(src, 700)
    with open(src, "a") as f:
        f.write("1123" + "." * 12 + "\n")
    before = _external(store, run_id)
    with pytest.raises(PuzzleFileError, match=r"p.txt:702: the givens contradict"):
        evaluate_puzzles(run_id, str(src), results=root, out=str(tmp_path / "o.txt"), device="cpu", chunk=256)
    assert _external(store, run_id) == before and sorted(os.listdir(tmp_path)) == ["p.txt"]


PEAK = """
import resource, sys
from study.commands.puzzles import evaluate_puzzles
root, run_id, warm, big = sys.argv[1:]
evaluate_puzzles(run_id, warm, results=root, T=1, device="cpu", out=warm + ".out")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
s = evaluate_puzzles(run_id, big, results=root, T=1, device="cpu", out=big + ".out")
assert s["n"] == int(big.rsplit("-", 1)[1])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)  # KiB on Linux
"""


@pytest.mark.slow  # 30,000 puzzles sampled; chunking itself: test_chunks_give_the_outputs_and_rows_of_one_pass
def test_peak_memory_does_not_grow_with_the_file(trained, tmp_path):
    """Peak RSS growth over a warm-up evaluation (one full chunk), for 2,000 and 20,000 puzzles, each in
    a fresh process: ten times the puzzles costs almost nothing more (whole-file reading held every
    puzzle, score and samples row at once: tens of MB more at 20,000)."""
    root, run_id, _ = trained
    warm = tmp_path / "warm-4096"
    write_puzzles(warm, 4096, seed=5)
    growth = {}
    for n in (2000, 20000):
        big = tmp_path / f"big-{n}"
        write_puzzles(big, n, seed=6)
        r = subprocess.run([sys.executable, "-c", PEAK, root, run_id, str(warm), str(big)], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        growth[n] = int(r.stdout.split()[-1]) / 1024  # MiB
        assert len((tmp_path / f"big-{n}.out").read_text().splitlines()) == n
    assert growth[20000] < 2 * growth[2000] + 8, growth  # whole-file reading: ~47 MiB against ~1 here
