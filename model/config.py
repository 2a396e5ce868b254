"""Typed, strict configuration of the R-MDM and of its training.

The model is task-agnostic: vocabulary size, sequence length and the sizes of the
position-id channels arrive from the task through `study`, never by importing `tasks`.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(Strict):
    """Architecture of a (K x L) recursive masked diffusion model."""

    K: int = Field(1, ge=1, description="layers in the shared block")
    L: int = Field(1, ge=1, description="loops of the block per denoising step (max training depth)")
    d_model: int = Field(128, ge=8)
    n_heads: int = Field(4, ge=1)
    mlp_ratio: float = Field(4.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    step_emb: Literal["mlp", "sinusoidal", "none"] = "mlp"
    reinject_input: bool = False  # h = f(h + x_emb + v(l)) instead of h = f(h + v(l))
    checkpoint_loops: bool = False  # activation checkpointing per loop: memory of (K x 1)
    # attention kernel (same function): fused SDPA, written-out math, or the faster here (model/precision.py)
    attention: Literal["sdpa", "math", "auto"] = "auto"

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelConfig":
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        return self


class TrainConfig(Strict):
    """Masked-diffusion training of one run."""

    steps: int = Field(1000, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup: int = Field(100, ge=0, description="linear warm-up steps, then cosine decay")
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    grad_clip: float = Field(1.0, gt=0)
    loss: Literal["all", "final", "weighted", "truncated"] = "all"
    loss_weights: list[float] | None = Field(None, description="weighted loss: one weight per loop (len L)")
    truncate_k: int = Field(1, ge=1, description="truncated loss: last k loops")
    schedule: Literal["fixed", "stochastic", "curriculum", "reverse"] = "fixed"
    min_depth: int = Field(1, ge=1, description="smallest L_t of the stochastic/curriculum/reverse schedules")
    # bf16 = autocast; auto = the fastest on this machine, never bf16 on a CPU without bf16 units (model/precision.py)
    precision: Literal["float32", "bf16", "auto"] = "auto"
    checkpoint_every: int = Field(200, ge=1, description="steps between resumable checkpoints")
    log_every: int = Field(25, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _loss_options(self) -> "TrainConfig":
        w = self.loss_weights
        if w is not None:
            if self.loss != "weighted":
                raise ValueError(f"loss_weights is only used with loss 'weighted' (loss is {self.loss!r})")
            if not w or any(x < 0 for x in w):
                raise ValueError(f"loss_weights must be a non-empty list of weights >= 0 (got {w})")
            if w[-1] <= 0:
                # a shallower step (stochastic/curriculum/reverse) uses the last L_t weights: they must not sum to 0
                raise ValueError(f"loss_weights: the last loop's weight must be > 0 (got {w})")
        return self
