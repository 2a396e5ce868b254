"""The recursive masked diffusion model: one shared K-layer block looped L times.

    h(0) = embed(x_t)
    h(l) = f(h(l-1) + v(l))            l = 1..L   (v: step embedding of s_l = (l-1)/(L-1))
    logits(l) = head(norm(h(l)))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from model.config import ModelConfig
from model.costs import flops_per_forward  # noqa: F401 (model.rmdm.flops_per_forward: the API)


@dataclass(frozen=True)
class SeqSpec:
    """What the model needs to know of a task: vocabulary and positions.

    `pos_ids[i][c]` is position i's id in channel c; channel c has `pos_sizes[c]` ids.
    One channel 0..N-1 is the plain learned position embedding; Sudoku can instead declare
    (row, column, box) channels whose embeddings are summed.
    """

    vocab_size: int
    pos_ids: tuple[tuple[int, ...], ...]
    pos_sizes: tuple[int, ...]

    @property
    def seq_len(self) -> int:
        return len(self.pos_ids)

    @property
    def mask_id(self) -> int:
        return self.vocab_size  # the extra input token; never predicted


class Attention(nn.Module):
    """Bidirectional multi-head attention with one fused QKV projection.

    `impl` picks the kernel, not the function: `sdpa` is torch's fused scaled_dot_product_attention,
    `math` writes out softmax(q k^T / sqrt(d_h)) v as plain matmuls, which bf16 autocast turns into
    bf16 GEMMs (on a CPU with AMX the fused kernel's backward is the slow part at sequence 81).
    """

    def __init__(self, d: int, n_heads: int, impl: str = "sdpa"):
        super().__init__()
        self.n_heads, self.impl = n_heads, impl
        self.scale = (d // n_heads) ** -0.5
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)  # (3, B, H, N, Dh)
        if self.impl == "math":
            # one copy into head-major layout; the batched matmuls below then need no copies of their own
            q, k, v = qkv.contiguous().unbind(0)  # (B, H, N, Dh) each
            att = torch.softmax((q * self.scale) @ k.transpose(-2, -1), dim=-1)  # (B, H, N, N), no causal mask
            y = att.to(v.dtype) @ v  # softmax runs in float32 under autocast; the product in v's dtype
        else:
            q, k, v = qkv.unbind(0)  # strided views: the fused kernel reads them as they are
            y = F.scaled_dot_product_attention(q, k, v)  # bidirectional: no causal mask
        return self.proj(y.transpose(1, 2).reshape(B, N, D))


class Layer(nn.Module):
    """Pre-norm transformer layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hidden = cfg.d_model, int(cfg.mlp_ratio * cfg.d_model)
        self.norm1 = nn.LayerNorm(d)
        self.attn = Attention(d, cfg.n_heads, "math" if cfg.attention == "math" else "sdpa")
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, d))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


# The fixed (sinusoidal) step embedding is added to a residual stream whose embeddings start at
# std 0.02 (RecursiveDenoiser._init): at its raw size (rms 0.71, 18x the input embedding) it drowned
# the input and a 9x9 Sudoku (1 x 3) stayed at chance loss for 500 steps (docs/REPRODUCTION.md).
# Scaled to rms 0.02, the size of one learned embedding at initialisation.
SIN_SCALE = 0.02 * math.sqrt(2.0)


class StepEmbedding(nn.Module):
    """v(l) from s_l = (l-1)/(L-1) in [0, 1]; s = 0 when L = 1."""

    def __init__(self, kind: str, d: int):
        super().__init__()
        self.kind, self.d = kind, d
        if kind == "mlp":
            self.mlp = nn.Sequential(nn.Linear(1, d), nn.SiLU(), nn.Linear(d, d))

    def forward(self, s: float, like: torch.Tensor) -> torch.Tensor | None:
        if self.kind == "none":
            return None
        s_t = like.new_full((1, 1), s)  # (1, 1); a fill on the device, not a host-to-device copy
        if self.kind == "mlp":
            return self.mlp(s_t)  # (1, D), broadcast over batch and positions
        half = self.d // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=like.device, dtype=like.dtype) / half)
        ang = s_t * 100.0 * freqs  # s in [0, 1] scaled so neighbouring loops differ
        emb = torch.cat([ang.sin(), ang.cos()], dim=-1) * SIN_SCALE
        return F.pad(emb, (0, self.d - emb.shape[-1]))


def loop_position(l: int, n_loops: int) -> float:
    """s_l for loop l (1-based) of n_loops."""
    return 0.0 if n_loops == 1 else (l - 1) / (n_loops - 1)


class RecursiveDenoiser(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: SeqSpec):
        super().__init__()
        self.cfg, self.spec = cfg, spec
        d = cfg.d_model
        self.tok_emb = nn.Embedding(spec.vocab_size + 1, d)  # + the mask token
        self.pos_embs = nn.ModuleList(nn.Embedding(n, d) for n in spec.pos_sizes)
        self.register_buffer("pos_ids", torch.tensor(spec.pos_ids, dtype=torch.long), persistent=False)  # (N, C)
        self.step_emb = StepEmbedding(cfg.step_emb, d)
        self.block = nn.ModuleList(Layer(cfg) for _ in range(cfg.K))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, spec.vocab_size)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def set_attention(self, impl: str) -> None:
        """Switch every layer's attention kernel (`sdpa` or `math`): same weights, same function."""
        if impl not in ("sdpa", "math"):
            raise ValueError(f"attention must be 'sdpa' or 'math' (got {impl!r})")
        for layer in self.block:
            layer.attn.impl = impl

    @property
    def attention(self) -> str:
        return self.block[0].attn.impl

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_emb(x)  # (B, N, D)
        for c, emb in enumerate(self.pos_embs):
            h = h + emb(self.pos_ids[:, c])
        return h

    def run_block(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            h = layer(h)
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(h))

    def forward(self, x: torch.Tensor, n_loops: int | None = None, all_logits: bool = True) -> list[torch.Tensor]:
        """Logits after every loop (or only the last one when `all_logits` is False).

        x: (B, N) token ids with `spec.mask_id` where masked. Returns a list of (B, N, V).
        """
        n_loops = n_loops or self.cfg.L
        x_emb = self.embed(x)
        h = x_emb
        out = []
        for l in range(1, n_loops + 1):
            h = self.loop(h, x_emb, l, n_loops)
            if all_logits or l == n_loops:
                out.append(self.logits(h))
        return out

    def loop(self, h: torch.Tensor, x_emb: torch.Tensor, l: int, n_loops: int) -> torch.Tensor:
        """h(l) from h(l-1): loop l (1-based) of n_loops, one pass through the shared block.
        (The adaptive sampler calls it directly, on the examples still looping.)"""
        v = self.step_emb(loop_position(l, n_loops), h)
        if v is not None:
            h = h + v
        if self.cfg.reinject_input and l > 1:
            h = h + x_emb  # l = 1 already starts from x_emb
        if self.cfg.checkpoint_loops and self.training and torch.is_grad_enabled():
            # keep only the loop's input; recompute the K layers in backward
            return checkpoint(self.run_block, h, use_reentrant=False)
        return self.run_block(h)

    # ---- cost accounting -------------------------------------------------------------------
    def param_counts(self) -> dict[str, int]:
        """Total and non-embedding parameters; independent of L by construction."""
        parts = {
            "embedding": sum(p.numel() for p in self.tok_emb.parameters())
            + sum(p.numel() for p in self.pos_embs.parameters()),
            "step_embedding": sum(p.numel() for p in self.step_emb.parameters()),
            "block": sum(p.numel() for p in self.block.parameters()),
            "head": sum(p.numel() for p in self.norm.parameters()) + sum(p.numel() for p in self.head.parameters()),
        }
        total = sum(p.numel() for p in self.parameters())
        assert sum(parts.values()) == total, (parts, total)
        return {"total": total, "non_embedding": total - parts["embedding"], **parts}

    def flops_per_forward(self, n_loops: int | None = None, heads: int = 1) -> int:
        """Matmul FLOPs of one forward pass of one sequence through n_loops loops.

        2 FLOPs per multiply-add; per layer and token: the four d x d projections, the MLP,
        and attention scores + weighted sum (2 * 2 * N * d). `heads` is how many times the
        output head runs (1 when sampling; n_loops when training with a loss on every loop).
        """
        return flops_per_forward(self.cfg, self.spec.seq_len, self.spec.vocab_size, n_loops, heads)

