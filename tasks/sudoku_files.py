"""Sudoku puzzle files (`study eval RUN --puzzles FILE`): reading lines / CSV files a chunk at a time with
their line numbers, and writing the completed grids back in the file's format. Split out of
tasks/sudoku.py; tasks.sudoku re-exports every public name."""
from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass
from typing import Iterator, Literal

import numpy as np

from atomicio import open_regular
from tasks.base import InputFileError
from tasks.sudoku_grids import DIGITS, is_valid_solution

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
_CELLS = re.compile(r"[^\s#]*")  # a puzzle line's cells: up to the first whitespace or '#'


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
    cells0 = _CELLS.match(head_raw.strip())[0]  # a puzzle line's trailing comment may hold commas
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
            cells = _CELLS.match(s)[0]
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
