"""`study migrate`: bring a study's store to the current format version (store/format.py), losslessly
(docs/guide/store.md, "Format version and `study migrate`").

It holds the study's lease throughout (never beside a `study run` / `study tune` driver), writes every file
atomically (Store.write_bytes), says each change in one line, and stamps FORMAT last: a migration killed
half-way leaves a store still refused, and running it again finishes it (a second run changes nothing).
Each step below fills what an older store left null where the store holds what it is derived from (a value
that cannot be derived stays null, the one way the store says "unknown"), or renames what an older version
named otherwise: after it, the readers read the current format only.
"""
from __future__ import annotations

import functools
import re

import pyarrow as pa

from store import Store, digest, format as store_format
from store.schemas import EVALS


class MigrateError(ValueError):
    """The store cannot be migrated (no such study, or a newer format than this code's): one line, exit 2."""


class _Older(Store):
    """The store as migrate reads it (the one reader of older formats): a file's columns cast to today's, those
    added since null, and a point whose rows recorded no digest taken as written (older rows did not record it)."""

    @staticmethod
    def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
        return pa.Table.from_arrays([t[f.name].cast(f.type) if f.name in t.column_names else pa.nulls(len(t), f.type)
                                     for f in schema], schema=schema)

    def _edited(self, t: pa.Table, schema: pa.Schema) -> str | None:
        unrecorded = schema is EVALS and t["point_sha256"].null_count == len(t)
        return None if unrecorded else super()._edited(t, schema)


def migrate_study(results: str, study: str, echo=print) -> list[str]:
    """Migrate `study` under `results` to store_format.VERSION; returns the changes (one line each)."""
    from store.lease import acquire

    store = _Older(results, study, check_format=False)
    found = store_format.found(store)
    if found is None:
        raise MigrateError(f"no study {study} under {results}: nothing to migrate")
    store.refuse_links_out()  # OutsideStore: nothing is read or rewritten through a link out of the store
    if found == store_format.VERSION:
        return []
    if found > store_format.VERSION or found < 0:
        raise MigrateError(store_format.message(store, found).split(": run")[0]
                           + ": not a format this code can migrate from (a newer code's store?)")
    with acquire(store, "migrate", echo=echo):
        changes = (_runs_digests(store) + _evals(store) + _grid_record(store) + _task_data(store)
                   + _old_temps(store))
        store.write_bytes(store_format.path(store), store_format.stamp_bytes())
        changes.append(f"{store_format.path(store)}: format version {found} -> {store_format.VERSION}")
    return changes


def _runs_digests(store: Store) -> list[str]:
    """A done run's digests filled in where null; each row rewritten gets its own row_sha256."""
    changes = []
    for rid, rows in sorted(_table_files(store, "runs").items()):
        filled = []
        for row in rows:
            have = digest.run_digests(store, row["run_id"]) if row["status"] == "done" else {}
            for k, got in have.items():
                if row[k] is None and got is not None:
                    row[k] = got
                    filled.append(k)
            if row["row_sha256"] is None:
                filled.append("row_sha256")
        if filled:
            store.write_rows("runs", rows, rid)
            changes.append(f"{store.path('runs', rid)}: filled {', '.join(sorted(set(filled)))}")
    return changes


def _evals(store: Store) -> list[str]:
    """Each evals file brought to the current format, rewritten once: a likelihood point's `ppl` row (exp(nll),
    what the analysis derives from the nll row) dropped, and what an older store left null filled in."""
    from study.engine.rows import NLL_KEYS, clipped
    from tasks import TASKS, is_likelihood

    changes, task = [], functools.cache(lambda run_id: (store.run_row(run_id) or {}).get("task"))
    weights = functools.cache(lambda run_id: digest.weights_sha256(store, run_id))
    for name, rows in sorted(_table_files(store, "evals").items()):
        run_id, key = name.split("/")
        path, did = store.path("evals", run_id, key), []
        # forward_passes_mean, from the samples' per-example passes where every example has one (else it stays
        # null, unknown: a likelihood point, null by design, or no per-example cost)
        st = store.read_file("samples", run_id, key) if any(r["forward_passes_mean"] is None for r in rows) else None
        passes = [s["passes"] for s in st.to_pylist() if s["steps"] is not None] if st is not None else []
        if passes and None not in passes and len(passes) == st.num_rows == rows[0]["n_examples"]:
            for r in (r for r in rows if r["forward_passes_mean"] is None):
                r["forward_passes_mean"] = float(sum(passes) / len(passes))
            did.append(f"{path}: filled forward_passes_mean from {store.path('samples', run_id, key)}")
        if {"ppl", "nll"} <= {r["metric"] for r in rows}:
            rows = [r for r in rows if r["metric"] != "ppl"]
            did.append(f"{path}: dropped the derived ppl row (exp of nll)")
        if any(r["kind"] is None for r in rows):  # what its key and its run's task say (the one reader of a key)
            stem, likelihood = key[: -len(".parquet")], is_likelihood(task(run_id))
            kind = ("nll" if stem in NLL_KEYS.values() else "ext" if stem.startswith("ext-")
                    else "gen" if likelihood and stem.endswith("-gen") else "likelihood" if likelihood else "sample")
            declared = TASKS[task(run_id)][1] if task(run_id) in TASKS else None
            for r in rows:  # and each interval inside its metric's declared bounds, as rows are written today
                r["kind"] = r["kind"] or kind
                bounds = declared and declared.metric_of(r["metric"])
                r["ci_low"], r["ci_high"] = clipped(r["ci_low"], r["ci_high"], bounds)
            did.append(f"{path}: kind {kind}")
        # the digests: the point's rows' (Store.write_rows), and its run's final weights' where they are (else null)
        filled = [k for k in ("point_sha256", "weights_sha256")
                  if any(r[k] is None for r in rows) and (k == "point_sha256" or weights(run_id))]
        for r in rows:
            r["weights_sha256"] = r["weights_sha256"] or weights(run_id)
        if did or filled:
            store.write_rows("evals", rows, run_id, key)
            changes += did + ([f"{path}: filled {', '.join(filled)}"] if filled else [])
    return changes


def _task_data(store: Store) -> list[str]:
    """Each run's task data cached in an older format, adopted in today's (Task.upgrade_data)."""
    import json

    import pyarrow.fs as pafs

    from tasks import TASKS, make_task

    changes = []
    configs = store.fs.get_file_info(pafs.FileSelector(store.path("configs"), allow_not_found=True))
    with store.task_data() as d:
        for info in sorted((i for i in configs if i.base_name.endswith(".json")), key=lambda i: i.path):
            try:
                task = json.loads(store.read_bytes(info.path) or b"{}")["task"]
                changes += make_task(TASKS[task["name"]][0].model_validate(task)).upgrade_data(d)
            except (ValueError, KeyError, TypeError):
                continue  # a damaged config: `study verify` names it, `study run` rewrites it
    return changes


def _grid_record(store: Store) -> list[str]:
    """A study run before grids were recorded: its grid.yaml adopted as the first entry of grids/log.jsonl."""
    from store import provenance

    sha = provenance.adopt_grid_yaml(store)
    return [] if sha is None else [f"{store.path(provenance.GRIDS, provenance.LOG)}: adopted grid.yaml as grid {sha}"]


OLD_TEMP = re.compile(r".+\.tmp-\d+(\.npz)?|.+\.[0-9a-f]{8}\.part")


def _old_temps(store: Store) -> list[str]:
    """Left-over temp files under earlier versions' names (anywhere but quarantine/ and Tune's .ray/)."""
    changes = []
    for info in store.temp_files(names=OLD_TEMP):
        store.fs.delete_file(info.path)
        changes.append(f"{info.path}: removed (a temp file left by an interrupted write)")
    return changes


def _table_files(store: Store, table: str) -> dict[str, list[dict]]:
    """relative path -> rows of every readable file of `table` (unreadable ones are `study verify`'s to name)."""
    from store import index

    prefix = f"{store.dir}/{table}/"
    out = {}
    for info in index.list_files(store, table):
        t = store.read_file(table, *info.path[len(prefix):].split("/"))
        if t is not None:
            out[info.path[len(prefix):]] = t.to_pylist()
    return out
