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
