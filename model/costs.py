"""Compute accounting of (K x L) models: training FLOPs and inference FLOPs (iso-FLOP pairing of a study's
models lives in analysis.tables.iso_flop_pairs).

Conventions (as `rmdm.flops_per_forward`): matmul FLOPs only, 2 per multiply-add; a backward
pass costs twice its forward, so a training step costs 3x the forward it runs. Parameters are
those of K layers (independent of L); FLOPs are those of K * L layers.
"""
from __future__ import annotations

from collections import Counter

from model.config import ModelConfig, TrainConfig
from model.flops import flops_per_forward
from model.schedules import depth_at, loop_weights

# dense bf16 peak of accelerators (vendor datasheets, TFLOP/s without sparsity): (--device key, a
# substring of torch.cuda.get_device_name(), peak). Order matters for names: the first match wins
# ("H100 PCIe" before "H100", "A100" before "A10", "L40S" before "L40" before "L4").
BF16_PEAK_TFLOPS = (
    ("gh200", "GH200", 989.0), ("h200", "H200", 989.0), ("h100-pcie", "H100 PCIe", 756.0), ("h100", "H100", 989.0),
    ("h800", "H800", 989.0), ("b200", "B200", 2250.0), ("a100", "A100", 312.0), ("a800", "A800", 312.0),
    ("l40s", "L40S", 362.0), ("l40", "L40", 181.0), ("a10g", "A10G", 70.0), ("a10", "A10", 125.0), ("l4", "L4", 121.0),
    ("rtx4090", "RTX 4090", 165.0), ("rtx3090", "RTX 3090", 71.0), ("a6000", "A6000", 155.0),
)


def bf16_peak_flops(device: str) -> float | None:
    """FLOP/s of a device given by its --device key (`h100`) or its CUDA name (`NVIDIA H100 80GB HBM3`)."""
    key = device.strip().lower()
    by_key = next((t for k, _, t in BF16_PEAK_TFLOPS if k == key), None)
    tflops = by_key if by_key is not None else next((t for _, n, t in BF16_PEAK_TFLOPS if n.lower() in key), None)
    return tflops * 1e12 if tflops is not None else None


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


def inference_flops_per_sample(model_cfg: ModelConfig, seq_len: int, vocab_size: int, T: int, L_s: int,
                               adaptive: bool = False) -> int:
    """T denoising steps of L_s loops each, one output head per step: T * forward(L_s). With
    `adaptive` (L_s is then a cap) the head reads the predictions after every loop: L_s heads a step.
    An upper bound of what the sampler spends: it stops once nothing is masked (fewer steps than T),
    and adaptive depth stops looping once the predictions settle."""
    if T < 1 or L_s < 1:
        raise ValueError(f"T and L_s must be >= 1 (got T={T}, L_s={L_s})")
    return T * flops_per_forward(model_cfg, seq_len, vocab_size, L_s, heads=L_s if adaptive else 1)


# Bytes a training step keeps per token for backward, in multiples of d_model, per layer (float32,
# 4 bytes an element). A pre-norm layer saves: its input and norm1's output (2 d), the fused QKV
# output (3 d), the attention output that feeds the projection (1 d), the residual sum and norm2's
# output (2 d), the MLP's pre- and post-GELU hidden (2 * mlp_ratio * d): 8 d + 2 r d, 16 d at r = 4.
# Written-out attention (`math`) also keeps the softmax (n_heads * N) and the scaled queries (d);
# the fused kernel keeps only its output and a log-sum-exp. Per output head: the norm's output (d)
# and the logits and their log-softmax (2 V). bf16 autocast keeps some of these in 2 bytes: float32
# is the upper end. The checked constant: tests/test_plan_cost.py compares it with a measured step.
ACT_BYTES = 4
LAYER_SAVED_D = 8  # + 2 * mlp_ratio


def train_step_memory(model_cfg: ModelConfig, train_cfg: TrainConfig, seq_len: int, vocab_size: int,
                      n_params: int, attention: str | None = None) -> dict[str, int]:
    """Peak bytes of one training step at the full depth L (the deepest step a schedule runs), by part:
    `weights` (parameters, gradients and AdamW's two moments: 16 bytes a parameter, float32),
    `activations` (what backward needs: batch x seq x d_model x layers x loops x a constant, see
    ACT_BYTES / LAYER_SAVED_D; with `checkpoint_loops` one loop's layers plus every loop's input)
    and `total`. `attention` (default: the model's; `auto` counts the costlier `math`) sets the
    attention term. An estimate: allocator slack, kernels' workspaces and the framework are not in it."""
    B, N, d, K, L = train_cfg.batch_size, seq_len, model_cfg.d_model, model_cfg.K, model_cfg.L
    attention = attention or model_cfg.attention
    per_layer = (LAYER_SAVED_D + 2 * model_cfg.mlp_ratio) * d
    if attention in ("math", "auto"):
        per_layer += model_cfg.n_heads * N + d
    per_head = d + 2 * vocab_size
    layers_kept = K if model_cfg.checkpoint_loops else K * L
    # + the embedding's output and every loop's input (h + v(l)), kept either way
    per_token = layers_kept * per_layer + heads_run(L, train_cfg) * per_head + (L + 1) * d
    activations = int(ACT_BYTES * B * N * per_token)
    weights = 16 * n_params
    return {"weights": weights, "activations": activations, "total": weights + activations}
