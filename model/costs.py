"""What a model's and its training's configs imply, without torch (`study plan`, `status` and `verify` read
it without importing torch): the training schedules, the parameter counts and shapes, and compute accounting.

Schedules: the depth L_t, loss weights over loops and learning rate of a step are pure functions of the
step: a run resumed from a checkpoint at step s continues with exactly the depths it would have seen.

Parameter counts and shapes are counted from the layers' shapes; RecursiveDenoiser.param_counts counts the
built model's tensors, and tests/test_imports.py checks that the two agree.

Compute accounting of (K x L) models: training FLOPs and inference FLOPs (iso-FLOP pairing of a study's
models lives in analysis.tables.iso_flop_pairs). Conventions (`flops_per_forward`): matmul FLOPs only, 2 per
multiply-add; a backward pass costs twice its forward, so a training step costs 3x the forward it runs.
Parameters are those of K layers (independent of L); FLOPs are those of K * L layers.
"""
from __future__ import annotations

import math
from collections import Counter

from model.config import ModelConfig, TrainConfig


# ---- schedules -----------------------------------------------------------------------------------
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


# ---- parameters and FLOPs per forward ------------------------------------------------------------
def flops_per_forward(cfg: ModelConfig, seq_len: int, vocab_size: int, n_loops: int | None = None, heads: int = 1) -> int:
    """Matmul FLOPs of one forward pass of one sequence through n_loops loops.

    2 FLOPs per multiply-add; per layer and token: the four d x d projections, the MLP,
    and attention scores + weighted sum (2 * 2 * N * d). `heads` is how many times the
    output head runs (1 when sampling; n_loops when training with a loss on every loop).
    """
    n_loops = n_loops or cfg.L
    d, N = cfg.d_model, seq_len
    hidden = int(cfg.mlp_ratio * d)
    per_layer = N * (2 * 4 * d * d + 2 * 2 * d * hidden) + 2 * 2 * N * N * d
    head = 2 * N * d * vocab_size
    return n_loops * cfg.K * per_layer + heads * head


def param_counts(cfg: ModelConfig, vocab_size: int, pos_sizes) -> dict[str, int]:
    """RecursiveDenoiser(cfg, SeqSpec(vocab_size, ..., pos_sizes)).param_counts(), counted from `param_shapes`
    (the final norm is the head's)."""
    parts = dict.fromkeys(("embedding", "step_embedding", "block", "head"), 0)
    part_of = {"tok_emb": "embedding", "pos_embs": "embedding", "step_emb": "step_embedding", "block": "block"}
    for name, shape in param_shapes(cfg, vocab_size, pos_sizes).items():
        parts[part_of.get(name.split(".")[0], "head")] += math.prod(shape)
    total = sum(parts.values())
    return {"total": total, "non_embedding": total - parts["embedding"], **parts}


def param_shapes(cfg: ModelConfig, vocab_size: int, pos_sizes) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each tensor of RecursiveDenoiser(cfg, SeqSpec(vocab_size, ..., pos_sizes)).state_dict(),
    from the layers of model/rmdm.py (`study verify` checks stored weights against it without torch;
    tests/test_imports.py checks it against the built model's)."""
    d, hidden = cfg.d_model, int(cfg.mlp_ratio * cfg.d_model)
    out: dict[str, tuple[int, ...]] = {"tok_emb.weight": (vocab_size + 1, d)}
    out.update({f"pos_embs.{i}.weight": (n, d) for i, n in enumerate(pos_sizes)})

    def linear(name: str, n_in: int, n_out: int) -> None:
        out[f"{name}.weight"], out[f"{name}.bias"] = (n_out, n_in), (n_out,)

    if cfg.step_emb == "mlp":
        linear("step_emb.mlp.0", 1, d)
        linear("step_emb.mlp.2", d, d)
    for k in range(cfg.K):
        p = f"block.{k}"
        out[f"{p}.norm1.weight"], out[f"{p}.norm1.bias"] = (d,), (d,)
        linear(f"{p}.attn.qkv", d, 3 * d)
        linear(f"{p}.attn.proj", d, d)
        out[f"{p}.norm2.weight"], out[f"{p}.norm2.bias"] = (d,), (d,)
        linear(f"{p}.mlp.0", d, hidden)
        linear(f"{p}.mlp.2", hidden, d)
    out["norm.weight"], out["norm.bias"] = (d,), (d,)
    linear("head", d, vocab_size)
    return out


# ---- compute accounting --------------------------------------------------------------------------
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
