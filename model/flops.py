"""A model's parameter counts and matmul FLOPs per forward pass, from its config alone, without torch
(`study plan`, `status` and `verify` read them without importing it). RecursiveDenoiser.param_counts
counts the built model's tensors; tests/test_imports.py checks that the two agree."""
from __future__ import annotations

from model.config import ModelConfig


def flops_per_forward(cfg: ModelConfig, seq_len: int, vocab_size: int, n_loops: int | None = None, heads: int = 1) -> int:
    n_loops = n_loops or cfg.L
    d, N = cfg.d_model, seq_len
    hidden = int(cfg.mlp_ratio * d)
    per_layer = N * (2 * 4 * d * d + 2 * 2 * d * hidden) + 2 * 2 * N * N * d
    head = 2 * N * d * vocab_size
    return n_loops * cfg.K * per_layer + heads * head


def param_counts(cfg: ModelConfig, vocab_size: int, pos_sizes) -> dict[str, int]:
    """RecursiveDenoiser(cfg, SeqSpec(vocab_size, ..., pos_sizes)).param_counts(), counted from the layers'
    shapes (weights and biases of each Linear, LayerNorm and Embedding of model/rmdm.py)."""
    d, hidden = cfg.d_model, int(cfg.mlp_ratio * cfg.d_model)
    linear = lambda n_in, n_out: n_in * n_out + n_out  # noqa: E731
    norm = 2 * d
    layer = norm + linear(d, 3 * d) + linear(d, d) + norm + linear(d, hidden) + linear(hidden, d)
    parts = {"embedding": (vocab_size + 1) * d + sum(pos_sizes) * d,  # + the mask token
             "step_embedding": linear(1, d) + linear(d, d) if cfg.step_emb == "mlp" else 0,
             "block": cfg.K * layer,
             "head": norm + linear(d, vocab_size)}
    total = sum(parts.values())
    return {"total": total, "non_embedding": total - parts["embedding"], **parts}
