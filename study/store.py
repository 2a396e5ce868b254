"""The results store: one directory per study, Parquet tables with explicit schemas.

Layout of `<root>/<study>/`:
    runs/<run_id>.parquet                 one row per run (its latest status)
    evals/<run_id>/<eval_key>.parquet     one row per metric of one evaluation point
    history/<run_id>.parquet              training curve
    samples/<run_id>/<eval_key>.parquet   what the model produced, per example
    checkpoints/<run_id>.pt               resumable mid-training state
    weights/<run_id>.pt                   final weights (evaluate again without retraining)
    configs/<run_id>.json                 resolved config + provenance
    logs/<run_id>.log                     training log
    data/                                 task datasets, generated once per study
    grid.yaml                             the grid as last run

Every file is written to a hidden temp name and renamed into place, so a reader (another
`study status`, a report) never sees half a file; pyarrow.dataset skips names starting
with '.' or '_'. Roots may be local paths or any pyarrow-supported URI.
"""
from __future__ import annotations

import io
import json
import os
import re
import uuid

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

RUNS = pa.schema([
    ("run_id", pa.string()), ("study", pa.string()), ("group", pa.string()), ("task", pa.string()),
    ("task_params", pa.string()), ("K", pa.int32()), ("L_t", pa.int32()), ("schedule", pa.string()),
    ("loss", pa.string()), ("d_model", pa.int32()), ("heads", pa.int32()), ("lr", pa.float64()),
    ("batch", pa.int32()), ("steps", pa.int32()), ("seed", pa.int64()), ("n_params", pa.int64()),
    ("n_params_non_embedding", pa.int64()), ("flops_per_forward", pa.int64()), ("train_seconds", pa.float64()),
    ("final_loss", pa.float64()), ("status", pa.string()), ("error", pa.string()), ("attempts", pa.int32()),
    ("node", pa.string()), ("device", pa.string()), ("code_version", pa.string()), ("config", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
])
EVALS = pa.schema([
    ("run_id", pa.string()), ("eval_key", pa.string()), ("T", pa.int32()), ("L_s", pa.int32()),
    ("sampler", pa.string()), ("split", pa.string()), ("n_examples", pa.int32()), ("metric", pa.string()),
    ("value", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("forward_passes", pa.int64()),
    ("eval_flops", pa.int64()), ("eval_seconds", pa.float64()), ("created_at", pa.timestamp("us", tz="UTC")),
])
HISTORY = pa.schema([
    ("run_id", pa.string()), ("step", pa.int64()), ("loss", pa.float64()), ("loop_losses", pa.list_(pa.float64())),
    ("L_t", pa.int32()), ("lr", pa.float64()), ("seconds", pa.float64()),
])
SAMPLES = pa.schema([
    ("run_id", pa.string()), ("eval_key", pa.string()), ("T", pa.int32()), ("L_s", pa.int32()),
    ("example", pa.int32()), ("input", pa.string()), ("output", pa.string()), ("reference", pa.string()),
    ("score", pa.float64()), ("scores", pa.string()),
])
SCHEMAS = {"runs": RUNS, "evals": EVALS, "history": HISTORY, "samples": SAMPLES}
SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


def safe_name(name: str, what: str = "name") -> str:
    """A single path component that cannot escape the store ('..', '/', absolute paths)."""
    if not isinstance(name, str) or not SAFE.match(name) or ".." in name:
        raise ValueError(f"unsafe {what} {name!r}: use letters, digits, '_', '-', '.' (no '..', no '/')")
    return name


class Store:
    """One study's directory in a results root (local path or URI)."""

    def __init__(self, root: str, study: str):
        self.root = root
        self.study = safe_name(study, "study name")
        if "://" in root:
            self.fs, base = pafs.FileSystem.from_uri(root)
        else:
            self.fs, base = pafs.LocalFileSystem(), os.path.abspath(root)
        self.base = base.rstrip("/")
        self.dir = f"{self.base}/{self.study}"
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        return "/".join([self.dir, *[safe_name(p, "path part") for p in parts]])

    # ---- raw files -------------------------------------------------------------------------
    def write_bytes(self, path: str, data: bytes) -> None:
        parent, name = path.rsplit("/", 1)
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, path)  # atomic rename on local and POSIX-like filesystems

    def read_bytes(self, path: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read()
        except (FileNotFoundError, OSError):
            return None

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def delete(self, path: str) -> None:
        if self.exists(path):
            self.fs.delete_file(path)

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode())

    def append_log(self, run_id: str, line: str) -> None:
        """Logs are appended in place on local disks (they are not tables)."""
        path = self.path("logs", f"{run_id}.log")
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(line.rstrip("\n") + "\n")
        else:
            old = self.read_bytes(path) or b""
            self.write_bytes(path, old + line.rstrip("\n").encode() + b"\n")

    # ---- tables ----------------------------------------------------------------------------
    def write_rows(self, table: str, rows: list[dict], *parts: str) -> None:
        schema = SCHEMAS[table]
        t = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
        buf = io.BytesIO()
        pq.write_table(t, buf)
        self.write_bytes(self.path(table, *parts), buf.getvalue())

    def read(self, table: str, filter_run: str | None = None) -> pd.DataFrame:
        schema = SCHEMAS[table]
        d = f"{self.dir}/{table}"
        if self.fs.get_file_info(d).type != pafs.FileType.Directory:
            return schema.empty_table().to_pandas()
        dataset = ds.dataset(d, schema=schema, format="parquet", filesystem=self.fs)
        flt = ds.field("run_id") == filter_run if filter_run else None
        return dataset.to_table(filter=flt).to_pandas()

    # ---- run-level helpers -----------------------------------------------------------------
    def run_row(self, run_id: str) -> dict | None:
        data = self.read_bytes(self.path("runs", f"{run_id}.parquet"))
        if data is None:
            return None
        rows = pq.read_table(pa.BufferReader(data), schema=RUNS).to_pylist()
        return rows[0] if rows else None

    def eval_keys(self, run_id: str) -> set[str]:
        d = f"{self.dir}/evals/{safe_name(run_id)}"
        sel = pafs.FileSelector(d, allow_not_found=True)
        return {i.base_name[: -len(".parquet")] for i in self.fs.get_file_info(sel)
                if i.base_name.endswith(".parquet") and not i.base_name.startswith(".")}

    def checkpoint_path(self, run_id: str) -> str:
        return self.path("checkpoints", f"{run_id}.pt")

    def weights_path(self, run_id: str) -> str:
        return self.path("weights", f"{run_id}.pt")

    def write_config(self, run_id: str, config: dict) -> None:
        self.write_text(self.path("configs", f"{run_id}.json"), json.dumps(config, indent=2, sort_keys=True, default=str))

    def data_dir(self) -> str | None:
        """Local cache directory for task data (None on remote stores: generated per trial)."""
        if not self.local:
            return None
        d = self.path("data")
        os.makedirs(d, exist_ok=True)
        return d


def list_studies(root: str) -> list[tuple[str, float]]:
    """(study, last modification time) of every study under a local root, newest last."""
    if "://" in root:
        fs, base = pafs.FileSystem.from_uri(root)
    else:
        fs, base = pafs.LocalFileSystem(), os.path.abspath(root)
    out = []
    for info in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and SAFE.match(info.base_name):
            runs = fs.get_file_info(pafs.FileSelector(f"{info.path}/runs", allow_not_found=True))
            if runs:
                out.append((info.base_name, max(r.mtime.timestamp() for r in runs if r.mtime)))
    return sorted(out, key=lambda x: x[1])
