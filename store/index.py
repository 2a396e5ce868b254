"""A read index per table: what a store of thousands of small files costs to read again.

`study run` writes one small Parquet file per run and per evaluation point; reading a 1,000-run
study means 40,000+ files, and on an object store each is a round trip. The small files stay the
truth (they are never merged, moved or deleted here: a killed writer, `study verify`, damaged-file
handling and per-run reads all see the same layout). Beside them, `<study>/_index/<table>.parquet`
holds the rows of every file already parsed, each row with the file it came from and that file's
size and modification time when it was read.

A bulk read lists the table's directory (one listing), loads the index (one file), takes the rows
of every listed file whose size and mtime match its index entry, and reads (in parallel) only the
files that are new or changed. So:
- nothing is read twice: each listed file contributes its rows from exactly one source, and
  index rows of files no longer listed are dropped;
- a killed index writer leaves the old index or the new one (temp file + rename): both are only
  a cache, checked entry by entry against the listing;
- a file rewritten within the mtime granularity of the version indexed (1 s on S3) could show
  the same size and mtime: like git's "racily clean" entries, a file is indexed only when its
  mtime is older than the newest mtime of the listing by more than the store's granularity, so
  any later rewrite gets a later mtime. That window is `RACY_S` where every listed mtime is a
  whole second (S3, FAT, ext3, HFS+: coarse clocks) and `FINE_RACY_S` where any is not (ext4,
  xfs, btrfs, tmpfs, NTFS: stamps from a clock of a few milliseconds at most), so that on a local
  disk only the last moments of a sweep are read again, not its last two seconds of files;
- unreadable files are never indexed: every read parses them again and names them;
- a file changed in place with its size and mtime kept (bit rot, or a write followed by a reset
  mtime) is caught on local disks by a CRC-32 of its last `TAIL` bytes, kept per entry: the tail
  holds the Parquet footer (schema, row-group statistics, every column chunk's offset) and, for
  files under `TAIL` bytes (every runs, evals and samples file of a typical run), the whole file.
  Checking costs one open and one read per file (about 10 us on a warm local disk: ~0.4 s for the
  40,000 files of a 1,000-run study); an object store rewrites an object with a new mtime and
  checksums what it stores, so there the size and mtime are all that is compared.
Tables whose rows are too big to copy (samples) index the verdict only (readable, row count).
"""
from __future__ import annotations

import io
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

INDEX_DIR = "_index"
VERSION = "2"  # 2: the _crc column
RACY_S = 2.0  # coarsest mtime granularity in use (FAT: 2 s; S3 and ext3: 1 s)
FINE_RACY_S = 0.05  # sub-second mtimes: the kernel's file-time clock ticks every 1-10 ms
ROWS_TABLES = ("runs", "evals", "history")  # indexed with their rows; others (samples) by verdict only
META = [("_file", pa.string()), ("_size", pa.int64()), ("_mtime_ns", pa.int64()), ("_crc", pa.int64())]
TAIL = 16384  # bytes at a file's end whose CRC-32 an index entry keeps (local stores)
VERDICT = pa.schema([*META, ("_rows", pa.int64())])
MIN_NEW = 16  # rewrite the index only when at least this many files were parsed afresh
PARALLEL_FROM = 16  # files of a local store: fewer are read one after another (read_map)


def workers(store) -> int:
    return 16 if not store.local else min(8, 2 * (os.cpu_count() or 1))


def read_map(store, fn, items, threads: int | None = None) -> list:
    """[fn(item) for item in items], in `threads` threads (default workers(store)): a file's read and parse
    release the GIL (pyarrow, an object store's round trip). Fewer than PARALLEL_FROM files of a local store
    are read in this thread: starting the threads costs them more than it saves (a few ms a file read, tens
    of ms of threads started in a small study's `study status`)."""
    items = list(items)
    if store.local and len(items) < PARALLEL_FROM:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(threads or workers(store)) as pool:
        return list(pool.map(fn, items))


def list_files(store, table: str) -> list[pafs.FileInfo]:
    """The table's data files (hidden temp files and other names skipped), sorted by path. A table file's
    name that is no regular file (a directory, a dangling symlink) is noted in `store.unreadable`."""
    d = f"{store.dir}/{table}"
    infos = store.fs.get_file_info(pafs.FileSelector(d, recursive=True, allow_not_found=True))
    for i in infos:
        if i.type != pafs.FileType.File and i.base_name.endswith(".parquet") and i.base_name[0] not in "._":
            dangling = store.local and i.type == pafs.FileType.NotFound and os.path.islink(i.path)
            store.unreadable[i.path] = (f"a dangling symlink to {os.readlink(i.path)}" if dangling else
                                        "cannot be read: a directory where a file belongs")
    return sorted((i for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                   and i.base_name[0] not in "._"), key=lambda i: i.path)


def racy_window(files: list[pafs.FileInfo]) -> tuple[int, float]:
    """(the listing's newest mtime in ns, seconds a file's mtime must precede it to be indexed): RACY_S
    when every mtime is a whole second (a coarse clock, or a store that reports seconds), else
    FINE_RACY_S. One pass over the listing."""
    mtimes = np.fromiter((i.mtime_ns or 0 for i in files), dtype=np.int64, count=len(files))
    if not len(mtimes):
        return 0, RACY_S
    return int(mtimes.max()), FINE_RACY_S if (mtimes % 1_000_000_000).any() else RACY_S


def _ident(info: pafs.FileInfo) -> tuple[int, int]:
    return int(info.size or 0), int(info.mtime_ns or 0)


def tail_crc(data: bytes) -> int:
    return zlib.crc32(data[-TAIL:])


def _read_tail_crc(path: str, size: int) -> int | None:
    """CRC-32 of the last TAIL bytes of a local file (None when it cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return zlib.crc32(os.pread(fd, TAIL, max(0, size - TAIL)))
    except OSError:
        return None
    finally:
        os.close(fd)


def _index_path(store, table: str) -> str:
    return f"{store.dir}/{INDEX_DIR}/{table}.parquet"


def load_index(store, table: str, schema: pa.Schema) -> pa.Table | None:
    """The stored index of `table` in the current schema; None when absent or not usable."""
    data = store.read_bytes(_index_path(store, table))
    if data is None:
        return None
    try:
        f = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
        meta = f.schema_arrow.metadata or {}
        if meta.get(b"rmdm_index") != VERSION.encode():
            return None
        t = f.read(use_threads=False)
        want = VERDICT if table not in ROWS_TABLES else pa.schema([*META, *schema])
        return t.cast(want)  # an index of other columns (an older format's) fails: rebuilt
    except (pa.ArrowException, ValueError, TypeError, OSError, KeyError):
        return None  # a cache: a damaged or foreign index is rebuilt, never trusted


def _save_index(store, table: str, t: pa.Table) -> None:
    t = t.replace_schema_metadata({"rmdm_index": VERSION})
    buf = io.BytesIO()
    pq.write_table(t, buf, write_page_checksum=True)  # a bit flipped in the index fails its read: rebuilt
    try:
        store.write_bytes(_index_path(store, table), buf.getvalue())
    except OSError:
        pass  # a read-only store still reads; only the next read is slower


def scan(store, table: str, schema: pa.Schema, first: bool = False, whole: bool = False):
    """(files listed, {relative path: row count}, {relative path: its first row} or None) for every readable
    file of `table`, files in path order; `first`: the first row (as Table.to_pylist gives it) of each file
    of a ROWS_TABLES table with rows; `whole`: the third item is every row (what concatenating every file's
    table gives). Tables too large to hold (samples) are counted from the verdict index alone. Unreadable
    files are noted in `store.unreadable` by `store.parse_checked` and left out.

    Unchanged files' rows are taken from the index, the others parsed now (in parallel), and both put in
    file order by one `take` of their row numbers, not one table per file: 20,000 per-file tables and
    their concatenation cost more than the rest of the read at 1,000 runs. An index rewritten here is
    built the same way, so it holds the same bytes whatever index it replaces."""
    keep_rows = table in ROWS_TABLES
    files = list_files(store, table)
    prefix = f"{store.dir}/{table}/"
    rel = {i.path: i.path[len(prefix):] for i in files}
    index = load_index(store, table, schema)
    spans = _spans(index) if index is not None and keep_rows else {}
    if spans is None:
        index, spans = None, {}  # not in file order (edited): rebuilt, never trusted
    damaged = index is None and store.exists(_index_path(store, table))  # rewritten whole below
    cached: dict[str, tuple] = {}  # name -> ((size, mtime), crc, [first, last) of its rows in the index)
    if index is not None:
        got = [index[n].to_pylist() for n in ("_file", "_size", "_mtime_ns", "_crc")]
        counts = index["_rows"].to_pylist() if not keep_rows else None
        for r, (name, s, m, c) in enumerate(zip(*got)):
            cached.setdefault(name, ((s, m), c, spans[name] if keep_rows else (0, counts[r])))
    hits, crc = {}, {}  # name -> its rows' span in the index; name -> tail CRC of the bytes read or checked now
    for info in files:
        name, hit = rel[info.path], cached.get(rel[info.path])
        if hit is not None and hit[0] == _ident(info):
            # the same size and mtime: on a local disk, the same bytes? (bit rot, a reset mtime)
            now = _read_tail_crc(info.path, int(info.size or 0)) if store.local else hit[1]
            if now is not None and now == hit[1]:
                hits[name], crc[name] = hit[2], now
    body = index.drop_columns([n for n, _ in META]) if index is not None and keep_rows else None
    if table == "runs" and hits and body is not None:
        for name in _forged_runs(body, hits):  # index rows that are not what their runs file's row recorded
            damaged = True
            del hits[name]

    def parse(info: pafs.FileInfo):
        data = store.read_bytes(info.path)
        if data is None:
            return None
        crc[rel[info.path]] = tail_crc(data)
        return store.parse_checked(info.path, data, schema)

    fresh = [i for i in files if rel[i.path] not in hits]
    parsed = {rel[i.path]: t for i, t in zip(fresh, read_map(store, parse, fresh)) if t is not None}
    newest, racy_s = racy_window(files)
    indexable = {rel[i.path] for i in fresh
                 if rel[i.path] in parsed and (newest - (i.mtime_ns or 0)) / 1e9 > racy_s}
    # rewritten when damaged, with MIN_NEW files to add, or with MIN_NEW entries gone
    due = damaged or len(indexable) >= MIN_NEW or \
        (index is not None and len(hits) + len(indexable) < len(cached) - MIN_NEW)
    # every readable file's rows as a span of `rows`: the index's body, then the files parsed now
    where, at = dict(hits), body.num_rows if body is not None else 0
    for name, t in parsed.items():
        where[name], at = (at, at + t.num_rows), at + t.num_rows
    pieces = ([body] if body is not None else []) + (list(parsed.values()) if keep_rows else [])
    rows = pa.concat_tables(pieces) if pieces else schema.empty_table()
    listed = [n for n in (rel[i.path] for i in files) if n in where]
    counts = {n: where[n][1] - where[n][0] for n in listed}
    if due:  # an empty file of a rows table is read again each time (cheap; keeps the index row-aligned)
        info_of = {rel[i.path]: i for i in files}
        entries = [(n, *_ident(info_of[n]), crc[n], counts[n]) for n in listed
                   if (n in hits or n in indexable) and (counts[n] or not keep_rows)]
        if keep_rows:
            t = _rows_index(schema, entries, _take(rows, [where[e[0]] for e in entries]))
        else:
            cols = list(zip(*entries)) or [[]] * len(VERDICT)
            t = pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, VERDICT)], schema=VERDICT)
        _save_index(store, table, t)
    if whole:
        return files, counts, _take(rows, [where[n] for n in listed])
    firsts = None
    if first and keep_rows:
        have = [n for n in listed if counts[n]]
        firsts = dict(zip(have, _take(rows, [(where[n][0], where[n][0] + 1) for n in have]).to_pylist()))
    return files, counts, firsts


def _take(t: pa.Table, spans: list[tuple[int, int]]) -> pa.Table:
    """The rows [a, b) of `t` for each (a, b) of `spans`, in that order, as one table (one chunk per column)."""
    a = np.asarray([s[0] for s in spans], dtype=np.int64)
    n = np.asarray([s[1] - s[0] for s in spans], dtype=np.int64)
    order = np.repeat(a - (np.cumsum(n) - n), n) + np.arange(n.sum(), dtype=np.int64)
    return t.take(pa.array(order, pa.int64())).combine_chunks()


def _spans(t: pa.Table) -> dict[str, tuple[int, int]] | None:
    """{file: [first, last) of its rows in `t`} when `t` is in file order (as scan leaves it: each file's
    rows one stretch), else None."""
    if not t.num_rows:
        return {}
    files = t["_file"].combine_chunks()
    if len(files) > 1 and not pc.all(pc.less_equal(files[:-1], files[1:])).as_py():
        return None
    ends = pc.run_end_encode(files, run_end_type=pa.int64())
    names, stops = ends.values.to_pylist(), ends.run_ends.to_pylist()
    return {n: (a, b) for n, a, b in zip(names, [0, *stops[:-1]], stops)}


def _forged_runs(body: pa.Table, hits: dict[str, tuple[int, int]]) -> list[str]:
    """Files of the runs index whose rows are not the rows their field row_sha256 recorded (edited in the
    index with its entry kept): read again from the file, and the index rewritten."""
    from store.digest import row_sha256

    names = list(hits)
    rows = _take(body, [hits[n] for n in names]).to_pylist()
    counts = np.cumsum([0] + [hits[n][1] - hits[n][0] for n in names])
    return [n for n, a, b in zip(names, counts[:-1], counts[1:])
            if any(r.get("row_sha256") is not None and row_sha256(r) != r["row_sha256"] for r in rows[a:b])]


def _rows_index(schema: pa.Schema, entries: list[tuple], body: pa.Table) -> pa.Table:
    """The index table of a rows table: each entry's (name, size, mtime, crc, rows) repeated over its rows,
    beside `body` (every entry's rows, in order).

    Built column by column (one array per column for all files), not one small table per file:
    at 40,000 files the per-file tables cost more than reading the files."""
    want = pa.schema([*META, *schema])
    if not entries:
        return want.empty_table()
    *cols, counts = zip(*entries)  # name, size, mtime, crc (META's columns); rows
    reps = np.asarray(counts, dtype=np.int64)
    meta = [pa.array(np.repeat(np.asarray(c, dtype=object if t == pa.string() else np.int64), reps), t)
            for c, (_, t) in zip(cols, META)]
    return pa.Table.from_arrays(meta + list(body.columns), schema=want)
