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

import re

from store import Store, digest, format as store_format


class MigrateError(ValueError):
    """The store cannot be migrated (no such study, or a newer format than this code's): one line, exit 2."""


def migrate_study(results: str, study: str, echo=print) -> list[str]:
    """Migrate `study` under `results` to store_format.VERSION; returns the changes (one line each)."""
    from store.lease import acquire

    store = Store(results, study, check_format=False)
    found = store_format.found(store)
    if found is None:
        raise MigrateError(f"no study {study} under {results}: nothing to migrate")
    store.refuse_links_out()  # OutsideStore: nothing is read or rewritten through a link out of the store
    if found == store_format.VERSION:
        return []
    if found > store_format.VERSION or found < 0:
        raise MigrateError(store_format.message(store, found).split(": run")[0]
                           + ": not a format this code can migrate from (a newer code's store?)")
    lease = acquire(store, "migrate", echo=echo)
    try:
        changes = (_runs_digests(store) + _passes_mean(store) + _drop_ppl(store) + _kinds(store)
                   + _grid_record(store) + _task_data(store) + _old_temps(store))
        store.write_bytes(store_format.path(store), store_format.stamp_bytes())
        changes.append(f"{store_format.path(store)}: format version {found} -> {store_format.VERSION}")
    finally:
        lease.release()
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


def _passes_mean(store: Store) -> list[str]:
    """forward_passes_mean of evals rows, from the samples' per-example passes where every example has one."""
    changes = []
    for name, rows in sorted(_table_files(store, "evals").items()):
        if all(r["forward_passes_mean"] is not None for r in rows):
            continue
        run_id, key = name.split("/")
        st = store.read_file("samples", run_id, key)
        srows = st.to_pylist() if st is not None else []
        passes = [s["passes"] for s in srows]
        if not passes or any(s["passes"] is None or s["steps"] is None for s in srows) \
                or len(passes) != rows[0]["n_examples"]:
            continue  # a likelihood point (null by design), or no per-example cost: stays null (unknown)
        mean = sum(passes) / len(passes)
        for r in rows:
            if r["forward_passes_mean"] is None:
                r["forward_passes_mean"] = float(mean)
        store.write_rows("evals", rows, run_id, key)
        changes.append(f"{store.path('evals', run_id, key)}: filled forward_passes_mean from {store.path('samples', run_id, key)}")
    return changes


def _drop_ppl(store: Store) -> list[str]:
    """A likelihood point's `ppl` row (exp(nll), what the analysis derives from the nll row) dropped."""
    changes = []
    for name, rows in sorted(_table_files(store, "evals").items()):
        metrics = {r["metric"] for r in rows}
        if "ppl" not in metrics or "nll" not in metrics:
            continue
        run_id, key = name.split("/")
        store.write_rows("evals", [r for r in rows if r["metric"] != "ppl"], run_id, key)
        changes.append(f"{store.path('evals', run_id, key)}: dropped the derived ppl row (exp of nll)")
    return changes


def _kinds(store: Store) -> list[str]:
    """Each evals file's `kind`, where null: what its key and its run's task say it is (the one place that reads
    it from a key); and each interval inside its metric's declared bounds, as rows are written today."""
    from study.engine.rows import NLL_KEYS, clipped
    from tasks import TASKS, is_likelihood

    changes, tasks = [], {}
    for name, rows in sorted(_table_files(store, "evals").items()):
        if all(r["kind"] is not None for r in rows):
            continue
        run_id, key = name.split("/")
        stem = key[: -len(".parquet")]
        if run_id not in tasks:
            tasks[run_id] = (store.run_row(run_id) or {}).get("task")
        likelihood = is_likelihood(tasks[run_id])
        kind = ("nll" if stem in NLL_KEYS.values() else "ext" if stem.startswith("ext-")
                else "gen" if likelihood and stem.endswith("-gen") else "likelihood" if likelihood else "sample")
        declared = TASKS[tasks[run_id]][1] if tasks[run_id] in TASKS else None
        for r in rows:  # and each interval inside its metric's declared bounds, as rows are written today
            r["kind"] = r["kind"] or kind
            r["ci_low"], r["ci_high"] = clipped(r["ci_low"], r["ci_high"], declared and declared.metric_of(r["metric"]))
        store.write_rows("evals", rows, run_id, key)
        changes.append(f"{store.path('evals', run_id, key)}: kind {kind}")
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
