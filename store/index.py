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
        cols = [t[n].cast(fld.type) if n in t.column_names else pa.nulls(len(t), fld.type)
                for n, fld in zip(want.names, want)]
        return pa.Table.from_arrays(cols, schema=want)
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


def scan(store, table: str, schema: pa.Schema, rows: bool = True, first: bool = False, whole: bool = False):
    """(files listed, {relative path: row count}, {relative path: its first row} or None) for every readable
    file of `table`: what Store.summary needs, not every file's rows.

    `rows=False` counts from the verdict index alone (tables too large to hold: samples); `first`: each
    file with rows has its first row (as Table.to_pylist gives it) in the third item; `whole`: the third item is
    every row (what read_table gives). A ROWS_TABLES
    table is gathered as read_table does (unchanged files' rows as a few long slices of the index), not
    one table per file. Unreadable files are noted in `store.unreadable` by `store.parse_checked` and left out.
    """
    seen = _Seen(store, table, schema, rows)
    g = seen.gather()
    seen.save(g)
    counts = dict(zip(g.names, g.counts))
    firsts = None
    if whole:
        return seen.files, counts, pa.concat_tables(g.pieces).combine_chunks() if g.pieces else schema.empty_table()
    if first and seen.keep_rows:
        starts = np.cumsum([0, *g.counts[:-1]], dtype=np.int64)
        have = [i for i, n in enumerate(g.counts) if n]
        t = pa.concat_tables(g.pieces) if g.pieces else schema.empty_table()
        firsts = dict(zip([g.names[i] for i in have], t.take(pa.array(starts[have], pa.int64())).to_pylist()))
    return seen.files, counts, firsts


def read_table(store, table: str, schema: pa.Schema) -> pa.Table:
    """Every readable file's rows of a ROWS_TABLES table in one table, files in path order: what
    concatenating every file's table in name order gives, but with the rows of unchanged files taken
    from the index as a few long slices (one per stretch of unchanged files between changed ones)
    instead of one table per file: 20,000 per-file slices and their concatenation cost more than the
    rest of the read at 1,000 runs. An index rewritten here is built from the same slices."""
    return scan(store, table, schema, whole=True)[2]


class _Slices:
    """Tables in order, consecutive row ranges of one body merged into one slice."""

    def __init__(self, body: pa.Table | None):
        self.body, self.out, self.span = body, [], None

    def rows(self, a: int, b: int) -> None:
        if self.span is not None and self.span[1] == a:
            self.span = (self.span[0], b)
        else:
            self._flush()
            self.span = (a, b)

    def table(self, t: pa.Table) -> None:
        self._flush()
        self.out.append(t)

    def _flush(self) -> None:
        if self.span is not None:
            self.out.append(self.body.slice(self.span[0], self.span[1] - self.span[0]))
            self.span = None

    def done(self) -> list[pa.Table]:
        self._flush()
        return self.out


class _Gathered:
    """A rows table's readable files in file order: `names`, `counts` (rows each), `pieces` (their rows,
    in order, as few tables as the index allows) and the index to write: `entries` (name, size, mtime,
    crc, rows) of the files it keeps (unchanged ones and those parsed now and old enough, each with rows)
    and `kept` (their rows, in order)."""

    def __init__(self, names, counts, pieces, entries, kept):
        self.names, self.counts, self.pieces, self.entries, self.kept = names, counts, pieces, entries, kept


class _Seen:
    """One pass over a table's listing: which files the index holds unchanged (hits; their rows: `sub`)
    and the others, parsed now (`parsed`: (info, table or None)), with each file's tail CRC."""

    def __init__(self, store, table: str, schema: pa.Schema, rows: bool):
        self.store, self.table, self.schema = store, table, schema
        self.files = files = list_files(store, table)
        prefix = f"{store.dir}/{table}/"
        self.rel = rel = {i.path: i.path[len(prefix):] for i in files}
        self.keep_rows = rows and table in ROWS_TABLES
        self.index = index = load_index(store, table, schema)
        if index is not None and self.keep_rows and _spans(index) is None:
            index = self.index = None  # not in file order (edited): rebuilt, never trusted
        self.damaged = index is None and store.exists(_index_path(store, table))  # rewritten whole by save
        cached: dict[str, tuple[tuple[int, int], int, int]] = {}  # rel -> (ident, first row in index, crc)
        if index is not None and index.num_rows:
            names = index["_file"].to_pylist()
            sizes, mtimes = index["_size"].to_pylist(), index["_mtime_ns"].to_pylist()
            crcs = index["_crc"].to_pylist()
            for r, (name, s, m, c) in enumerate(zip(names, sizes, mtimes, crcs)):
                cached.setdefault(name, ((s, m), r, c))
        self.n_cached = len(cached)
        fresh, self.hits = [], []
        self.crc = crc = {}  # rel -> tail CRC of the bytes read or checked now
        for info in files:
            name = rel[info.path]
            hit = cached.get(name)
            if hit is not None and hit[0] == _ident(info):
                if store.local:  # the same size and mtime: the same bytes? (bit rot, a reset mtime)
                    now = _read_tail_crc(info.path, int(info.size or 0))
                    if now is None or now != hit[2]:
                        fresh.append(info)
                        continue
                    crc[name] = now
                else:
                    crc[name] = hit[2]
                self.hits.append(name)
            else:
                fresh.append(info)
        self.sub = index.filter(pc.is_in(index["_file"], pa.array(sorted(set(self.hits)), pa.string()))) \
            if self.hits else None
        if table == "runs" and self.sub is not None and self.keep_rows:
            forged = _forged_runs(self.sub)  # index rows that are not what their runs file's row recorded
            if forged:
                self.damaged = True
                self.hits = [n for n in self.hits if n not in forged]
                fresh += [i for i in files if rel[i.path] in forged]
                self.sub = index.filter(pc.is_in(index["_file"], pa.array(sorted(self.hits), pa.string())))

        def parse(info: pafs.FileInfo):
            data = store.read_bytes(info.path)
            if data is None:
                return info, None
            crc[rel[info.path]] = tail_crc(data)
            return info, store.parse_checked(info.path, data, schema)

        self.parsed = read_map(store, parse, sorted(fresh, key=lambda i: i.path))
        newest, racy_s = racy_window(files)
        self.indexable = [info for info, t in self.parsed
                          if t is not None and (newest - (info.mtime_ns or 0)) / 1e9 > racy_s]

    def gather(self) -> _Gathered:
        """The files' rows gathered in file order from long slices of `sub` and the files parsed now (a rows
        table; row counts only for a verdict table). The index's entries only when it is due."""
        spans = _spans(self.sub) if self.keep_rows else {}
        if not self.keep_rows and self.sub is not None:
            spans = {n: (0, int(k)) for n, k in zip(self.sub["_file"].to_pylist(), self.sub["_rows"].to_pylist())}
        fresh = {self.rel[info.path]: t for info, t in self.parsed if t is not None}
        new = {i.path for i in self.indexable}
        due = self.due()
        hits = set(self.hits)
        body = self.sub.drop_columns([n for n, _ in META]) if self.sub is not None and self.keep_rows else None
        read, kept = _Slices(body), _Slices(body)
        names, counts, entries = [], [], []
        for info in self.files:
            name = self.rel[info.path]
            if name in fresh:
                t = fresh[name]
                n = t.num_rows
                if self.keep_rows:
                    read.table(t)
                # an empty file of a rows table is read again each time (cheap; keeps the index row-aligned)
                if due and info.path in new and (n or not self.keep_rows):
                    if self.keep_rows:
                        kept.table(t)
                    entries.append((name, *_ident(info), self.crc[name], n))
            elif name in hits:
                a, b = spans.get(name, (0, 0))  # not in spans: a file of zero rows (adds none)
                n = b - a
                if self.keep_rows and n:
                    read.rows(a, b)
                    kept.rows(a, b) if due else None
                if due and (n or not self.keep_rows):
                    entries.append((name, *_ident(info), self.crc[name], n))
            else:
                continue  # unreadable: never indexed
            names.append(name), counts.append(n)
        return _Gathered(names, counts, read.done(), entries, kept.done())

    def save(self, g: _Gathered) -> None:
        if not self.due():
            return
        if self.keep_rows:
            t = _rows_index(self.schema, g.entries, g.kept)
        else:
            cols = list(zip(*g.entries)) or [[]] * len(VERDICT)
            t = pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, VERDICT)], schema=VERDICT)
        _save_index(self.store, self.table, t)

    def due(self) -> bool:
        """Whether the index is to be rewritten: damaged, MIN_NEW files to add, or MIN_NEW entries gone."""
        return self.damaged or len(self.indexable) >= MIN_NEW or \
            (self.index is not None and len(self.hits) + len(self.indexable) < self.n_cached - MIN_NEW)


def _spans(t: pa.Table | None) -> dict[str, tuple[int, int]] | None:
    """{file: [first, last) of its rows in `t`} when `t` is in file order (as save leaves it: each file's
    rows one stretch), else None."""
    if t is None or not t.num_rows:
        return {}
    files = t["_file"].combine_chunks()
    if len(files) > 1 and not pc.all(pc.less_equal(files[:-1], files[1:])).as_py():
        return None
    ends = pc.run_end_encode(files, run_end_type=pa.int64())
    names, stops = ends.values.to_pylist(), ends.run_ends.to_pylist()
    return {n: (a, b) for n, a, b in zip(names, [0, *stops[:-1]], stops)}


def _forged_runs(sub: pa.Table) -> set[str]:
    """Files of the runs index whose rows are not the rows their field row_sha256 recorded (edited in the
    index with its entry kept): read again from the file, and the index rewritten."""
    from store.digest import row_sha256

    files = sub["_file"].to_pylist()
    rows = sub.drop_columns([n for n, _ in META]).to_pylist()
    return {f for f, r in zip(files, rows) if r.get("row_sha256") is not None and row_sha256(r) != r["row_sha256"]}


def _rows_index(schema: pa.Schema, entries: list[tuple], bodies: list[pa.Table]) -> pa.Table:
    """The index table of a rows table: each entry's (name, size, mtime, crc, rows) repeated over its rows,
    beside `bodies` (every entry's rows, in order, in as many tables as they come).

    Built column by column (one array per column for all files), not one small table per file:
    at 40,000 files the per-file tables cost more than reading the files."""
    want = pa.schema([*META, *schema])
    if not entries:
        return want.empty_table()
    names, sizes, mtimes, crcs, counts = zip(*entries)
    reps = np.asarray(counts, dtype=np.int64)
    try:
        body = pa.concat_tables(bodies).combine_chunks()
    except pa.ArrowInvalid:  # a file of an older schema version (never expected: rows are conformed)
        body = pa.concat_tables([b.cast(schema) for b in bodies]).combine_chunks()
    meta = [pa.array(np.repeat(np.asarray(names, dtype=object), reps), pa.string()),
            pa.array(np.repeat(np.asarray(sizes, dtype=np.int64), reps), pa.int64()),
            pa.array(np.repeat(np.asarray(mtimes, dtype=np.int64), reps), pa.int64()),
            pa.array(np.repeat(np.asarray(crcs, dtype=np.int64), reps), pa.int64())]
    return pa.Table.from_arrays(meta + list(body.columns), schema=want)
