"""What every task declares: sequence, vocabulary, conditioning, data and scoring.

Tasks never import `model` (nor `study`): the model learns vocabulary size and position ids
from these declarations through `study`.

Describing a task (its metrics, run columns, aliases, data bounds, split sizes) never imports torch:
`torch` below is imported on first use, where data are made, scored or rendered (so `study plan`,
`study report` and the Python API's tables load without it). Task modules take it from here.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Literal

import importlib
import os
from types import ModuleType

import numpy as np
from pydantic import BaseModel, ConfigDict

from atomicio import AtomicFile


class _OnFirstUse(ModuleType):
    """A module imported when one of its attributes is first read (`torch.zeros(...)`, `torch.Tensor`)."""

    def __getattr__(self, attr: str):
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)  # later reads are plain attribute reads
        return getattr(module, attr)


torch = _OnFirstUse("torch")


SPLITS = ("test", "val")  # every task has both: numbers are reported on test, selection happens on val


def save_npz(path: str, **arrays) -> None:
    """Atomically: a reader never sees half a file, and concurrent trials may write the same one."""
    with AtomicFile(path) as f:
        np.savez_compressed(f.file, **arrays)


def cached_npz(path: str | None, make) -> dict[str, np.ndarray]:
    """The arrays of the file `path`, else those `make()` returns, saved there (when a path is given)."""
    if path and os.path.exists(path):
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    data = make()
    if path:
        save_npz(path, **data)
    return data


def val_path(data_path: str | None, n_val: int) -> str | None:
    """Where the validation split of the data cached at `data_path` is cached (None: not cached)."""
    return f"{data_path[:-len('.npz')]}-val{n_val}.npz" if data_path else None


class TaskConfig(BaseModel):
    """A task's configuration: the grid's `task:` section, validated (pydantic, unknown keys refused).

    Besides `name: Literal["<task>"] = "<task>"`, the fields every task declares (`tasks.register` checks
    them; the engine, `study plan`'s cost model, `study verify` and the report read them through the
    methods below, never by name):
      n_test: int             examples of the test split (what is reported)
      n_val: int | None       examples of the validation split (selection); None: as many as n_test
      n_train: int            (a generated task) distinct training examples; a task trained on a fixed
                              corpus has none, and `max_examples` / `check_data` are its own
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    REQUIRED_FIELDS: ClassVar[tuple[str, ...]] = ("name", "n_test", "n_val")  # checked by tasks.register

    # per split, the fields that shape that split's examples and never the training data; an
    # evaluation is keyed by them (with the run id), so changing one re-evaluates, never reuses
    EVAL_FIELDS: ClassVar[dict[str, tuple[str, ...]]] = {"test": (), "val": ()}

    def split_of(self, split: str) -> str:
        """The split an evaluation of `split` actually reads ('test' or 'val')."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
        return split

    def eval_fields(self, split: str) -> dict[str, Any]:
        """The evaluation-only fields that decide which examples `split` holds."""
        return {k: getattr(self, k) for k in self.EVAL_FIELDS[self.split_of(split)]}

    @property
    def val_size(self) -> int:
        """Examples of the validation split: n_val, or n_test when n_val is unset."""
        return self.n_test if self.n_val is None else self.n_val

    def split_size(self, split: str) -> int:
        """Examples an evaluation of `split` (as the grid names it) holds at most: n_test or val_size."""
        return self.n_test if split == "test" else self.val_size

    @property
    def train_size(self) -> int | None:
        """Distinct training examples (n_train); None for a task trained on a fixed corpus."""
        return getattr(self, "n_train", None)

    @classmethod
    def eval_only_fields(cls) -> set[str]:
        """Every field that shapes an evaluation split only, never the trained model (not in the run id)."""
        return set().union(*cls.EVAL_FIELDS.values())


class DataBoundError(ValueError):
    """A config asks for more data than its task can give. `key` names the config key(s) at fault
    ('task.n_train + task.n_test', 'task.n_test', ...); the message says the bound and why."""

    def __init__(self, key: str, msg: str):
        super().__init__(f"{key}: {msg}")
        self.key, self.msg = key, msg


@dataclass(frozen=True)
class DataBound:
    """The most distinct examples a task's generator can make for train, test and val together (in the
    unit its splits are disjoint by), and what they are, for the message."""

    count: int
    what: str  # e.g. "distinct solved 4x4 grids (the generator reaches one symmetry class of the 288)"
    exact: bool = True  # False: an upper bound (the generator may find fewer)


@dataclass(frozen=True)
class Metric:
    """What the tool needs to know about one metric a task reports, so that nothing outside tasks/ keeps a
    table keyed by metric or task name.

    kind 'rate': a 0/1 score per example, whose interval is binomial (Wilson over examples; Agresti-Min
    for paired differences); 'mean': any other per-example value (t intervals)."""

    name: str
    label: str  # axis label, e.g. "valid puzzle rate (VPR)"
    kind: Literal["rate", "mean"] = "mean"
    higher_is_better: bool = True
    unit: bool = False  # drawn on a 0..1 axis
    threshold: float | None = None  # the success level a crossing or Pareto figure uses by default
    stored: bool = True  # False: derived by the report (text8's perplexity is exp(mean nll)), never an evals row
    needs_reference: bool = False  # scored against the reference output, not the input alone (exact match)
    # a likelihood metric (eval_mode 'likelihood'): the NLL bound per position in nats divided by this (1.0:
    # nats; ln 2: bits); study.engine.evaluate writes one evals row of each, verify derives each again
    likelihood: float | None = None

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The range a value and its interval can take: [0, 1] for a rate or a metric on a 0..1 axis (a mean
        of 0..1 scores, like cell accuracy), else None (unbounded: no clipping)."""
        return (0.0, 1.0) if self.kind == "rate" or self.unit else None


class InputFileError(ValueError):
    """An external input file (`study eval`) the task cannot read; the message names the file and line."""


class NotRescorable(Exception):
    """The task cannot score a stored output from its text alone (`study verify` says so)."""


@dataclass
class EvalSet:
    """A fixed evaluation split: clean targets, conditioning mask, and a text per example."""

    x0: torch.Tensor  # (n, N) reference tokens
    cond: torch.Tensor  # (n, N) bool, positions given to the model

    def __len__(self) -> int:
        return self.x0.shape[0]

    def head(self, n: int) -> "EvalSet":
        return EvalSet(self.x0[:n], self.cond[:n])


@dataclass
class Inputs:
    """A chunk of an external input file, as the sampler takes it (`Task.read_inputs`)."""

    x: torch.Tensor  # (n, N) tokens, the given positions filled (the others any valid token)
    cond: torch.Tensor  # (n, N) bool, positions given to the model
    reference: torch.Tensor | None  # (n, N) the file's solutions, when it has them
    start: int  # index in the file of the chunk's first example
    source: Any = None  # what the task needs to write the outputs back in the file's format


class Task(ABC):
    name: str
    metrics: ClassVar[tuple[Metric, ...]]  # every metric the task reports, its headline first
    primary_metric: ClassVar[str]  # the headline: figures, comparisons, tuning and loggers read it
    # eval_mode 'likelihood': the metric a samples row's `score` column holds (the primary metric by default)
    sample_score: ClassVar[str | None] = None
    # 'sample': evaluation samples outputs and scores them (study.engine.evaluate); 'likelihood': it computes the
    # model's NLL bound instead
    eval_mode: ClassVar[Literal["sample", "likelihood"]] = "sample"
    # config fields that tell a task's variants apart in `study plan`'s messages ("sudoku n=9 mask_rate=0.3")
    describe_fields: ClassVar[tuple[str, ...]] = ()
    # the report's run columns this task fills (`run_columns` gives their values): its own names, None in the
    # runs of other tasks; a name another task declares is the same column
    run_column_names: ClassVar[tuple[str, ...]] = ()
    # short grid keys for config fields of this task (`mask_rate` for task.mask_rate), beside the generic
    # ones (K, L, lr, ...; study/spec/sections.py), in axes and overrides
    aliases: ClassVar[tuple[str, ...]] = ()
    # the figures of a task's own sweeps ({"mask-rate": ("sudoku_n", "mask_rate")}): each figure's name and the
    # run columns it reads, in the order the figure documents; a figure draws the tasks that declare it
    figure_columns: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def metric_names_of(cls) -> tuple[str, ...]:
        """The metrics stored as evals rows (derived ones, like perplexity, are the report's)."""
        return tuple(m.name for m in cls.metrics if m.stored)

    @property
    def metric_names(self) -> tuple[str, ...]:
        return self.metric_names_of()

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg

    # ---- declarations ----------------------------------------------------------------------
    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def pos_ids(self) -> tuple[tuple[int, ...], ...]:
        """Per position, its id in each position channel."""

    @abstractmethod
    def pos_sizes(self) -> tuple[int, ...]: ...

    @property
    def seq_len(self) -> int:
        return len(self.pos_ids())

    @abstractmethod
    def free_positions(self) -> tuple[int, int]:
        """(fewest, most) positions of an example the sampler fills; from the config alone, no data
        (`study plan` warns when an eval T exceeds them: the sampler stops once nothing is masked)."""

    def describe(self) -> str:
        """The task and the config fields that tell its variants apart, for messages."""
        return " ".join([self.name] + [f"{k}={getattr(self.cfg, k)}" for k in self.describe_fields])

    @classmethod
    def variant_name(cls, params: dict) -> str:
        """A readable name of the variant a run's task parameters (its config as a dict) make: what the
        report groups runs by and titles panels with."""
        return cls.name

    @classmethod
    def run_columns(cls, params: dict) -> dict[str, Any]:
        """Values of this task's run columns (`run_column_names`) from a run's task parameters."""
        return {}

    @classmethod
    def metric_of(cls, name: str) -> Metric | None:
        """This task's declaration of metric `name` (None: it declares none of that name)."""
        return next((m for m in cls.metrics if m.name == name), None)

    @classmethod
    def likelihood_metrics(cls) -> tuple[Metric, ...]:
        """The stored likelihood metrics (Metric.likelihood) an evaluation in eval_mode 'likelihood' writes."""
        return tuple(m for m in cls.metrics if m.stored and m.likelihood is not None)

    # ---- data ------------------------------------------------------------------------------
    @abstractmethod
    def prepare(self, cache_dir: str | None) -> None:
        """Generate (or load from `cache_dir`) the datasets; deterministic from the config."""

    def upgrade_data(self, cache_dir: str) -> list[str]:
        """`study migrate`: this config's data cached in `cache_dir` by an older generation of the task's files,
        adopted in today's format (one line per file); `prepare` reads today's only."""
        return []

    @abstractmethod
    def train_batch(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(x0 (B, N) long, cond (B, N) bool), drawn with `gen` only."""

    @abstractmethod
    def eval_set(self, split: str = "test") -> EvalSet:
        """A fixed split: 'test' (what is reported) or 'val' (for selection: drawn from the training
        distribution, disjoint from test and from the training examples)."""

    # ---- data feasibility (checked by `study plan / run / tune` before anything runs) --------------
    def max_examples(self) -> DataBound | None:
        """How many distinct examples train, test and val can hold together; None: more than any config
        asks (no bound to check). Cheap: nothing is generated."""
        return None

    def check_data(self, splits: tuple[str, ...] = ("test",)) -> None:
        """Raise DataBoundError when train plus the evaluated `splits` ('test', 'val') ask for more
        examples than `max_examples` (the generator would search without end, or fail inside a trial).
        Tasks whose data is a fixed corpus override this."""
        bound = self.max_examples()
        if bound is None:
            return
        c = self.cfg
        keys, asked = ["task.n_train", "task.n_test"], c.train_size + c.n_test
        if "val" in {c.split_of(s) for s in splits}:
            keys.append("task.n_val" if c.n_val is not None else "task.n_val (default: n_test)")
            asked += c.val_size
        if asked > bound.count:
            parts = [str(c.train_size), str(c.n_test)] + ([str(c.val_size)] if len(keys) == 3 else [])
            most = "" if bound.exact else "at most "
            raise DataBoundError(" + ".join(keys), f"{' + '.join(parts)} = {asked} examples asked, but the task "
                                                   f"makes {most}{bound.count:,} {bound.what}: lower them")

    # ---- scoring ---------------------------------------------------------------------------
    @abstractmethod
    def score(self, output: torch.Tensor, ev: EvalSet) -> list[dict[str, float]]:
        """Per-example scores (one dict of metric -> 0/1 or value per example)."""

    @abstractmethod
    def render(self, tokens: torch.Tensor, cond: torch.Tensor | None = None) -> str:
        """Human-readable text of one example (masked / non-given cells shown as '.')."""

    def rescore(self, input_text: str, output_text: str, reference_text: str | None) -> dict[str, float]:
        """The scores of a stored output from the texts `render` gave (input with its cond, output and
        reference without): what `study verify` checks the stored scores against. Without a reference,
        only the metrics that need none. Raise ValueError for a text that does not parse, NotRescorable
        where the text does not determine the scores (verify then names them as not re-derived)."""
        raise NotRescorable(f"{self.name} per-example scores (no text re-scorer for this task)")

    def t_values(self) -> torch.Tensor:
        """eval_mode 'likelihood': the fixed noise levels t of the NLL estimate (study.engine.evaluate)."""
        raise NotImplementedError(f"task {self.name}: eval_mode 'likelihood' needs t_values()")

    # ---- external inputs (`study eval RUN --puzzles FILE`) ------------------------------------
    def read_inputs(self, path: str, chunk: int) -> Iterator[Inputs]:
        """The examples of an external file, `chunk` at a time, in file order; InputFileError names the
        file and line of a bad one. Tasks without a file format say so."""
        raise InputFileError(f"task {self.name!r} reads no external input files (`study eval` needs "
                             f"Task.read_inputs)")

    def format_outputs(self, inputs: Inputs, output: torch.Tensor) -> str:
        """The completed examples of `inputs`, in the file's order and format (`study eval --out`)."""
        raise InputFileError(f"task {self.name!r} writes no output files (`study eval --out` needs "
                             f"Task.format_outputs)")

    def metrics_without_reference(self) -> tuple[str, ...]:
        """The stored metrics an output can be scored on when an input file has no solutions."""
        return tuple(m.name for m in self.metrics if m.stored and not m.needs_reference)
