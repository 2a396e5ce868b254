"""Compute accounting of (K x L) models: training FLOPs and inference FLOPs (iso-FLOP pairing of a study's
models lives in analysis.tables.iso_flop_pairs).

Conventions (as `rmdm.flops_per_forward`): matmul FLOPs only, 2 per multiply-add; a backward
pass costs twice its forward, so a training step costs 3x the forward it runs. Parameters are
those of K layers (independent of L); FLOPs are those of K * L layers.
"""
from __future__ import annotations

from collections import Counter

from model.config import ModelConfig, TrainConfig
from model.rmdm import flops_per_forward
from model.schedules import depth_at, loop_weights


def heads_run(n_loops: int, train_cfg: TrainConfig) -> int:
    """How many loops' output heads a training step of n_loops computes (mirrors `diffusion_loss`:
    when only the last loop has a weight, the earlier loops' logits are never formed)."""
    w = loop_weights(n_loops, train_cfg)
    return n_loops if any(x > 0 for x in w[:-1]) else 1


def train_flops_per_step(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    seq_len: int,
    vocab_size: int,
    n_loops: int | None = None,
    recompute: bool | None = None,
) -> int:
    """FLOPs of one optimisation step of `batch_size` sequences at depth n_loops (default: L).

    Forward + backward = 3 x forward, counting the loops actually run and the heads actually
    computed. With `recompute` (default: the model's `checkpoint_loops`) the block's forward
    runs a second time in backward: hardware FLOPs rather than model FLOPs.
    """
    n_loops = n_loops or model_cfg.L
    heads = heads_run(n_loops, train_cfg)
    fwd = flops_per_forward(model_cfg, seq_len, vocab_size, n_loops, heads)
    total = 3 * fwd
    if model_cfg.checkpoint_loops if recompute is None else recompute:
        total += flops_per_forward(model_cfg, seq_len, vocab_size, n_loops, 0)  # block only, heads not recomputed
    return train_cfg.batch_size * total


def train_flops_total(model_cfg: ModelConfig, train_cfg: TrainConfig, seq_len: int, vocab_size: int) -> int:
    """Model FLOPs of a whole run: the depth schedule decides each step's L_t (a pure function of the step)."""
    # a step's FLOPs depend on its depth only: count the steps per depth, price each depth once
    depths = Counter(depth_at(s, train_cfg.steps, model_cfg.L, train_cfg) for s in range(train_cfg.steps))
    return sum(n * train_flops_per_step(model_cfg, train_cfg, seq_len, vocab_size, d, recompute=False)
               for d, n in depths.items())


def inference_flops_per_sample(model_cfg: ModelConfig, seq_len: int, vocab_size: int, T: int, L_s: int) -> int:
    """T denoising steps of L_s loops each, one output head per step: T * forward(L_s)."""
    if T < 1 or L_s < 1:
        raise ValueError(f"T and L_s must be >= 1 (got T={T}, L_s={L_s})")
    return T * flops_per_forward(model_cfg, seq_len, vocab_size, L_s, heads=1)
