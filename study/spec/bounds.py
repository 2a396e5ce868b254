"""Every size a grid sets, bounded before anything is built (study/spec/grid.py checks each resolved run
here): a model of 100,000 layers, a width of 10^9 or a billion loops would take minutes to plan, or crash, or
never finish. Explicit caps far above any study this tool runs, and the estimate of a training step's peak
memory (model/costs.train_step_memory with a lower bound of the parameters) against MAX_STEP_BYTES, more than
any single device or host a trial runs on holds. Numbers must also be finite and fit a 64-bit integer (seeds
are given to torch and numpy)."""
from __future__ import annotations

import functools
import math
import os
import re
from typing import Any

from study.spec.sections import Err, GridError, short
from tasks import TASKS, make_task

BOUNDS = {
    "model.K": 1024, "model.L": 1024, "model.d_model": 65536, "model.n_heads": 1024, "model.mlp_ratio": 64,
    "train.steps": 10_000_000, "train.batch_size": 1 << 20, "train.warmup": 10_000_000,
    "train.truncate_k": 1024, "train.min_depth": 1024, "train.checkpoint_every": 10_000_000,
    "train.log_every": 10_000_000, "eval.T": 65536, "eval.L_s": 1024, "eval.n_examples": 10_000_000,
    "eval.n_samples_kept": 10_000_000, "eval.adaptive.max_loops": 1024, "task.seq_len": 65536,
    "task.n_train": 100_000_000, "resources.cpu": 4096, "resources.gpu": 1024, "retries": 100,
    "grid.runs": 10_000,  # points a grid expands to, counted before expanding; $RMDM_MAX_RUNS overrides it
}
MAX_RUNS_ENV = "RMDM_MAX_RUNS"


def max_runs() -> int:
    """BOUNDS['grid.runs'], or $RMDM_MAX_RUNS (a positive integer) where set."""
    v = os.environ.get(MAX_RUNS_ENV)
    if not v:
        return BOUNDS["grid.runs"]
    if not v.isdigit() or int(v) < 1:
        raise GridError(f"${MAX_RUNS_ENV}={short(v)}: a positive integer is meant (the most runs a grid may "
                        f"expand to; default {BOUNDS['grid.runs']:,})")
    return int(v)
MAX_STEP_BYTES = 1 << 40  # 1 TiB: a training step's estimated peak memory (weights, AdamW, activations)
MAX_SEQ_LEN = BOUNDS["task.seq_len"]


def check_bounds(sections: dict, retries: int, err: Err) -> None:
    """The validated sections of a run ({"task": TaskConfig, "model": ModelConfig, ...}) within the bounds."""
    for sec, cfg in sections.items():
        for key, v in _numbers(cfg.model_dump(), sec):
            if isinstance(v, float) and not math.isfinite(v):
                err(key, f"must be a finite number (got {v})")
            if isinstance(v, int) and abs(v) >= 1 << 63:
                err(key, f"must fit a 64-bit integer, |value| < 2^63 (got {short(v)})")
            cap = BOUNDS.get(re.sub(r"\[\d+\]", "", key))  # eval.T[2]: eval.T's bound
            if cap is not None and isinstance(v, (int, float)) and v > cap:
                err(key, f"{short(v)} is beyond the bound {cap:,} (study/spec/bounds.py BOUNDS: more than any "
                         f"study here can train or evaluate)")
    if retries > BOUNDS["retries"]:
        err("retries", f"{retries} is beyond the bound {BOUNDS['retries']}")
    task, model, train = sections["task"], sections["model"], sections["train"]
    seq_len, vocab = _task_shape(task.name, task.model_dump_json())
    if seq_len > MAX_SEQ_LEN:
        err("task", f"task {task.name} gives sequences of {seq_len:,} tokens; the bound is {MAX_SEQ_LEN:,} "
                    f"(study/spec/bounds.py BOUNDS)")
    from model.costs import train_step_memory

    d = model.d_model
    n_params = model.K * int((4 + 2 * model.mlp_ratio) * d * d) + (vocab + seq_len) * d  # a lower bound
    mem = train_step_memory(model, train, seq_len, vocab, n_params)["total"]
    if mem > MAX_STEP_BYTES:
        err("model", f"a training step needs about {mem / 2**30:,.0f} GiB (K={model.K}, L={model.L}, "
                     f"d_model={d}, batch_size={train.batch_size}, {seq_len} tokens; at least {n_params:,} "
                     f"parameters at 16 bytes each with AdamW, and the activations); the bound is "
                     f"{MAX_STEP_BYTES / 2**30:,.0f} GiB (study/spec/bounds.py MAX_STEP_BYTES)")


def _numbers(d: Any, key: str):
    """(dotted key, value) of every number in a dumped config, lists indexed (`eval.T[2]`)."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _numbers(v, f"{key}.{k}")
    elif isinstance(d, (list, tuple)):
        for i, v in enumerate(d):
            yield from _numbers(v, f"{key}[{i}]")
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        yield key, d


@functools.lru_cache(maxsize=256)
def _task_shape(task_name: str, task_json: str) -> tuple[int, int]:
    """(sequence length, vocabulary size) of a task, without its data (a text8 `seq_len` is checked
    before its position ids are built)."""
    cfg = TASKS[task_name][0].model_validate_json(task_json)
    declared = getattr(cfg, "seq_len", None)
    if isinstance(declared, int) and declared > MAX_SEQ_LEN:
        return declared, 1
    task = make_task(cfg)
    return len(task.pos_ids()), task.vocab_size
