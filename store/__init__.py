"""The results store: one directory per study, Parquet tables with explicit schemas.

Layout of `<root>/<study>/`:
    FORMAT                                the store format version (store/format.py): written with the first file
    runs/<run_id>.parquet                 one row per run (its latest status)
    evals/<run_id>/<eval_key>.parquet     one row per metric of one evaluation point
    history/<run_id>.parquet              training curve
    samples/<run_id>/<eval_key>.parquet   one row per evaluated example (0..n_examples-1): `scores` (JSON of every
                                          metric of the point's evals rows, each row's value the mean of
                                          them), `score` (the primary metric), `passes` / `steps` (its cost);
                                          input / output / reference text for the first eval.n_samples_kept
                                          examples only (null beyond). A likelihood point (Text8) scores each
                                          sequence ({"nll", "bpc"}; perplexity = exp(nll) is derived, not
                                          stored); its unconditional generations are the point `<eval_key>-gen`
    checkpoints/<run_id>.pt               resumable mid-training state (and <run_id>.prev.pt, the one before),
                                          each naming its run inside, its SHA-256 in <name>.sha256 beside it
    weights/<run_id>.pt                   final weights (evaluate again without retraining)
    configs/<run_id>.json                 resolved config + provenance
    logs/<run_id>.log                     training log (kept after failures)
    logs/<run_id>.attempts                one line per start of the run's trial
    progress/<run_id>.json                heartbeat of a training run (step, pid, node, time)
    data/                                 task datasets, generated once per study
    grid.yaml                             the grid as last run
    grids/<sha>.yaml, grids/log.jsonl     every grid the study ran, by content hash, and when (store/provenance.py)
    quarantine/<path>.<UTC time>          damaged files set aside by a rerun (Store.quarantine), never deleted

Every file is written to a hidden temp name and renamed into place, so a reader (another
`study status`, a report) never sees half a file. Tables are read file by file (each file
read whole, then parsed), so a file replaced while a reader lists the directory is read
either as the old or as the new version, never as a mix. Roots may be local paths or any
pyarrow-supported URI: every read and write goes through `pyarrow.fs`, task data included
(cached in a local directory per node and mirrored to the store).
"""
from __future__ import annotations

from store.core import Store
from store.paths import (GCS_RETRY_S, NAME_RULE, QUARANTINE, SAFE, TEMP, TEMP_AGE_S, DiskFull, OutsideStore,
                         filesystem_from_uri, free_space, is_safe_name, safe_name)
from store.schemas import EVALS, HISTORY, RUNS, SAMPLES, SCHEMAS, check_row, row_dict, schema_name
from store.summary import Summary, list_studies

__all__ = ["Store", "Summary", "list_studies", "RUNS", "EVALS", "HISTORY", "SAMPLES", "SCHEMAS", "check_row",
           "row_dict", "schema_name", "SAFE", "NAME_RULE", "QUARANTINE", "TEMP", "TEMP_AGE_S", "GCS_RETRY_S",
           "DiskFull", "OutsideStore", "filesystem_from_uri", "free_space", "is_safe_name", "safe_name"]
