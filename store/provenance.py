"""Provenance: every grid a study has run, by content hash, with when it ran.

`study run` and `study tune` record their grid before dispatching anything:
    grids/<sha>.yaml    the grid as run (the YAML `grid.yaml` holds too), named by the first 12 hex
                        digits of the SHA-256 of that text; written once, never changed
    grids/log.jsonl     one JSON line per invocation, oldest first: {"grid": sha, "time": ISO 8601 UTC,
                        "command": "run" | "tune" | "adopted", "path": the grid file given}; appended by
                        rewriting the whole (small) file to a temp name and renaming it into place
Each run's config (configs/<run_id>.json) and runs row name in `grid` the grid that last dispatched
it. `study migrate` adopts the grid.yaml of a study run before this record as its first entry ("adopted",
the time being grid.yaml's modification time). `study verify` owes every eval point of every grid in
the log; `study report` lists them all.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json

from atomicio import loads_json

GRIDS = "grids"
LOG = "log.jsonl"


def grid_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def record_grid(store, text: str, command: str, path: str | None = None) -> str:
    """Keep `text` (the grid as run) as grids/<sha>.yaml and log this invocation; returns the sha."""
    old = store.read_bytes(store.path(GRIDS, LOG)) or b""
    return _keep(store, text.encode(), {"time": _now(), "command": command, "path": path}, old)


def adopt_grid_yaml(store) -> str | None:
    """A study run before grids were recorded (no grids/log.jsonl): its last grid.yaml becomes the log's first
    entry ("adopted", at grid.yaml's modification time). `study migrate`'s; returns the sha (None: nothing to
    adopt)."""
    legacy = store.read_bytes(store.path("grid.yaml"))
    if legacy is None or store.exists(store.path(GRIDS, LOG)):
        return None
    info = store.fs.get_file_info(store.path("grid.yaml"))
    when = info.mtime.astimezone(dt.timezone.utc).isoformat(timespec="seconds") if info.mtime else None
    return _keep(store, legacy, {"time": when, "command": "adopted", "path": "grid.yaml"})


def _keep(store, data: bytes, entry: dict, log: bytes = b"") -> str:
    """Keep `data` (a grid's text) as grids/<sha>.yaml (once); write the log: `log` and `entry` appended."""
    sha = grid_sha(data.decode(errors="replace"))
    if not store.exists(store.path(GRIDS, f"{sha}.yaml")):
        store.write_bytes(store.path(GRIDS, f"{sha}.yaml"), data)
    line = json.dumps({"grid": sha, **entry}, sort_keys=True) + "\n"
    store.write_bytes(store.path(GRIDS, LOG), log + line.encode())
    return sha


def read_log(store) -> tuple[list[dict], list[str]]:
    """(log entries oldest first, problems: lines that do not parse). No log: ([], [])."""
    raw = store.read_bytes(store.path(GRIDS, LOG))
    entries, bad = [], []
    for i, line in enumerate((raw or b"").decode(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            e = loads_json(line)
            if not isinstance(e, dict) or not isinstance(e.get("grid"), str):
                raise ValueError("no grid hash")
            entries.append(e)
        except ValueError as exc:
            bad.append(f"{store.path(GRIDS, LOG)} line {i}: not a grid log entry ({exc})")
    return entries, bad


def grids(store) -> list[dict]:
    """Every grid the study ran, oldest first: {grid, text (None if its file is gone), runs: [(time,
    command, path)...]} (one entry per distinct grid, in the order it first ran)."""
    entries, _ = read_log(store)
    out: dict[str, dict] = {}
    for e in entries:
        sha = e["grid"]
        if sha not in out:
            raw = store.read_bytes(store.path(GRIDS, f"{sha}.yaml")) if _safe(sha) else None
            out[sha] = {"grid": sha, "text": raw.decode(errors="replace") if raw is not None else None, "runs": []}
        out[sha]["runs"].append((e.get("time"), e.get("command"), e.get("path")))
    return list(out.values())


def _safe(sha: str) -> bool:
    return len(sha) == 12 and all(c in "0123456789abcdef" for c in sha)
