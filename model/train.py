"""Masked-diffusion training of an R-MDM, resumable to the step.

Data comes from a `batch_fn(step, generator) -> (x0, cond)` given by the caller; the
generator is seeded from (seed, step), so the batch and the noise of every step are a pure
function of the step, and a run resumed at step s sees exactly what it would have seen.
"""
from __future__ import annotations

import contextlib
import copy
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from model.checkpoint_meta import CheckpointError, checked_load  # noqa: F401 (CheckpointError: re-exported)
from model.config import ModelConfig, TrainConfig
from model.costs import (depth_at, derive_seed, loop_weights, loss_weights_problem, lr_at,
                         train_flops_per_step, train_flops_total)
from model.precision import autocast, choose, cpu_bf16_native
from model.rmdm import RecursiveDenoiser, SeqSpec

BatchFn = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def diffusion_loss(
    model: RecursiveDenoiser,
    x0: torch.Tensor,
    cond: torch.Tensor,
    gen: torch.Generator,
    n_loops: int,
    weights: list[float],
    eps: float = 1e-3,
    sync: bool = True,
) -> tuple[torch.Tensor, list]:
    """MDLM ELBO with a linear schedule, per loop, combined with `weights`.

    x0: (B, N) clean tokens; cond: (B, N) bool, conditioning positions (never masked).
    Each sample draws t ~ U(eps, 1); each free token is masked with probability t; the loss
    is the cross-entropy on masked tokens weighted by 1/t, averaged over free positions.
    Returns the combined loss and the per-loop losses for the history: floats, or with
    `sync=False` detached 0-d tensors (no host sync: a GPU step then never waits for its result).
    """
    B, N = x0.shape
    # the noise is drawn on the CPU (the step's generator: resumable, device-independent), copied async
    t, u = torch.rand(B, 1, generator=gen), torch.rand(B, N, generator=gen)
    if x0.is_cuda:
        t, u = t.pin_memory(), u.pin_memory()
    t = eps + (1 - eps) * t.to(x0.device, non_blocking=True)  # (B, 1)
    u = u.to(x0.device, non_blocking=True)  # (B, N)
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
            per_loop.append(float("nan") if sync else total.new_full((), float("nan")))
            continue
        ce = F.cross_entropy(lg.float().reshape(B * N, -1), x0.reshape(-1), reduction="none").view(B, N)
        loss_l = ((ce * masked / t).sum(1) / free).mean()
        per_loop.append(float(loss_l.detach()) if sync else loss_l.detach())
        if w > 0:
            total = total + w * loss_l
    return total, per_loop


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)
    last: dict | None = None  # the latest step's row (synced), for a checkpoint callback; not saved


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
        self._untimed = 0.0  # seconds spent in `untimed` blocks since `train` started its clock
        if problem := loss_weights_problem(train_cfg, model_cfg.L):
            raise ValueError(f"loss_weights {problem}")
        self.device = torch.device(device)
        torch.manual_seed(derive_seed(train_cfg.seed, 0xB0071))  # initial weights depend on the seed only
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
        if self.device.type == "cuda":
            # float32 matmuls on tensor cores (TF32) where a run pins precision float32
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if train_cfg.precision == "bf16" and self.device.type == "cpu" and not cpu_bf16_native():
            warnings.warn("precision bf16 on a CPU without bf16 matrix units (no avx512_bf16/amx_bf16): "
                          "autocast emulates bf16 matmuls and trains many times slower than float32", stacklevel=2)
        # `auto` attention / precision resolved once, here: {"attention", "precision", "how", "times"}
        self.paths = choose(self.device, model_cfg.attention, train_cfg.precision, self._shape(),
                            self._measure, train_flops_total(model_cfg, train_cfg, spec.seq_len, spec.vocab_size))
        self.attention, self.precision = self.paths["attention"], self.paths["precision"]
        self.model.set_attention(self.attention)
        self.__dict__.pop("_scratch", None)  # the measurement's model copy and optimizer
        self._bad_step = torch.full((), -1, dtype=torch.long, device=self.device)  # first non-finite loss
        self._bad_loss = torch.zeros((), device=self.device)

    # ---- the fastest path here -------------------------------------------------------------
    def _measure_batch(self) -> int:
        """The batch a path measurement runs at: the run's, cut so one step is ~25 GFLOP (0.15-0.25 s
        on an idle 2-core CPU; the ~10 steps of a measurement then take a few seconds), never under 32
        sequences, where per-step costs (bf16 weight casts, the optimizer) would weigh more than in the run."""
        full = train_flops_per_step(self.model_cfg, self.cfg, self.spec.seq_len, self.spec.vocab_size)
        B = self.cfg.batch_size
        return max(min(B, 32), min(B, int(B * 25e9 / max(full, 1))))

    def _shape(self) -> dict:
        m, c = self.model_cfg, self.cfg
        return {"d_model": m.d_model, "n_heads": m.n_heads, "mlp_ratio": m.mlp_ratio, "K": m.K, "L": m.L,
                "checkpoint_loops": m.checkpoint_loops, "seq_len": self.spec.seq_len, "vocab": self.spec.vocab_size,
                "batch": c.batch_size, "measured_batch": self._measure_batch(), "loss": c.loss}

    def _measure(self, attention: str, precision: str) -> float:
        """Seconds of one real training step (loss, backward, clipping, AdamW) on a scratch copy of
        the model, on random tokens of the run's shape: the run's weights and RNG are untouched."""
        if not hasattr(self, "_scratch"):
            B, N, V = self._measure_batch(), self.spec.seq_len, self.spec.vocab_size
            g = torch.Generator().manual_seed(0)
            model = copy.deepcopy(self.model)
            self._scratch = (model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=self.device.type in ("cpu", "cuda")),
                             torch.randint(0, V, (B, N), generator=g).to(self.device),
                             (torch.rand(B, N, generator=g) < 0.3).to(self.device))
        model, opt, x0, cond = self._scratch
        model.set_attention(attention)
        model.train()
        n_loops = self.model_cfg.L
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            t = time.perf_counter()
            with autocast(self.device, precision):
                loss, _ = diffusion_loss(model, x0, cond, torch.Generator().manual_seed(1), n_loops,
                                         loop_weights(n_loops, self.cfg), sync=False)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.grad_clip)
            opt.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return time.perf_counter() - t

    # ---- one step --------------------------------------------------------------------------
    def train_step(self, sync: bool = True) -> dict:
        """One optimisation step. With `sync=False` the row holds device tensors (loss, loop losses)
        and nothing waits for the device: `sync_row` later turns them into floats and raises on
        the first non-finite loss since the last sync, naming its step."""
        cfg, step = self.cfg, self.state.step
        gen = torch.Generator().manual_seed(derive_seed(cfg.seed, step))
        x0, cond = self.batch_fn(step, gen)
        # dropout draws from the global RNG: seed it per step too, so a resumed run (any device) repeats it
        torch.manual_seed(derive_seed(cfg.seed, step, 0xD0))
        if self.device.type == "cuda":  # pinned host memory: the copy overlaps the previous step's kernels
            x0, cond = x0.pin_memory(), cond.pin_memory()
        x0, cond = x0.to(self.device, non_blocking=True), cond.to(self.device, non_blocking=True)
        n_loops = depth_at(step, cfg.steps, self.model_cfg.L, cfg)
        weights = loop_weights(n_loops, cfg)
        lr = lr_at(step, cfg)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.model.train()
        with autocast(self.device, self.precision):
            loss, per_loop = diffusion_loss(self.model, x0, cond, gen, n_loops, weights, sync=False)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.state.step += 1
        loss = loss.detach()
        # remember the first non-finite loss on the device; no host sync here
        first = ~torch.isfinite(loss) & (self._bad_step < 0)
        self._bad_step = torch.where(first, torch.full_like(self._bad_step, step), self._bad_step)
        self._bad_loss = torch.where(first, loss, self._bad_loss)
        row = {"step": step, "loss": loss, "loop_losses": per_loop, "L_t": n_loops, "lr": lr}
        return self.sync_row(row) if sync else row

    def sync_row(self, row: dict) -> dict:
        """Floats for a row of `train_step(sync=False)`; raises FloatingPointError at the first
        non-finite loss since training started, naming that step."""
        bad = int(self._bad_step)
        if bad >= 0:
            raise FloatingPointError(f"non-finite loss {float(self._bad_loss)} at step {bad}")
        row["loss"] = float(row["loss"])
        row["loop_losses"] = [float(x) for x in row["loop_losses"]]
        return row

    def train(
        self,
        on_log: Callable[[dict], None] | None = None,
        on_checkpoint: Callable[["Trainer"], None] | None = None,
        until: int | None = None,
    ) -> TrainState:
        """Train to step `until` (default: the configured number of steps)."""
        until = self.cfg.steps if until is None else min(until, self.cfg.steps)
        t0 = time.perf_counter() - self.state.seconds
        self._untimed = 0.0
        # a CPU syncs for free, so it checks every step; a GPU only at logs, checkpoints and the end
        every = self.device.type != "cuda"
        while self.state.step < until:
            row = self.train_step(sync=False)
            self.state.seconds = time.perf_counter() - t0 - self._untimed
            log = row["step"] % self.cfg.log_every == 0 or self.state.step == self.cfg.steps
            ckpt = on_checkpoint and self.state.step % self.cfg.checkpoint_every == 0 and self.state.step < self.cfg.steps
            if every or log or ckpt or self.state.step == until:
                row = self.sync_row(row)
            if log:
                row["seconds"] = self.state.seconds
                self.state.history.append(row)
                if on_log:
                    on_log(row)
            if ckpt:
                self.state.last = row
                on_checkpoint(self)
        return self.state

    @contextlib.contextmanager
    def untimed(self):
        """A callback's block whose time is not training time (`state.seconds`, a run's train_seconds):
        monitoring, such as scoring a checkpoint on validation examples. Checkpoint writes stay timed.
        Yields a dict whose "seconds" holds the block's duration once it ends."""
        spent = {"seconds": 0.0}
        t = time.perf_counter()
        try:
            yield spent
        finally:
            spent["seconds"] = time.perf_counter() - t
            self._untimed += spent["seconds"]

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


def load_state(src, map_location="cpu", name: str | None = None) -> dict:
    """A `state_dict()` file (a path or a file object), loaded with `weights_only=True`.

    A checkpoint holds only tensors, lists, dicts, numbers and strings. Anything else in the
    pickle (a `__reduce__` that calls a function: how a crafted file runs code on whoever
    loads it) is refused before it runs; so is a file that is not a checkpoint at all.
    """
    name = name or (src if isinstance(src, (str, os.PathLike)) else "checkpoint")
    return checked_load(name, lambda: torch.load(src, map_location=map_location, weights_only=True),
                        (RuntimeError, EOFError, OSError, ValueError))


# ---- the NLL bound of likelihood-scored tasks ------------------------------------------------------
# The masked-diffusion NLL bound (negative ELBO) of a sequence, for likelihood-scored tasks.
#
# With the linear schedule (a token is masked with probability t), the continuous-time MDLM bound is
#
#     -log p(x0) <= integral_0^1 (1/t) E_{x_t}[ sum over masked i of -log p(x0_i | x_t) ] dt,
#
# the training loss of `diffusion_loss` before its division by the sequence length.
# It is estimated at a fixed set of t values (the caller's: stratified and seeded, so two models
# are compared on the same noise) with one seeded mask per t, and averaged over them.


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
