"""What every task declares: sequence, vocabulary, conditioning, data and scoring.

Tasks never import `model` (nor `study`): the model learns vocabulary size and position ids
from these declarations through `study`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from atomicio import AtomicFile



SPLITS = ("test", "val")  # every task has both: numbers are reported on test, selection happens on val


def save_npz(path: str, **arrays) -> None:
    """Atomically: a reader never sees half a file, and concurrent trials may write the same one."""
    with AtomicFile(path) as f:
        np.savez_compressed(f.file, **arrays)


class TaskConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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


@dataclass
class EvalSet:
    """A fixed evaluation split: clean targets, conditioning mask, and a text per example."""

    x0: torch.Tensor  # (n, N) reference tokens
    cond: torch.Tensor  # (n, N) bool, positions given to the model

    def __len__(self) -> int:
        return self.x0.shape[0]

    def head(self, n: int) -> "EvalSet":
        return EvalSet(self.x0[:n], self.cond[:n])


class Task(ABC):
    name: str
    metrics: ClassVar[tuple[Metric, ...]]  # every metric the task reports, its headline first
    primary_metric: ClassVar[str]  # the headline: figures, comparisons, tuning and loggers read it
    # 'sample': evaluation samples outputs and scores them (study.evaluate); 'likelihood': it computes the
    # model's NLL bound instead
    eval_mode: ClassVar[Literal["sample", "likelihood"]] = "sample"

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

    # ---- data ------------------------------------------------------------------------------
    @abstractmethod
    def prepare(self, cache_dir: str | None) -> None:
        """Generate (or load from `cache_dir`) the datasets; deterministic from the config."""

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
        keys, asked = ["task.n_train", "task.n_test"], c.n_train + c.n_test
        if "val" in {c.split_of(s) for s in splits}:
            keys.append("task.n_val" if getattr(c, "n_val", None) is not None else "task.n_val (default: n_test)")
            asked += c.val_size
        if asked > bound.count:
            parts = [str(c.n_train), str(c.n_test)] + ([str(c.val_size)] if len(keys) == 3 else [])
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
