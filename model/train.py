"""Masked-diffusion training of an R-MDM, resumable to the step.

Data comes from a `batch_fn(step, generator) -> (x0, cond)` given by the caller; the
generator is seeded from (seed, step), so the batch and the noise of every step are a pure
function of the step, and a run resumed at step s sees exactly what it would have seen.
"""
from __future__ import annotations

import contextlib
import functools
import os
import pickle
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from model.config import ModelConfig, TrainConfig
from model.rmdm import RecursiveDenoiser, SeqSpec
from model.schedules import check_loss_weights, depth_at, loop_weights, lr_at, step_seed

BatchFn = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@functools.cache
def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX).

    Without it (e.g. AVX2-only CPUs) oneDNN/MKL emulate bf16 matmuls, 10-50x slower than float32.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def diffusion_loss(
    model: RecursiveDenoiser,
    x0: torch.Tensor,
    cond: torch.Tensor,
    gen: torch.Generator,
    n_loops: int,
    weights: list[float],
    eps: float = 1e-3,
) -> tuple[torch.Tensor, list[float]]:
    """MDLM ELBO with a linear schedule, per loop, combined with `weights`.

    x0: (B, N) clean tokens; cond: (B, N) bool, conditioning positions (never masked).
    Each sample draws t ~ U(eps, 1); each free token is masked with probability t; the loss
    is the cross-entropy on masked tokens weighted by 1/t, averaged over free positions.
    Returns the combined loss and the per-loop losses (floats) for the history.
    """
    B, N = x0.shape
    t = eps + (1 - eps) * torch.rand(B, 1, generator=gen).to(x0.device)  # (B, 1)
    u = torch.rand(B, N, generator=gen).to(x0.device)
    masked = (u < t) & ~cond  # (B, N)
    xt = torch.where(masked, torch.full_like(x0, model.spec.mask_id), x0)
    # loops whose weight is 0 need no head; 'final' then costs one head only
    need_all = any(w > 0 for w in weights[:-1])
    logits = model(xt, n_loops=n_loops, all_logits=need_all)
    if not need_all:
        logits = [None] * (n_loops - 1) + logits
    free = (~cond).sum(1).clamp(min=1).float()  # (B,)
    total = x0.new_zeros((), dtype=torch.float32)
    per_loop = []
    for w, lg in zip(weights, logits):
        if lg is None:
            per_loop.append(float("nan"))
            continue
        ce = F.cross_entropy(lg.float().reshape(B * N, -1), x0.reshape(-1), reduction="none").view(B, N)
        loss_l = ((ce * masked / t).sum(1) / free).mean()
        per_loop.append(float(loss_l.detach()))
        if w > 0:
            total = total + w * loss_l
    return total, per_loop


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)


class Trainer:
    def __init__(
        self,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        spec: SeqSpec,
        batch_fn: BatchFn,
        device: str | torch.device = "cpu",
    ):
        self.model_cfg, self.cfg, self.spec, self.batch_fn = model_cfg, train_cfg, spec, batch_fn
        check_loss_weights(train_cfg, model_cfg.L)
        self.device = torch.device(device)
        torch.manual_seed(step_seed(train_cfg.seed, 0xB0071))  # initial weights depend on the seed only
        self.model = RecursiveDenoiser(model_cfg, spec).to(self.device)
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2 and "emb" not in n]
        no_decay = [p for n, p in self.model.named_parameters() if not (p.dim() >= 2 and "emb" not in n)]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": train_cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=train_cfg.lr,
            betas=(0.9, 0.99),
            # one fused kernel over all parameters instead of ~10 elementwise passes per tensor: the
            # per-tensor loop was about a fifth of a CPU training step (benchmarks/RESULTS.md)
            fused=self.device.type in ("cpu", "cuda"),
        )
        self.state = TrainState()
        if train_cfg.precision == "bf16" and self.device.type == "cpu" and not cpu_bf16_native():
            warnings.warn("precision bf16 on a CPU without bf16 matrix units (no avx512_bf16/amx_bf16): "
                          "autocast emulates bf16 matmuls and trains many times slower than float32", stacklevel=2)

    # ---- one step --------------------------------------------------------------------------
    def train_step(self) -> dict:
        cfg, step = self.cfg, self.state.step
        gen = torch.Generator().manual_seed(step_seed(cfg.seed, step))
        x0, cond = self.batch_fn(step, gen)
        # dropout draws from the global RNG: seed it per step too, so a resumed run (any device) repeats it
        torch.manual_seed(step_seed(cfg.seed, step, 0xD0))
        x0, cond = x0.to(self.device), cond.to(self.device)
        n_loops = depth_at(step, cfg.steps, self.model_cfg.L, cfg)
        weights = loop_weights(n_loops, cfg)
        lr = lr_at(step, cfg)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.model.train()
        with autocast(self.device, cfg.precision):
            loss, per_loop = diffusion_loss(self.model, x0, cond, gen, n_loops, weights)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.state.step += 1
        value = float(loss.detach())
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {value} at step {step}")
        return {"step": step, "loss": value, "loop_losses": per_loop, "L_t": n_loops, "lr": lr}

    def train(
        self,
        on_log: Callable[[dict], None] | None = None,
        on_checkpoint: Callable[["Trainer"], None] | None = None,
        until: int | None = None,
    ) -> TrainState:
        """Train to step `until` (default: the configured number of steps)."""
        until = self.cfg.steps if until is None else min(until, self.cfg.steps)
        t0 = time.perf_counter() - self.state.seconds
        while self.state.step < until:
            row = self.train_step()
            self.state.seconds = time.perf_counter() - t0
            if row["step"] % self.cfg.log_every == 0 or self.state.step == self.cfg.steps:
                row["seconds"] = self.state.seconds
                self.state.history.append(row)
                if on_log:
                    on_log(row)
            if on_checkpoint and self.state.step % self.cfg.checkpoint_every == 0 and self.state.step < self.cfg.steps:
                on_checkpoint(self)
        return self.state

    # ---- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "step": self.state.step,
            "seconds": self.state.seconds,
            "history": self.state.history,
            "torch_rng": torch.get_rng_state(),
            "model_cfg": self.model_cfg.model_dump(),
            "train_cfg": self.cfg.model_dump(),
        }

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["opt"])
        self.state = TrainState(step=sd["step"], seconds=sd["seconds"], history=list(sd["history"]))
        torch.set_rng_state(sd["torch_rng"])

    def save(self, path: str) -> None:
        save_atomic(self.state_dict(), path)

    def load(self, path: str) -> None:
        self.load_state_dict(load_state(path, self.device))


class CheckpointError(ValueError):
    """A weights or checkpoint file that is refused (it would run code) or unreadable (damaged)."""


def load_state(src, map_location="cpu", name: str | None = None) -> dict:
    """A `state_dict()` file (a path or a file object), loaded with `weights_only=True`.

    A checkpoint holds only tensors, lists, dicts, numbers and strings. Anything else in the
    pickle (a `__reduce__` that calls a function: how a crafted file runs code on whoever
    loads it) is refused before it runs; so is a file that is not a checkpoint at all.
    """
    name = name or (src if isinstance(src, (str, os.PathLike)) else "checkpoint")
    try:
        sd = torch.load(src, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's own message goes on to suggest weights_only=False: keep only what it found
        lines = [ln.strip() for ln in str(e).splitlines()
                 if ln.strip() and not ln.startswith(("Weights only load failed", "Please file", "Check the doc"))]
        why = lines[0][:160] if lines else "not a torch checkpoint"
        raise CheckpointError(f"{name}: refused: holds objects other than tensors, numbers, strings, lists "
                              f"and dicts (a crafted or foreign file?): {why}") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{name}: not a readable checkpoint (truncated or damaged?): {first}") from None
    if not isinstance(sd, dict) or "model" not in sd:
        raise CheckpointError(f"{name}: not a checkpoint of this project (no 'model' entry)")
    return sd


def save_atomic(obj, path: str) -> None:
    """torch.save to a temp file beside `path`, then rename: a reader never sees half a file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)
