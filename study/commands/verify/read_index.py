"""The read index (_index/): what a reader would trust of it is what the files hold."""
from __future__ import annotations

from store import SCHEMAS, index
from study.commands.verify.context import Context, equal


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
        names = idx["_file"].to_pylist()
        sizes, mtimes = idx["_size"].to_pylist(), idx["_mtime_ns"].to_pylist()
        crcs = idx["_crc"].to_pylist()
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
                if any(not equal(x, y) for x, y in zip(a, b)):
                    i = next(i for i, (x, y) in enumerate(zip(a, b)) if not equal(x, y))
                    v.problems.append(f"{ipath}: entry {name} row {i}: field {col} is {str(a[i])[:60]!r} but the "
                                      f"file says {str(b[i])[:60]!r} (readers of the index would see the former)")
