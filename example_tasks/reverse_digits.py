"""A task of one's own, in one file: reverse a short list of digits (docs/guide/new-task.md walks through it).

Imported as a plugin (RMDM_STUDY_TASKS=example_tasks.reverse_digits), it registers the task, and every `study`
command and Ray worker then knows `task: {name: reverse_digits}`.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

import tasks
from tasks import DataBound, EvalSet, Metric, Task, TaskConfig


class ReverseConfig(TaskConfig):
    name: Literal["reverse_digits"] = "reverse_digits"
    length: int = Field(4, ge=2, le=6, description="digits per list")
    n_train: int = Field(200, ge=1)
    n_test: int = Field(32, ge=1)
    n_val: int | None = Field(None, ge=1)  # None: as many as n_test
    data_seed: int = 0


class ReverseDigits(Task):
    """Input: `length` digits (given); output: the same digits reversed (to fill)."""

    name = "reverse_digits"
    metrics = (Metric("reversed", "reversed-correctly rate", "rate", unit=True, threshold=0.5),)
    primary_metric = "reversed"
    run_column_names = ("reverse_length",)  # a run column of its own in the report's tables
    aliases = ("length",)  # `length: [3, 4]` as an axis, `length=5` on the command line

    def __init__(self, cfg: ReverseConfig):
        super().__init__(cfg)
        self.L, self.lists = cfg.length, None

    vocab_size = property(lambda self: 10)

    def pos_ids(self):
        return tuple((i,) for i in range(2 * self.L))

    def pos_sizes(self):
        return (2 * self.L,)

    def free_positions(self):
        return self.L, self.L

    @classmethod
    def run_columns(cls, params: dict) -> dict:
        return {"reverse_length": params.get("length", 4)}

    def max_examples(self) -> DataBound:
        return DataBound(10 ** self.L, f"distinct lists of {self.L} digits")

    def prepare(self, cache_dir):
        c = self.cfg
        codes = np.random.default_rng(c.data_seed).permutation(10 ** self.L)[: c.n_train + c.n_test + c.val_size]
        self.lists = codes[:, None] // 10 ** np.arange(self.L - 1, -1, -1) % 10  # distinct lists, split in order

    def _examples(self, lists: np.ndarray) -> EvalSet:
        x0 = torch.from_numpy(np.concatenate([lists, lists[:, ::-1]], axis=1).copy()).long()
        cond = torch.zeros_like(x0, dtype=torch.bool)
        cond[:, : self.L] = True  # the input is given, the answer is masked
        return EvalSet(x0, cond)

    def train_batch(self, batch_size, gen):
        ev = self._examples(self.lists[torch.randint(0, self.cfg.n_train, (batch_size,), generator=gen).numpy()])
        return ev.x0, ev.cond

    def eval_set(self, split="test"):
        c = self.cfg
        lo = c.n_train if c.split_of(split) == "test" else c.n_train + c.n_test
        return self._examples(self.lists[lo: lo + (c.n_test if split == "test" else c.val_size)])

    def score(self, output, ev):
        return [{"reversed": float(bool((o[self.L:] == o[: self.L].flip(0)).all() and (o[: self.L] == r[: self.L]).all()))}
                for o, r in zip(output.cpu(), ev.x0.cpu())]

    def render(self, tokens, cond=None):
        keep = cond.tolist() if cond is not None else [True] * len(tokens)
        return "".join(str(v) if k and 0 <= v < 10 else "." for v, k in zip(tokens.tolist(), keep))

    def rescore(self, input_text, output_text, reference_text):
        """`study verify` scores each stored output again from its text."""
        if len(output_text) != 2 * self.L or not output_text.isdigit():
            raise ValueError(f"expected {2 * self.L} digits, got {output_text!r}")
        return {"reversed": float(output_text[self.L:] == output_text[: self.L][::-1]
                                  and output_text[: self.L] == input_text[: self.L])}


tasks.register(ReverseConfig, ReverseDigits)
