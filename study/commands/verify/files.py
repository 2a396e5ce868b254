"""The store's files: every Parquet file parsed where the layout puts it, the read index (_index/) against
the files it summarises, and what interrupted writes and damage leave behind."""
from __future__ import annotations

import os

import pyarrow.fs as pafs

from store import SCHEMAS, index, is_safe_name
from study.commands.verify.context import Context, equal


def read_tables(c: Context) -> None:
    """c.files and c.tables: every Parquet file of the store (misplaced files are problems), parsed (one that
    does not parse is a problem)."""
    store, v = c.store, c.v
    for table in SCHEMAS:
        root = f"{store.dir}/{table}"
        for info in store.fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
            if info.type != pafs.FileType.File or info.base_name[0] in "._":
                continue  # temp files of interrupted writers are not part of the store
            rel = tuple(info.path[len(root) + 1:].split("/"))
            flat = table in ("runs", "history")
            if (not info.base_name.endswith(".parquet") or len(rel) != (1 if flat else 2)
                    or not all(is_safe_name(p) for p in rel)):
                v.problems.append(f"orphan file {info.path}: not where the store's layout puts a {table} file")
                continue
            path = c.files[(table, rel)] = info.path
            data = store.read_bytes(path)
            t = store._parse(path, data, SCHEMAS[table]) if data is not None else None
            if t is None:
                why = store.unreadable.get(path, "vanished while read")
                v.problems.append(f"unreadable file {path}: {why}")
            else:
                c.tables[(table, rel)] = t


def check_index(c: Context) -> None:
    """Every entry of _index/<table>.parquet that a reader would trust (its file listed with the same size
    and mtime) must hold exactly that file's rows (or, for samples, its row count)."""
    store, v, tables = c.store, c.v, c.tables
    for table, schema in SCHEMAS.items():
        idx = index.load_index(store, table, schema)
        if idx is None or not idx.num_rows:
            continue
        ipath = f"{store.dir}/{index.INDEX_DIR}/{table}.parquet"
        listing = {i.path[len(store.dir) + len(table) + 2:]: i for i in index.list_files(store, table)}
        names, sizes, mtimes, crcs = (idx[n].to_pylist() for n in ("_file", "_size", "_mtime_ns", "_crc"))
        starts: dict[str, list[int]] = {}
        for r, name in enumerate(names):
            starts.setdefault(name, []).append(r)
        for name, rs in sorted(starts.items()):
            info = listing.get(name)
            if info is None or (sizes[rs[0]], mtimes[rs[0]]) != index._ident(info):
                continue  # stale: readers read the file itself
            if store.local and index._read_tail_crc(info.path, int(info.size or 0)) != crcs[rs[0]]:
                continue  # changed in place: readers read the file itself (and so does this check)
            t = tables.get((table, tuple(name.split("/"))))
            if t is None:
                continue  # unreadable: reported with the file
            v.add("index_entries")
            if table not in index.ROWS_TABLES:
                n = idx["_rows"][rs[0]].as_py()
                if n != t.num_rows:
                    v.problems.append(f"{ipath}: entry {name}: field _rows is {n} but the file holds {t.num_rows}")
                continue
            if rs != list(range(rs[0], rs[0] + len(rs))):
                v.problems.append(f"{ipath}: entry {name}: rows not contiguous (an edited index)")
                continue
            body = idx.slice(rs[0], len(rs)).drop_columns([n for n, _ in index.META])
            if body.num_rows == t.num_rows and body.equals(t):
                continue
            if body.num_rows != t.num_rows:
                v.problems.append(f"{ipath}: entry {name} holds {body.num_rows} rows, the file {t.num_rows}")
                continue
            for col in schema.names:
                a, b = body.column(col).to_pylist(), t.column(col).to_pylist()
                i = next((i for i, (x, y) in enumerate(zip(a, b)) if not equal(x, y)), None)
                if i is not None:
                    v.problems.append(f"{ipath}: entry {name} row {i}: field {col} is {str(a[i])[:60]!r} but the "
                                      f"file says {str(b[i])[:60]!r} (readers of the index would see the former)")


def check_leftovers(c: Context) -> None:
    """Temp files of writes that never finished, cached task data that does not load, files that exist but
    cannot be read (a directory or a dangling link in a file's place); files set aside in quarantine/ are
    noted (kept, never deleted)."""
    import time

    from store import QUARANTINE, TEMP_AGE_S
    from study.engine.rows import damaged_data

    store, v = c.store, c.v

    for info in store.temp_files(0.0):
        old = info.mtime is None or info.mtime.timestamp() < time.time() - TEMP_AGE_S
        (v.problems if old else v.notes).append(
            f"left-over temp file {info.path} ({info.size} bytes" + ("): an interrupted write; `study run` removes it"
                                                                   if old else ", being written now?)"))
    if store.local and os.path.isdir(store.path("data")):
        for path, why in damaged_data(store.path("data")):
            v.problems.append(f"damaged cached task data {path} ({why}): `study run` sets it aside and makes it anew")
    aside = [i for i in store.fs.get_file_info(pafs.FileSelector(f"{store.dir}/{QUARANTINE}", recursive=True,
                                                                 allow_not_found=True))
             if i.type == pafs.FileType.File]
    if aside:
        v.notes.append(f"{len(aside)} damaged file(s) set aside in {store.dir}/{QUARANTINE}/ (kept for inspection)")
    for path, why in sorted(store.unreadable.items()):  # read but not parsed by the checks above
        if not any(path in p for p in v.problems):
            v.problems.append(f"unreadable file {path}: {why}")
