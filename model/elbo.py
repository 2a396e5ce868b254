"""The masked-diffusion NLL bound (negative ELBO) of a sequence, for likelihood-scored tasks.

With the linear schedule (a token is masked with probability t), the continuous-time MDLM bound is

    -log p(x0) <= integral_0^1 (1/t) E_{x_t}[ sum over masked i of -log p(x0_i | x_t) ] dt,

the training loss of `model.train.diffusion_loss` before its division by the sequence length.
It is estimated at a fixed set of t values (the caller's: stratified and seeded, so two models
are compared on the same noise) with one seeded mask per t, and averaged over them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from model.rmdm import RecursiveDenoiser
from model.precision import autocast


@torch.no_grad()
def nll_bound(
    model: RecursiveDenoiser,
    x0: torch.Tensor,
    cond: torch.Tensor,
    t_values: torch.Tensor,
    n_loops: int | None = None,
    seed: int = 0,
    precision: str = "float32",
) -> torch.Tensor:
    """(B,) NLL bound in nats of the free (non-conditioning) tokens of each sequence.

    x0: (B, N) clean tokens; cond: (B, N) bool, given positions (never masked, not scored).
    t_values: (M,) noise levels in (0, 1]; the estimate is the mean over them of
    (1/t) * (cross-entropy summed over the tokens masked at t). Divide by the number of free
    tokens for a per-token figure.
    """
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    B, N = x0.shape
    total = torch.zeros(B, dtype=torch.float64)
    for t in t_values.tolist():
        u = torch.rand(B, N, generator=gen).to(x0.device)
        masked = (u < t) & ~cond  # (B, N)
        xt = torch.where(masked, torch.full_like(x0, model.spec.mask_id), x0)
        with autocast(x0.device, precision):
            logits = model(xt, n_loops=n_loops, all_logits=False)[-1].float()  # (B, N, V)
        ce = F.cross_entropy(logits.reshape(B * N, -1), x0.reshape(-1), reduction="none").view(B, N)
        total += ((ce * masked).sum(1) / t).double().cpu()
    return total / len(t_values)
