"""The recursive masked diffusion model: one shared K-layer block looped L times.

    h(0) = embed(x_t)
    h(l) = f(h(l-1) + v(l))            l = 1..L   (v: step embedding of s_l = (l-1)/(L-1))
    logits(l) = head(norm(h(l)))

and its sampler (`sample`, `sample_all`): T denoising steps of L_s loops each, fixed or adaptive depth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from model.config import ModelConfig
from model.costs import flops_per_forward, param_counts
from model.precision import autocast


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
        """Total and non-embedding parameters; independent of L by construction (model.costs.param_counts,
        whose shapes tests/test_imports.py checks against this model's tensors)."""
        return param_counts(self.cfg, self.spec.vocab_size, self.spec.pos_sizes)

    def flops_per_forward(self, n_loops: int | None = None, heads: int = 1) -> int:
        """model.costs.flops_per_forward of this model."""
        return flops_per_forward(self.cfg, self.spec.seq_len, self.spec.vocab_size, n_loops, heads)


# ---- the sampler ---------------------------------------------------------------------------------
# Iterative unmasking: T denoising steps, L_s loops of the shared block per step.
#
# Cost accounting, one meaning everywhere: a *forward pass* is one pass of an example through
# the shared K-layer block, so a denoising step at L_s loops costs L_s forward passes. The
# sampler stops as soon as nothing is masked, so it may run fewer than T steps (a 4x4 Sudoku
# with 6 blanks asked for T = 10 runs 6); `Sampled` says how many it ran, and the stored
# `forward_passes` / `eval_flops` are computed from that, never from T * L_s.
#
# Adaptive depth (`adaptive=threshold`): L_s is then a cap. Within a denoising step an example
# stops looping once its predictions have settled: the argmax at every masked position is the
# same after loop l as after loop l - 1, and the confidence (max softmax probability) at every
# masked position is >= the threshold. So at least two loops a step (one comparison), at most
# L_s; an example that settled stops spending loops while the rest of its batch goes on. The
# step embedding keeps s_l = (l-1)/(L_s-1) of the cap, so a threshold no prediction reaches
# (above 1) gives exactly the fixed-depth sampler at L_s. Its cost: every loop is one block
# pass (a forward pass) plus the head and final norm, which read the predictions after each
# loop (as training's loss over loops does); the fixed sampler reads them once per step.


class Sampled(NamedTuple):
    """What the sampler produced and what it cost.

    x: (B, N) the completed sequences.
    steps: (B,) denoising steps run on each example's batch (<= T).
    loops: L_s, block loops per step (the cap when adaptive).
    step_loops: (B, T) loops each example ran in each step (0 after its batch stopped);
        None means `loops` in every step run.
    adaptive: the settling threshold of an adaptive sampler, None for fixed depth.
    """

    x: torch.Tensor
    steps: torch.Tensor
    loops: int
    step_loops: torch.Tensor | None = None
    adaptive: float | None = None

    @property
    def passes(self) -> torch.Tensor:
        """(B,) forward passes (block passes) each example ran, all steps together."""
        if self.step_loops is None:
            return self.steps * self.loops
        return self.step_loops.sum(1)

    @property
    def forward_passes(self) -> int:
        """Forward passes (block passes, see the module docstring) per example: the most any
        example ran. Equal for every example when all have the same number of blanks and the
        depth is fixed."""
        return int(self.passes.max()) if len(self.steps) else 0

    @property
    def forward_passes_mean(self) -> float | None:
        """Forward passes per example, the mean over examples (what adaptive depth saves); None for none."""
        return float(self.passes.double().mean()) if len(self.steps) else None

    @property
    def model_calls(self) -> int:
        """Model calls summed over examples (each of L_s loops): eval FLOPs = this x flops_per_forward(L_s)
        at fixed depth; see `head_calls` for adaptive depth."""
        return int(self.steps.sum())

    @property
    def head_calls(self) -> int:
        """Applications of norm + head summed over examples: once per step at fixed depth, once
        per loop at adaptive depth (it reads the predictions after every loop)."""
        return int(self.passes.sum()) if self.adaptive is not None else self.model_calls


@torch.no_grad()
def sample_steps(
    model: RecursiveDenoiser,
    x: torch.Tensor,
    cond: torch.Tensor,
    T: int,
    L_s: int,
    unmask: Literal["confidence", "random"] = "confidence",
    temperature: float = 0.0,
    remask: float = 0.0,
    seed: int = 0,
    precision: str = "float32",
    adaptive: float | None = None,
) -> Sampled:
    """Fill every non-conditioning position of `x` in at most T steps (one batch).

    x: (B, N) tokens, values at ~cond positions are ignored (treated as masked).
    cond: (B, N) bool, the givens; they are never changed.
    Step i (of T) reveals ceil(remaining / (T - i)) masked positions per sample: the most
    confident ones (`confidence`) or a seeded random choice (`random`). `temperature` 0
    takes the argmax; above 0 samples from the softmax. `remask` > 0 re-masks that share of
    the lowest-confidence tokens decoded in earlier steps (never givens), as long as steps
    remain to fill them again. Stops early once nothing is masked (fewer blanks than T).
    `adaptive`: a confidence threshold in (0, 1]; each example then loops until its predictions
    settle, at most L_s times a step (see the module docstring).
    """
    if T < 1 or L_s < 1:
        raise ValueError(f"T and L_s must be >= 1 (got T={T}, L_s={L_s})")
    if adaptive is not None and not adaptive > 0:
        raise ValueError(f"adaptive must be a confidence threshold > 0 (got {adaptive})")
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    mask_id = model.spec.mask_id
    x = torch.where(cond, x, torch.full_like(x, mask_id))
    conf_kept = torch.full(x.shape, float("inf"), device=x.device)  # confidence of decoded tokens
    B = x.shape[0]
    steps = 0
    step_loops = torch.zeros(B, T, dtype=torch.long)  # (B, T) loops each example ran in each step
    for i in range(T):
        masked = x == mask_id  # (B, N)
        remaining = masked.sum(1)  # (B,)
        if B == 0 or int(remaining.max()) == 0:
            break
        steps += 1
        with autocast(x.device, precision):
            if adaptive is None:
                logits = model(x, n_loops=L_s, all_logits=False)[-1].float()  # (B, N, V)
                step_loops[:, i] = L_s
            else:
                logits, used = settled_logits(model, x, masked, L_s, adaptive)
                step_loops[:, i] = used.cpu()
        probs = torch.softmax(logits / max(temperature, 1e-6), dim=-1) if temperature > 0 else torch.softmax(logits, -1)
        if temperature > 0:
            pred = torch.multinomial(probs.view(-1, probs.shape[-1]).cpu(), 1, generator=gen)
            pred = pred.view(x.shape).to(x.device)
        else:
            pred = probs.argmax(-1)
        conf = probs.gather(-1, pred.unsqueeze(-1)).squeeze(-1)  # (B, N)
        steps_left = T - i
        k = torch.ceil(remaining.float() / steps_left).long()  # (B,) positions to reveal now
        if unmask == "confidence":
            score = conf.clone()
        else:
            score = torch.rand(x.shape, generator=gen).to(x.device)
        score = score.masked_fill(~masked, -float("inf"))
        order = score.argsort(dim=1, descending=True)
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(x.shape[1], device=x.device).expand(B, -1))
        reveal = masked & (rank < k.unsqueeze(1))
        x = torch.where(reveal, pred, x)
        conf_kept = torch.where(reveal, conf, conf_kept)
        if remask > 0 and steps_left > 1:
            x, conf_kept = _remask(x, cond, reveal, conf_kept, remask, mask_id)
    return Sampled(x, torch.full((B,), steps, dtype=torch.long), L_s, step_loops, adaptive)


def _remask(x: torch.Tensor, cond: torch.Tensor, reveal: torch.Tensor, conf_kept: torch.Tensor, remask: float,
            mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-open the `remask` share of the least confident tokens decoded in earlier steps (not the givens,
    not this step's reveals); later steps must fill them again. Returns (x, conf_kept)."""
    decoded = ~cond & (x != mask_id) & ~reveal
    n_re = (decoded.sum(1).float() * remask).floor().long()
    low = conf_kept.masked_fill(~decoded, float("inf"))
    order = low.argsort(dim=1)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1))
    re = decoded & (rank < n_re.unsqueeze(1))
    x = torch.where(re, torch.full_like(x, mask_id), x)
    return x, torch.where(re, torch.full_like(conf_kept, float("inf")), conf_kept)


def settled_logits(model: RecursiveDenoiser, x: torch.Tensor, masked: torch.Tensor, max_loops: int,
                   threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One denoising step at adaptive depth: (B, N, V) logits of the loop at which each example
    settled (its argmax at every masked position unchanged since the previous loop, and its
    confidence there >= threshold; else loop `max_loops`), and (B,) the loops each example ran.

    Settled examples leave the batch: later loops run on the others only, so they cost nothing.
    """
    B = x.shape[0]
    x_emb = model.embed(x)  # (B, N, D)
    h, e, m = x_emb, x_emb, masked  # rows of the examples still looping: (A, N, D), (A, N, D), (A, N)
    live = torch.arange(B, device=x.device)  # (A,) their rows in the batch
    used = torch.full((B,), max_loops, dtype=torch.long, device=x.device)
    out, prev = None, None
    for l in range(1, max_loops + 1):
        h = model.loop(h, e, l, max_loops)  # s_l of the cap: the same loops as fixed depth L_s = max_loops
        logits = model.logits(h).float()  # (A, N, V)
        if out is None:
            out = logits.new_empty(B, *logits.shape[1:])
        if l == max_loops:
            out[live] = logits
            break
        conf, pred = torch.softmax(logits, -1).max(-1)  # (A, N)
        if prev is not None:
            done = (((pred == prev) & (conf >= threshold)) | ~m).all(1)  # (A,) settled at every masked position
            if done.any():
                out[live[done]] = logits[done]
                used[live[done]] = l
                keep = ~done
                live, h, e, m, pred = live[keep], h[keep], e[keep], m[keep], pred[keep]
                if len(live) == 0:
                    break
        prev = pred
    return out, used


def sample(model: RecursiveDenoiser, x: torch.Tensor, cond: torch.Tensor, T: int, L_s: int, **kw) -> torch.Tensor:
    """The completed (B, N) sequences of `sample_steps` (same arguments), without the cost."""
    return sample_steps(model, x, cond, T, L_s, **kw).x


def sample_all(model: RecursiveDenoiser, x: torch.Tensor, cond: torch.Tensor, T: int, L_s: int,
               batch_size: int = 256, seed: int = 0, adaptive: float | None = None, **kw) -> Sampled:
    """`sample_steps` over any number of examples, `batch_size` at a time on the model's device.

    Batch i (starting at example i) is seeded `seed + i`, so an example's output does not
    depend on how many examples follow it. Returns x on the CPU.
    """
    device = next(model.parameters()).device
    xs, steps, loops = [], [], []
    for i in range(0, len(x), batch_size):
        out = sample_steps(model, x[i:i + batch_size].to(device), cond[i:i + batch_size].to(device), T, L_s,
                           seed=seed + i, adaptive=adaptive, **kw)
        xs.append(out.x.cpu())
        steps.append(out.steps)
        loops.append(out.step_loops)
    if not xs:
        return Sampled(x.clone(), torch.zeros(0, dtype=torch.long), L_s, torch.zeros(0, T, dtype=torch.long), adaptive)
    return Sampled(torch.cat(xs), torch.cat(steps), L_s, torch.cat(loops), adaptive)
