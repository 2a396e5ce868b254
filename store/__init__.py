"""The results store: one directory per study, Parquet tables with explicit schemas (the layout of
`<root>/<study>/`: docs/DESIGN.md, "The results store").

Every file is written to a hidden temp name and renamed into place, so a reader (another
`study status`, a report) never sees half a file. Tables are read file by file (each file
read whole, then parsed), so a file replaced while a reader lists the directory is read
either as the old or as the new version, never as a mix. Roots may be local paths or any
pyarrow-supported URI: every read and write goes through `pyarrow.fs`, task data included
(cached in a local directory per node and mirrored to the store).
"""
from __future__ import annotations

from store.core import Store
from store.paths import (NAME_RULE, QUARANTINE, TEMP, TEMP_AGE_S, DiskFull, OutsideStore, free_space,
                         is_safe_name)
from store.schemas import EVALS, HISTORY, RUNS, SAMPLES, SCHEMAS
from store.summary import list_studies

__all__ = ["Store", "list_studies", "RUNS", "EVALS", "HISTORY", "SAMPLES", "SCHEMAS", "NAME_RULE",
           "QUARANTINE", "TEMP", "TEMP_AGE_S", "DiskFull", "OutsideStore", "free_space", "is_safe_name"]
