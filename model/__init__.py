"""R-MDM: a shared K-layer transformer block looped L times inside every denoising step.

The names below load on first use (PEP 562), so `from model.config import ModelConfig` reads a config
without importing torch (a read command's few hundred milliseconds); `from model import Trainer` is as before."""
from __future__ import annotations

import importlib

_WHERE = {"ModelConfig": "model.config", "TrainConfig": "model.config", "RecursiveDenoiser": "model.rmdm",
          "SeqSpec": "model.rmdm", "flops_per_forward": "model.costs", "sample": "model.rmdm",
          "Trainer": "model.train"}

__all__ = ["ModelConfig", "TrainConfig", "RecursiveDenoiser", "SeqSpec", "flops_per_forward", "sample", "Trainer"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
