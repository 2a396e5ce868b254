"""Atomic file writes: a temp file beside the target, then a rename, so a reader never sees half a file."""
from __future__ import annotations

import os

import torch


def save_atomic(obj, path: str) -> None:
    """torch.save to a temp file beside `path`, then rename."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_text_atomic(text: str, path: str) -> None:
    """Write `text` to a temp file beside `path`, then rename."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
