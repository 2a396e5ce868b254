"""The store's tables: one explicit Arrow schema each, and the checks a row must pass to be written."""
from __future__ import annotations

import dataclasses

import pyarrow as pa

RUNS = pa.schema([
    ("run_id", pa.string()), ("study", pa.string()), ("group", pa.string()), ("task", pa.string()),
    ("task_params", pa.string()), ("K", pa.int32()), ("L_t", pa.int32()), ("schedule", pa.string()),
    ("loss", pa.string()), ("d_model", pa.int32()), ("heads", pa.int32()), ("lr", pa.float64()),
    ("batch", pa.int32()), ("steps", pa.int32()), ("seed", pa.int64()), ("n_params", pa.int64()),
    ("n_params_non_embedding", pa.int64()), ("flops_per_forward", pa.int64()), ("train_seconds", pa.float64()),
    ("final_loss", pa.float64()), ("status", pa.string()), ("error", pa.string()), ("attempts", pa.int32()),
    ("node", pa.string()), ("device", pa.string()), ("code_version", pa.string()), ("config", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    # where it ran: Ray's node id and IP (hostnames repeat across containers; node ids do not)
    ("node_id", pa.string()), ("node_ip", pa.string()),
    # the attention kernel and precision the run trained with (`auto` resolved on its machine)
    ("attention", pa.string()), ("precision", pa.string()),
    # the GPU ids Ray assigned to the trial ("0", "0,1"; null without a GPU): shows how trials were packed
    ("gpu_ids", pa.string()),
    # content hash of the grid whose `study run` / `study tune` wrote this row (grids/<sha>.yaml; store/provenance.py)
    ("grid", pa.string()),
    # what the row recorded of its files when written (store/digest.py): SHA-256 of a done run's weights file
    # and of its history's rows, and of the row's own other fields (set by Store.write_rows); null before
    ("weights_sha256", pa.string()), ("history_sha256", pa.string()), ("row_sha256", pa.string()),
])
EVALS = pa.schema([
    ("run_id", pa.string()), ("eval_key", pa.string()), ("T", pa.int32()), ("L_s", pa.int32()),
    ("sampler", pa.string()), ("split", pa.string()), ("n_examples", pa.int32()), ("metric", pa.string()),
    ("value", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("forward_passes", pa.int64()),
    ("eval_flops", pa.int64()), ("eval_seconds", pa.float64()), ("created_at", pa.timestamp("us", tz="UTC")),
    # forward passes per example, the mean over examples (forward_passes is the most any example ran):
    # what adaptive sampling depth actually spends; null where the samples hold no per-example cost (unknown)
    ("forward_passes_mean", pa.float64()),
    # what the point is (study/engine/kinds: sample, likelihood, gen, nll, ext), whose rules verify it
    ("kind", pa.string()),
    # what the rows recorded when written (store/digest.py): SHA-256 of the final weights they were scored from,
    # and of the point's rows (every row of the file, this column left out; set by Store.write_rows)
    ("weights_sha256", pa.string()), ("point_sha256", pa.string()),
])
HISTORY = pa.schema([
    ("run_id", pa.string()), ("step", pa.int64()), ("loss", pa.float64()), ("loop_losses", pa.list_(pa.float64())),
    ("L_t", pa.int32()), ("lr", pa.float64()), ("seconds", pa.float64()),
    ("attempt", pa.int32()),  # which start of the trial computed this step (> 1: resumed after a crash)
    # eval.at_checkpoints: the primary metric on validation examples at this step, JSON {"val_vpr_T4": 0.5, ...}
    ("val", pa.string()),
])
SAMPLES = pa.schema([
    ("run_id", pa.string()), ("eval_key", pa.string()), ("T", pa.int32()), ("L_s", pa.int32()),
    ("example", pa.int32()), ("input", pa.string()), ("output", pa.string()), ("reference", pa.string()),
    ("score", pa.float64()), ("scores", pa.string()),
    # what the example cost: block passes it ran, and denoising steps (null for a likelihood score);
    # `study verify` derives the evals rows' forward_passes / eval_flops from them
    ("passes", pa.int64()), ("steps", pa.int32()),
])
SCHEMAS = {"runs": RUNS, "evals": EVALS, "history": HISTORY, "samples": SAMPLES}


def row_dict(row) -> dict:
    """A dataclass row (slots or not) as a dict of its fields."""
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}


def check_row(table: str, row: dict) -> dict:
    """`row` when its keys are exactly the columns of `table`; else a ValueError naming the table, the
    unknown or missing columns and the allowed ones."""
    names = SCHEMAS[table].names
    if len(row) != len(names) or not all(k in row for k in names):
        unknown = [k for k in row if k not in names]
        missing = [k for k in names if k not in row]
        raise ValueError(f"{table} row: " + "; ".join(
            ([f"unknown column(s) {', '.join(map(repr, unknown))}"] if unknown else [])
            + ([f"missing column(s) {', '.join(map(repr, missing))} (pass None for a null)"] if missing else []))
            + f"; the columns of {table} are {', '.join(names)}")
    return row


def schema_name(schema: pa.Schema) -> str:
    return next((k for k, v in SCHEMAS.items() if v is schema), "Parquet")

