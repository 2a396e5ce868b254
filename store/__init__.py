"""The results store: one directory per study, Parquet tables with explicit schemas.

Layout of `<root>/<study>/`:
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
    checkpoints/<run_id>.pt               resumable mid-training state (and <run_id>.prev.pt, the one before)
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

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import atomicio
from store import digest, index
from store import format as store_format

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
    # what adaptive sampling depth actually spends; null in rows written before it was recorded
    ("forward_passes_mean", pa.float64()),
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
# The one name rule of the store (study names, run ids, eval keys, file names): matched whole
# (`fullmatch`: `$` would let a trailing newline through), no '..' anywhere.
SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
NAME_RULE = "1-200 letters, digits, '_', '-', '.', starting with a letter or digit, no '..'"
QUARANTINE = "quarantine"  # <study>/quarantine/<where it was>.<UTC time>: damaged files set aside, never deleted
# temp files of a write that never finished (a killed process, a full disk): atomicio's `.<name>.<8 hex>.tmp`
# (Store.write_bytes names its temp files the same way); earlier versions' `<name>.tmp-<pid>[.npz]` and `.part`
TEMP = re.compile(r"\..+\.[0-9a-f]{8}\.tmp|.+\.tmp-\d+(\.npz)?|.+\.[0-9a-f]{8}\.part")
TEMP_AGE_S = 60.0  # a temp file untouched this long belongs to no live writer: left over


def is_safe_name(name) -> bool:
    """Whether `name` is a single path component that cannot escape the store."""
    return isinstance(name, str) and SAFE.fullmatch(name) is not None and ".." not in name


def safe_name(name: str, what: str = "name") -> str:
    """A single path component that cannot escape the store ('..', '/', absolute paths)."""
    if not is_safe_name(name):
        raise ValueError(f"unsafe {what} {name!r}: use {NAME_RULE}")
    return name


class DiskFull(OSError):
    """A write failed for want of space: names the file and the free space (one line, exit 2)."""


class OutsideStore(OSError):
    """A write would go through a symlink that leads out of the study's directory: refused."""


def _enospc(e: BaseException) -> bool:
    return getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)


def free_space(path: str) -> str:
    """Free space of the local filesystem holding `path` (or its nearest existing parent), in words."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        u = shutil.disk_usage(path or "/")
    except OSError:
        return "free space unknown"
    return f"{_bytes(u.free)} free of {_bytes(u.total)}"


def _first_link(top: str, path: str) -> str | None:
    """The first component of `path` below `top` that is a symlink (None if none)."""
    rel = os.path.relpath(path, top)
    cur = top
    for part in rel.split(os.sep):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            return cur
    return None


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


GCS_RETRY_S = 10  # a gs:// store unreachable (no network, no credentials) fails within this, as s3:// does


def filesystem_from_uri(uri: str):
    """pyarrow's (filesystem, path) of `uri`. A gs:// (gcs://) URI gets `retry_limit_seconds` (unless it
    gives its own): the Google client otherwise retries for about 15 minutes, where S3's gives up in
    seconds."""
    scheme = uri.split("://", 1)[0].lower()
    if scheme in ("gs", "gcs") and "retry_limit_seconds=" not in uri:
        uri = f"{uri}{'&' if '?' in uri else '?'}retry_limit_seconds={GCS_RETRY_S}"
    return pafs.FileSystem.from_uri(uri)


class Store:
    """One study's directory in a results root (local path or URI)."""

    def __init__(self, root: str, study: str, check_format: bool = True):
        """`check_format`: refuse (store.format.FormatMismatch, one line) a study of another format version
        than this code's; only `study migrate` opens one without."""
        self.root = root
        self.study = safe_name(study, "study name")
        if "://" in root:
            self.fs, base = filesystem_from_uri(root)
        else:
            self.fs, base = pafs.LocalFileSystem(), os.path.abspath(root)
        self.base = base.rstrip("/")
        self.dir = f"{self.base}/{self.study}"
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        # path -> why, for every table file a read of this Store could not parse (damaged,
        # truncated, foreign): readers skip them and say so; `study run` redoes what they held
        self.unreadable: dict[str, str] = {}
        # one line per file this Store set aside (Store.quarantine), for the caller to show
        self.quarantined: list[str] = []
        # a new study (no data yet) gets its FORMAT with its first file
        self.unstamped = store_format.check(self) if check_format else False

    def path(self, *parts: str) -> str:
        return "/".join([self.dir, *[safe_name(p, "path part") for p in parts]])

    # ---- raw files -------------------------------------------------------------------------
    def write_bytes(self, path: str, data: bytes) -> None:
        if self.unstamped:
            self.unstamped = False
            self.write_bytes(store_format.path(self), store_format.stamp_bytes())
        parent = path.rsplit("/", 1)[0]
        self.check_inside(path)
        self.fs.create_dir(parent, recursive=True)
        if self.local and os.path.isdir(path) and not os.path.islink(path):
            self.quarantine(path, "a directory where a file belongs")
        tmp = atomicio.temp_name(path)
        try:
            with self.fs.open_output_stream(tmp) as f:
                f.write(data)
            self.fs.move(tmp, path)  # atomic rename on local and POSIX-like filesystems
        except OSError as e:
            self._drop(tmp)  # never leave half a file behind
            if _enospc(e):
                raise self.disk_full(path, len(data)) from None
            raise

    def disk_full(self, path: str, n: int | None = None) -> DiskFull:
        """The one-line error of a write to `path` (of `n` bytes, whose partial file was removed) on a full disk."""
        where = free_space(path) if self.local else "an object store"
        what = f" ({_bytes(n)}; the partial file was removed)" if n is not None else ""
        return DiskFull(errno.ENOSPC, f"no space left on the disk writing {path}{what}: {where}; free some space, "
                                      f"then run again (finished runs are kept)")

    def _drop(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except (OSError, FileNotFoundError):
            pass

    def check_inside(self, path: str) -> None:
        """Refuse (OutsideStore) a write to `path` that would follow a symlink out of the study's directory:
        a directory on the way, or the file itself when it is a link (appends follow it). Local stores."""
        if not self.local:
            return
        top = os.path.realpath(self.dir)
        for p in (os.path.dirname(path), path):
            real = os.path.realpath(p)
            if real != top and not real.startswith(top + os.sep):
                link = _first_link(self.dir, p) or p
                raise OutsideStore(errno.EXDEV, f"{link} is a symlink to {os.path.realpath(link)}, outside the store "
                                                f"{self.dir}: nothing is written through it; replace it by a "
                                                f"directory or file of the store")

    def links_out(self) -> list[str]:
        """One line per symlink in the study's directory that leads out of it (local stores): what
        `study run` refuses before it writes anything."""
        if not self.local or not os.path.isdir(self.dir):
            return []
        top = os.path.realpath(self.dir)
        out = []
        stack = [self.dir]
        while stack:
            d = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                if e.is_symlink():
                    real = os.path.realpath(e.path)
                    if real != top and not real.startswith(top + os.sep):
                        out.append(f"{e.path} is a symlink to {real}, outside the store: no command of the study "
                                   f"reads or writes through it; replace it by a "
                                   f"{'directory' if os.path.isdir(e.path) else 'file'}"
                                   f" of the store (move what it points at in, or remove the link)")
                elif e.is_dir(follow_symlinks=False) and e.name != ".ray":
                    stack.append(e.path)
        return sorted(out)

    def refuse_links_out(self) -> None:
        """Raise OutsideStore (one line: the first link, and how many more) when links_out finds any: every
        reader (status, report, verify, eval, the Python API) refuses them as `study run` does."""
        links = self.links_out()
        if links:
            more = f" (and {len(links) - 1} more such links)" if len(links) > 1 else ""
            raise OutsideStore(errno.EXDEV, links[0] + more)

    def read_bytes(self, path: str) -> bytes | None:
        """The file's bytes; None when it does not exist, or when it cannot be read (a directory, no
        permission, a dangling link): those are noted in `unreadable`, so they are named, not taken as absent.
        A local path that is (or links to) a device, FIFO or socket is never read: /dev/zero has no end."""
        if self.local:
            import stat

            try:
                mode = os.stat(path).st_mode
            except OSError:
                mode = None  # absent or unreadable: said below
            if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                self.unreadable[path] = "not a regular file (a device, FIFO or socket): not read"
                return None
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read()
        except OSError as e:
            if not isinstance(e, FileNotFoundError):
                try:
                    there = self.fs.get_file_info(path).type != pafs.FileType.NotFound or os.path.islink(path)
                except OSError:
                    there = False
                if there:
                    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[0][:160]
                    self.unreadable[path] = f"cannot be read: {why}"
            elif self.local and os.path.islink(path):
                self.unreadable[path] = f"a dangling symlink to {os.readlink(path)}"
            return None

    def stamped_path(self, prefix: str) -> str:
        """`prefix` followed by the UTC time (then -2, -3, ... if that is taken): a path nothing is at yet,
        for files set aside (quarantine/, pruned/) and never overwritten."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        dest, n = f"{prefix}{stamp}", 1
        while self.exists(dest):
            n += 1
            dest = f"{prefix}{stamp}-{n}"
        return dest

    def quarantine(self, path: str, why: str) -> str:
        """Set a damaged file (or directory) aside under quarantine/, never deleted: returns the one line
        saying so (also kept in `quarantined`). The file's own name then reads as absent: redone."""
        rel = path[len(self.dir) + 1:] if path.startswith(self.dir + "/") else path.rsplit("/", 1)[-1]
        dest = self.stamped_path(f"{self.dir}/{QUARANTINE}/{rel}.")
        self.fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
        if self.local and os.path.islink(path):
            os.replace(path, dest)  # the link itself, never what it points at
        else:
            self.fs.move(path, dest)
        self.unreadable.pop(path, None)
        line = f"set aside {path} ({why}) as {dest}"
        self.quarantined.append(line)
        return line

    def temp_files(self, min_age_s: float = TEMP_AGE_S) -> list[pafs.FileInfo]:
        """Temp files of writes that never finished, untouched for `min_age_s` (anywhere in the study but
        quarantine/ and Tune's .ray/)."""
        cutoff = time.time() - min_age_s
        out = []
        for info in self.fs.get_file_info(pafs.FileSelector(self.dir, recursive=True, allow_not_found=True)):
            rel = info.path[len(self.dir) + 1:]
            if (info.type == pafs.FileType.File and TEMP.fullmatch(info.base_name)
                    and not rel.startswith((QUARANTINE + "/", ".ray/"))
                    and (info.mtime is None or info.mtime.timestamp() < cutoff)):
                out.append(info)
        return sorted(out, key=lambda i: i.path)

    def clean_temp(self, min_age_s: float = TEMP_AGE_S) -> list[str]:
        """Remove left-over temp files (see temp_files); returns their paths."""
        gone = []
        for info in self.temp_files(min_age_s):
            self._drop(info.path)
            gone.append(info.path)
        return gone

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
        data = line.rstrip("\n").encode() + b"\n"
        self.check_inside(path)  # an append follows a symlinked log wherever it points
        try:
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with self.fs.open_append_stream(path) as f:
                f.write(data)
        except OSError as e:
            if _enospc(e):
                raise self.disk_full(path, len(data)) from None
            raise
        except (NotImplementedError, pa.ArrowNotImplementedError):
            # object stores cannot append: rewrite the whole (small) log atomically
            old = self.read_bytes(path) or b""
            self.write_bytes(path, old + data)

    # ---- tables ----------------------------------------------------------------------------
    def write_rows(self, table: str, rows: list, *parts: str) -> None:
        """Write `rows` as the file `<table>/<parts>`: dicts, or dataclass rows (study.engine.evaluate.EvalRow,
        SampleRow). Each row holds exactly the table's columns, a null one as None: a row with an
        unknown or a missing column is refused (ValueError, nothing written), so a misspelt column
        never reaches the store as a null."""
        schema = SCHEMAS[table]
        columns = {name: [] for name in schema.names}
        for r in rows:
            r = check_row(table, r if isinstance(r, dict) else row_dict(r))
            for name, values in columns.items():
                values.append(r[name])
        t = pa.Table.from_pydict(columns, schema=schema)
        if table == "runs":  # each row's digest of its own fields, as a reader will read them
            t = t.set_column(schema.get_field_index("row_sha256"), "row_sha256",
                             pa.array([digest.row_sha256(r) for r in t.to_pylist()], pa.string()))
        buf = io.BytesIO()
        pq.write_table(t, buf, write_page_checksum=True)  # a page's bytes changed later fail its read
        self.write_bytes(self.path(table, *parts), buf.getvalue())

    def read(self, table: str, filter_run: str | None = None) -> pd.DataFrame:
        """A whole table (or one run's rows), consistent while writers replace files.

        pyarrow.dataset remembers each file's size when it lists the directory; a file
        replaced between listing and reading (a checkpoint rewriting history) would then be
        read with a stale size. Here each file is read whole from one open, then parsed.
        A whole table is read through its index (store/index.py): only files new or changed
        since the last read are parsed, in parallel.
        """
        schema = SCHEMAS[table]
        if filter_run is None:
            if table in index.ROWS_TABLES:
                _, parsed = index.scan(self, table, schema)
                tables = [parsed[k] for k in sorted(parsed)]
            else:
                tables = self._read_files(index.list_files(self, table), schema)
            # one chunk per column, not one per file: pandas keeps Arrow strings chunked, and every
            # groupby, merge or filter on a 40,000-chunk column pays per chunk
            return (pa.concat_tables(tables).combine_chunks() if tables else schema.empty_table()).to_pandas()
        # evals/<run_id>/*.parquet, or runs/<run_id>.parquet in the flat tables
        d = f"{self.dir}/{table}/{safe_name(filter_run)}"
        infos = self.fs.get_file_info(pafs.FileSelector(d, recursive=True, allow_not_found=True))
        infos = infos or [self.fs.get_file_info(f"{d}.parquet")]
        infos = sorted((i for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                        and i.base_name[0] not in "._"), key=lambda i: i.path)
        tables = self._read_files(infos, schema)
        t = pa.concat_tables(tables) if tables else schema.empty_table()
        return t.filter(pc.equal(t["run_id"], filter_run)).to_pandas()

    def _read_files(self, infos: list, schema: pa.Schema) -> list[pa.Table]:
        """The parsed tables of `infos`, in their order, read in parallel (pyarrow releases the GIL)."""
        def one(info):
            data = self.read_bytes(info.path)
            return None if data is None else self._parse(info.path, data, schema)  # None: deleted since listed

        with ThreadPoolExecutor(index.workers(self)) as pool:
            return [t for t in pool.map(one, infos) if t is not None]

    def summary(self) -> "Summary":
        """What `study status` and a resume's planning need of every run, in one pass over the store.

        The same verdicts as run_row / eval_keys / readable("history", ...) per run, from one listing
        and one index per table instead of a few reads per run and point (see store/index.py)."""
        _, runs = index.scan(self, "runs", RUNS)
        _, evals = index.scan(self, "evals", EVALS)
        sample_files, samples = index.scan(self, "samples", SAMPLES, rows=False)
        hist_files, hist = index.scan(self, "history", HISTORY)

        def unreadable(files, table, ok):  # listed, not parsed: damaged (or deleted since the listing)
            prefix = f"{self.dir}/{table}/"
            return {i.path[len(prefix):] for i in files} - set(ok)

        return Summary(runs, evals, unreadable(sample_files, "samples", samples),
                       unreadable(hist_files, "history", hist), set(samples), set(hist))

    # ---- run-level helpers -----------------------------------------------------------------
    def _parse(self, path: str, data: bytes, schema: pa.Schema) -> pa.Table | None:
        """A file's table in `schema`, or None (and the file noted in `unreadable`) if it does not parse."""
        try:
            # ParquetFile.read, not read_table: no dataset machinery per small file (~5x faster)
            t = _conform(pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
                         .read(use_threads=False), schema)
        except (pa.ArrowException, ValueError, TypeError, OSError) as e:
            why = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            self.unreadable[path] = f"{len(data)} bytes, not a readable {schema_name(schema)} table: {why}"
            return None
        wrong = self._misnamed(path, t, schema)
        if wrong:
            self.unreadable[path] = wrong
            return None
        self.unreadable.pop(path, None)
        return t

    def _misnamed(self, path: str, t: pa.Table, schema: pa.Schema) -> str | None:
        """Why a file's rows do not belong at its path (run_id, and eval_key for evals and samples, must be
        what the path says: a file copied under another run's name would count that run twice), or None."""
        table = schema_name(schema)
        prefix = f"{self.dir}/{table}/"
        if not path.startswith(prefix) or not t.num_rows:
            return None
        parts = path[len(prefix):].split("/")
        if not parts[-1].endswith(".parquet"):
            return None
        want = {"run_id": parts[0][: -len(".parquet")]} if len(parts) == 1 else (
            {"run_id": parts[0], "eval_key": parts[1][: -len(".parquet")]} if len(parts) == 2 else {})
        for col, name in want.items():
            if col in t.column_names:
                got = pc.unique(t[col]).to_pylist()
                if got != [name]:
                    shown = ", ".join(map(str, got[:3])) + (", ..." if len(got) > 3 else "")
                    return f"mismatched: holds rows of {col} {shown}, but its path says {name} (copied or renamed?)"
        return None

    def read_file(self, table: str, *parts: str) -> pa.Table | None:
        """One table file (None when missing or unreadable; unreadable ones are noted)."""
        path = self.path(table, *parts)
        data = self.read_bytes(path)
        return None if data is None else self._parse(path, data, SCHEMAS[table])

    def readable(self, table: str, *parts: str) -> bool:
        """False when the file exists but does not parse (a missing file is not damage)."""
        path = self.path(table, *parts)
        data = self.read_bytes(path)
        return data is None or self._parse(path, data, SCHEMAS[table]) is not None

    def run_row(self, run_id: str) -> dict | None:
        """The run's row; None when missing or unreadable (a damaged row is a run not done)."""
        t = self.read_file("runs", f"{run_id}.parquet")
        rows = t.to_pylist() if t is not None else []
        return rows[0] if rows else None

    def eval_keys(self, run_id: str, whole: bool = False) -> set[str]:
        """Eval points of a run whose evals file (and samples file, if any; `whole`: which must be there) parse:
        the points done (`whole`, as Store.summary's eval_keys: what `study run` redoes is every other)."""
        d = f"{self.dir}/evals/{safe_name(run_id)}"
        sel = pafs.FileSelector(d, allow_not_found=True)
        keys = set()
        for i in self.fs.get_file_info(sel):
            if not i.base_name.endswith(".parquet") or not is_safe_name(i.base_name):
                continue
            key = i.base_name[: -len(".parquet")]
            t = self.read_file("evals", run_id, i.base_name)
            if t is None or not t.num_rows:
                continue
            samples = (self.read_file("samples", run_id, i.base_name) is not None) if whole else \
                self.readable("samples", run_id, i.base_name)
            if samples:
                keys.add(key)
        return keys

    def checkpoint_path(self, run_id: str) -> str:
        return self.path("checkpoints", f"{run_id}.pt")

    def weights_path(self, run_id: str) -> str:
        return self.path("weights", f"{run_id}.pt")

    def write_config(self, run_id: str, config: dict) -> None:
        self.write_text(self.path("configs", f"{run_id}.json"), json.dumps(config, indent=2, sort_keys=True, default=str))

    def data_dir(self) -> str:
        """A local directory holding the study's task data (see `task_data`)."""
        if self.local:
            d = self.path("data")
        else:
            # keyed by the whole root (endpoint included): one bucket path on two servers is two stores
            key = hashlib.sha256(f"{self.root}\n{self.dir}".encode()).hexdigest()[:16]
            d = os.path.join(tempfile.gettempdir(), "rmdm-study-data", key)
        os.makedirs(d, exist_ok=True)
        return d

    @contextlib.contextmanager
    def task_data(self):
        """Yield a local directory for `Task.prepare`; on a remote store it mirrors `data/`.

        Files of the store's `data/` missing locally are fetched first; afterwards every local
        file the store lacks is uploaded (written by the task now, or cached by an earlier study
        that a deleted store held), so every node generates a dataset at most once per study.
        """
        d = self.data_dir()
        if self.local:
            yield d
            return
        remote = f"{self.dir}/data"
        stored = set()
        for info in self.fs.get_file_info(pafs.FileSelector(remote, allow_not_found=True)):
            stored.add(info.base_name)
            local = os.path.join(d, info.base_name)
            if info.type == pafs.FileType.File and info.base_name[0] != "." and not os.path.exists(local):
                data = self.read_bytes(info.path)
                if data is not None:
                    atomicio.write_bytes(local, data)
        yield d
        for name in sorted(set(os.listdir(d)) - stored):
            p = os.path.join(d, name)
            if os.path.isfile(p) and is_safe_name(name) and ".part" not in name and ".tmp" not in name:
                with open(p, "rb") as f:
                    self.write_bytes(self.path("data", name), f.read())

    def write_progress(self, run_id: str, info: dict) -> None:
        self.write_text(self.path("progress", f"{run_id}.json"), json.dumps(info, sort_keys=True, default=str))

    def read_progress(self, run_ids: set[str] | None = None) -> dict[str, dict]:
        """run_id -> the latest heartbeat of every run that has trained in this study (of `run_ids` only,
        if given); the files are read in parallel (one round trip each on an object store)."""
        sel = pafs.FileSelector(f"{self.dir}/progress", allow_not_found=True)
        names = {}
        for info in self.fs.get_file_info(sel):
            rid = info.base_name[: -len(".json")]
            if info.base_name.endswith(".json") and info.base_name[0] != "." and (run_ids is None or rid in run_ids):
                names[rid] = info.path

        def one(path: str):
            data = self.read_bytes(path)
            try:
                return json.loads(data) if data else {}
            except ValueError:
                return None

        with ThreadPoolExecutor(index.workers(self)) as pool:
            beats = list(pool.map(one, names.values()))
        return {rid: hb for rid, hb in zip(names, beats) if hb is not None}


class Summary:
    """Per-run verdicts of one pass over a store (Store.summary): the same rules as run_row, eval_keys
    and readable("history", ...), so status and planning agree with the trials' own per-file reads."""

    def __init__(self, runs: dict, evals: dict, bad_samples: set, bad_history: set, samples: set = frozenset(),
                 history: set = frozenset()):
        # samples, history: the files of those tables that parse (what a done run must have: `whole`)
        self._rows: dict[str, dict] = {}
        for name, t in runs.items():  # runs/<run_id>.parquet
            if t.num_rows:
                self._rows[name[: -len(".parquet")]] = t.slice(0, 1).to_pylist()[0]
        self._keys: dict[str, set[str]] = {}
        self._whole: dict[str, set[str]] = {}  # and its samples file present
        for name, t in evals.items():  # evals/<run_id>/<eval_key>.parquet; its samples file, if any, readable
            parts = name.split("/")
            if len(parts) == 2 and is_safe_name(parts[1]) and t.num_rows and name not in bad_samples:
                self._keys.setdefault(parts[0], set()).add(parts[1][: -len(".parquet")])
                if name in samples:
                    self._whole.setdefault(parts[0], set()).add(parts[1][: -len(".parquet")])
        self._bad_history = {n[: -len(".parquet")] for n in bad_history}
        self._history = {n[: -len(".parquet")] for n in history}

    def run_row(self, run_id: str) -> dict | None:
        return self._rows.get(run_id)

    def eval_keys(self, run_id: str, whole: bool = False) -> set[str]:
        return set((self._whole if whole else self._keys).get(run_id, ()))

    def history_readable(self, run_id: str) -> bool:
        return run_id not in self._bad_history

    def has_history(self, run_id: str) -> bool:
        """Its history file is there and parses (what a done run must have)."""
        return run_id in self._history


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


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast a file's table to the current schema; columns added since it was written are null."""
    cols = []
    for f in schema:
        if f.name in t.column_names:
            cols.append(t[f.name].cast(f.type))
        else:
            cols.append(pa.nulls(len(t), f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def list_studies(root: str) -> list[tuple[str, float]]:
    """(study, last modification time) of every study under a local root, newest last."""
    if "://" in root:
        fs, base = filesystem_from_uri(root)
    else:
        fs, base = pafs.LocalFileSystem(), os.path.abspath(root)
    out = []
    for info in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and is_safe_name(info.base_name):
            runs = fs.get_file_info(pafs.FileSelector(f"{info.path}/runs", allow_not_found=True))
            if runs:
                out.append((info.base_name, max(r.mtime.timestamp() for r in runs if r.mtime)))
    return sorted(out, key=lambda x: x[1])
