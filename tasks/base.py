"""What every task declares: sequence, vocabulary, conditioning, data and scoring.

Tasks never import `model` (nor `study`): the model learns vocabulary size and position ids
from these declarations through `study`.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from stats import wilson  # noqa: F401  (re-exported: tasks.wilson)


SPLITS = ("test", "val")  # every task has both: numbers are reported on test, selection happens on val


def save_npz(path: str, **arrays) -> None:
    """Atomically: a reader never sees half a file, and concurrent trials may write the same one."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


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
    metric_names: tuple[str, ...]
    primary_metric: str

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

    # ---- scoring ---------------------------------------------------------------------------
    @abstractmethod
    def score(self, output: torch.Tensor, ev: EvalSet) -> list[dict[str, float]]:
        """Per-example scores (one dict of metric -> 0/1 or value per example)."""

    @abstractmethod
    def render(self, tokens: torch.Tensor, cond: torch.Tensor | None = None) -> str:
        """Human-readable text of one example (masked / non-given cells shown as '.')."""
