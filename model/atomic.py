"""Atomic file writes: a temp file beside the target, then a rename, so a reader never sees half a file;
and the versioned JSON caches written that way."""
from __future__ import annotations

import json
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


def read_versioned_json(path: str, version: int) -> dict:
    """The JSON object at `path` if its "version" is `version`; {} when absent, broken or of another
    version (a cache: measure again and rewrite it)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("version") == version else {}
