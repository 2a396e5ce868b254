"""Sudoku n x n (n in 4, 9, 16, 25): solved grids, puzzles, symmetry fingerprints and the Valid Puzzle Rate.

Solved grids come from a Markov chain on valid grids that leaves the single-orbit trap: start
from the pattern grid, apply a random symmetry, then make many *cycle swaps*. A cycle swap takes
two rows of one band, follows one cycle of the permutation "value in row r1 -> value in row r2
of the same column", and exchanges the two rows' cells on the columns of that cycle: every
column and box keeps its digits (cells move only within a column and a band) and each row keeps
its set of digits (a cycle is closed under the permutation), so the grid stays valid, yet a
cycle shorter than the row changes the symmetry class (symmetries only ever move whole rows,
columns or digit labels). Rows and columns alternate. The chain is vectorized over a batch of
independent chains in numpy (benchmarks/sudoku_gen.py keeps the randomized MRV search it replaced,
which cannot make 25x25 grids in useful time).

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
import json
import math
import os
from typing import Iterator, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from tasks.base import (DataBound, EvalSet, Inputs, Metric, Task, TaskConfig, cached_npz, save_npz, torch,  # torch:
                        val_path)  # imported on first use
# the grids and the puzzle files live in their own modules; every public name is re-exported here
from tasks.sudoku_files import (CSV_HEADERS, MAX_LINE, PuzzleFile, PuzzleFileError, format_puzzles, iter_puzzles)
from tasks.sudoku_grids import (CHAINS_PER_BATCH, DIGITS, REACHABLE, cycle_swap, fingerprint, generate_solutions,
                                is_valid_solution, iter_solutions, pattern_grid, random_symmetry,
                                split_grids, swap_chain, symmetry_np, val_grids)
from tasks.sudoku_grids import TRAIN_TEST_STREAM, VAL_STREAM  # noqa: F401


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
    figure_columns = {"mask-rate": ("sudoku_n", "mask_rate")}  # (grid size, mask rate): one panel each

    @classmethod
    def run_columns(cls, params: dict) -> dict:
        """sudoku_n, and mask_rate as a number (None for a [low, high] range, which the variant names)."""
        return {"sudoku_n": params.get("n"), "mask_rate": _fixed_rate(params.get("mask_rate"))}

    # ---- data ------------------------------------------------------------------------------
    DATA_VERSION = 3  # bump when generation changes; `study migrate` adopts a study's older files (upgrade_data)
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

    def _path(self, cache_dir: str, version: int = DATA_VERSION) -> str:
        return os.path.join(cache_dir, f"sudoku{self.n}-{self._data_key(version)}.npz")

    def upgrade_data(self, cache_dir: str) -> list[str]:
        """A study keeps the data it started with: a file an older generator made for the same config (v2: the
        same chain, other batch streams; v1: the MRV search; either without the meta recorded inside it, whose
        key says everything but the split of v1, always by grid) is written under today's key with its meta,
        so runs resumed after an upgrade train on their study's grids -- but only when it holds the same split
        (a v1 file is never adopted by a class-disjoint config, whose data is made anew instead)."""
        path, want = self._path(cache_dir), self._meta()
        for v in range(self.DATA_VERSION, 0, -1):
            p = self._path(cache_dir, v)
            if not os.path.exists(p):
                continue
            with np.load(p) as z:
                if "meta" in z.files and p == path:
                    return []  # today's already
                have = {**want, "split_by": "grid" if v == 1 else want["split_by"]} if "meta" not in z.files \
                    else json.loads(str(z["meta"]))
                if all(have.get(k) == want[k] for k in want if k != "version") \
                        and (len(z["train"]), len(z["test"])) == (self.cfg.n_train, self.cfg.n_test):
                    save_npz(path, train=z["train"], test=z["test"], meta=np.array(json.dumps({**want, "version": v})))
                    return [f"{path}: the study's Sudoku data of generator v{v} ({os.path.basename(p)}) adopted"]
        return []

    def prepare(self, cache_dir: str | None) -> None:
        if self.train_grids is not None:
            return
        want = self._meta()
        path = self._path(cache_dir) if cache_dir else None
        z = cached_npz(path, lambda: dict(zip(("train", "test"), split_grids(
            self.n, self.cfg.n_train, self.cfg.n_test, self.cfg.data_seed, self.cfg.split_by)),
            meta=np.array(json.dumps(want))))
        train, test, self._data_path = z["train"], z["test"], path
        have = json.loads(str(z["meta"]))
        if any(have.get(k) != want[k] for k in want if k != "version") \
                or (len(train), len(test)) != (self.cfg.n_train, self.cfg.n_test):
            raise ValueError(f"{path}: cached Sudoku data holds {have}, but the config asks for {want}; "
                             f"move the file away to regenerate it")
        self.train_grids = torch.from_numpy(train)
        self._test_grids = test
        test_x0 = torch.from_numpy(test)
        gen = torch.Generator().manual_seed(self.cfg.data_seed + 7919)
        self.test = EvalSet(test_x0, self._givens(test_x0.shape[0], gen))

    @functools.cached_property
    def val(self) -> EvalSet:
        """The validation split, made on first use (tuning, selection): training never waits for it."""
        c = self.cfg
        path = val_path(self._data_path, c.val_size)
        want = {"n_val": c.val_size, "split_by": c.split_by, "stream": VAL_STREAM,
                "of": os.path.basename(self._data_path or "")}
        z = cached_npz(path, lambda: {"val": val_grids(self.n, c.val_size, c.data_seed, self.train_grids.numpy(),
                                                       self._test_grids, c.split_by),
                                      "meta": np.array(json.dumps(want))})
        if (have := json.loads(str(z["meta"]))) != want:
            raise ValueError(f"{path}: cached validation grids hold {have}, but {want} is asked; "
                             f"move the file away to regenerate it")
        x0 = torch.from_numpy(z["val"])
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
        return self.test if self.cfg.split_of(split) == "test" else self.val

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

        # by a table of code points, one a character: `study verify` re-scores every kept output
        def tokens(text: str, blank: int) -> np.ndarray:
            codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
            t = _ascii_tokens(digits)[np.minimum(codes, 127)]  # past ASCII: no digit, as DEL (127)
            return np.where(t < 0, blank, t)[None]

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


@functools.lru_cache(maxsize=None)
def _ascii_tokens(digits: str) -> np.ndarray:
    """ASCII code -> the token of that digit (its place in `digits`), -1 for any other character."""
    table = np.full(128, -1, dtype=np.int64)
    table[[ord(ch) for ch in digits]] = np.arange(len(digits))
    return table


def _fixed_rate(rate) -> float | None:
    return float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) else None
