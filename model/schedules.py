"""Training-depth schedules and loss weights over loops: pure functions of the step.

Because the depth L_t of step s depends only on (config, s), a run resumed from a
checkpoint at step s continues with exactly the depths it would have seen.
"""
from __future__ import annotations

import math

from model.config import TrainConfig


def depth_at(step: int, total_steps: int, max_depth: int, cfg: TrainConfig) -> int:
    """L_t used at training step `step` (0-based) of `total_steps`."""
    lo = min(cfg.min_depth, max_depth)
    if cfg.schedule == "fixed" or max_depth == lo:
        return max_depth
    frac = step / max(total_steps - 1, 1)  # 0 at the first step, 1 at the last
    if cfg.schedule == "stochastic":
        import torch  # only here: a grid is read without torch

        g = torch.Generator().manual_seed(derive_seed(cfg.seed, step, 0x5EED))
        return int(torch.randint(lo, max_depth + 1, (1,), generator=g))
    if cfg.schedule == "curriculum":  # grows lo -> max_depth in equal stages
        return lo + min(int(frac * (max_depth - lo + 1)), max_depth - lo)
    if cfg.schedule == "reverse":  # starts at max_depth, ends at lo
        return max_depth - min(int(frac * (max_depth - lo + 1)), max_depth - lo)
    raise ValueError(f"unknown schedule {cfg.schedule!r}")


def loss_weights_problem(cfg: TrainConfig, max_depth: int) -> str | None:
    """The one rule of an explicit weighted loss's length (the grid's check and the trainer's both ask
    it): one weight per loop of the full depth L; anything else would silently weight other loops than
    the grid says (a shorter list drops loops, a longer one shifts). What is wrong, or None."""
    if cfg.loss == "weighted" and cfg.loss_weights is not None and len(cfg.loss_weights) != max_depth:
        return f"needs one weight per loop: {max_depth} values for L={max_depth} (got {len(cfg.loss_weights)})"
    return None


def check_loss_weights(cfg: TrainConfig, max_depth: int) -> None:
    """loss_weights_problem, raised (ValueError)."""
    problem = loss_weights_problem(cfg, max_depth)
    if problem:
        raise ValueError(f"loss_weights {problem}")


def loop_weights(n_loops: int, cfg: TrainConfig) -> list[float]:
    """Weight of each loop's loss (sums to 1) for a forward of n_loops loops."""
    # not the length rule (loss_weights_problem) but what this forward needs of any list it is given
    if cfg.loss == "weighted" and cfg.loss_weights is not None and len(cfg.loss_weights) < n_loops:
        raise ValueError(f"loss_weights has {len(cfg.loss_weights)} weights for a forward of {n_loops} loops")
    if cfg.loss == "all":
        w = [1.0] * n_loops
    elif cfg.loss == "final":
        w = [0.0] * (n_loops - 1) + [1.0]
    elif cfg.loss == "truncated":
        k = min(cfg.truncate_k, n_loops)
        w = [0.0] * (n_loops - k) + [1.0] * k
    elif cfg.loss == "weighted":
        # an explicit list is given for the full depth L; shallower steps use its last n_loops entries
        w = list(cfg.loss_weights[-n_loops:]) if cfg.loss_weights else [float(l) for l in range(1, n_loops + 1)]
    else:
        raise ValueError(f"unknown loss {cfg.loss!r}")
    s = sum(w)
    return [x / s for x in w]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1)
    cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


def derive_seed(*xs: int) -> int:
    """A deterministic 63-bit seed from integers: a run's seed, a step, a tag naming what the seed is
    for (Python's hash() is salted for str, not int, but we avoid relying on it)."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h = (h ^ (x & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h & 0x7FFFFFFFFFFFFFFF

