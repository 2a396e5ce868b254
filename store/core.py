"""The Store: one study's directory in a results root, every read and write of it (see store/__init__.py for
the layout and the guarantees)."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import tempfile
import time

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import atomicio
from store import digest, index
from store import format as store_format
from store.paths import (QUARANTINE, TEMP, TEMP_AGE_S, DiskFull, OutsideStore, filesystem_from_uri, first_link,
                         free_space, human_bytes, is_enospc, is_safe_name, safe_name)
from store.schemas import EVALS, HISTORY, RUNS, SAMPLES, SCHEMAS, check_row, row_dict, schema_name
from store.summary import Summary


class Store:
    """One study's directory in a results root (local path or URI)."""

    def __init__(self, root: str, study: str, check_format: bool = True):
        """`check_format`: refuse (store.format.FormatMismatch, one line) a study of another format version
        than this code's; only `study migrate` opens one without."""
        self.root = root
        self.study = safe_name(study, "study name")
        self.fs, base = filesystem_from_uri(root)
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
            if is_enospc(e):
                raise self.disk_full(path, len(data)) from None
            raise

    def disk_full(self, path: str, n: int | None = None) -> DiskFull:
        """The one-line error of a write to `path` (of `n` bytes, whose partial file was removed) on a full disk."""
        where = free_space(path) if self.local else "an object store"
        what = f" ({human_bytes(n)}; the partial file was removed)" if n is not None else ""
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
                link = first_link(self.dir, p) or p
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
        for d, dirs, files in os.walk(self.dir):  # links are listed, never followed
            for name in dirs + files:
                p = os.path.join(d, name)
                real = os.path.realpath(p) if os.path.islink(p) else top
                if real != top and not real.startswith(top + os.sep):
                    out.append(f"{p} is a symlink to {real}, outside the store: no command of the study "
                               f"reads or writes through it; replace it by a "
                               f"{'directory' if os.path.isdir(p) else 'file'}"
                               f" of the store (move what it points at in, or remove the link)")
            dirs[:] = [x for x in dirs if x != ".ray"]  # Tune's own files
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
                    why = e.strerror or str(e).strip().splitlines()[0][:160]
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

    def temp_files(self, min_age_s: float = TEMP_AGE_S, names=TEMP) -> list[pafs.FileInfo]:
        """Temp files of writes that never finished (named as `names` matches), untouched for `min_age_s`
        (anywhere in the study but quarantine/ and Tune's .ray/)."""
        cutoff = time.time() - min_age_s
        out = []
        for info in self.fs.get_file_info(pafs.FileSelector(self.dir, recursive=True, allow_not_found=True)):
            rel = info.path[len(self.dir) + 1:]
            if (info.type == pafs.FileType.File and names.fullmatch(info.base_name)
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
            if is_enospc(e):
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
        t = pa.Table.from_pylist([check_row(table, r if isinstance(r, dict) else row_dict(r)) for r in rows],
                                 schema=schema)
        if table == "runs":  # each row's digest of its own fields, as a reader will read them
            t = t.set_column(schema.get_field_index("row_sha256"), "row_sha256",
                             pa.array([digest.row_sha256(r) for r in t.to_pylist()], pa.string()))
        elif table == "evals":  # the digest of the point's rows (the whole file), held by each of them
            t = t.set_column(schema.get_field_index("point_sha256"), "point_sha256",
                             pa.array([digest.point_sha256(t.to_pylist())] * t.num_rows, pa.string()))
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
        if filter_run is None and table in index.ROWS_TABLES:
            return index.scan(self, table, schema, whole=True)[2].to_pandas()
        if filter_run is None:
            infos = index.list_files(self, table)
        else:  # evals/<run_id>/*.parquet, or runs/<run_id>.parquet in the flat tables
            d = f"{self.dir}/{table}/{safe_name(filter_run)}"
            infos = self.fs.get_file_info(pafs.FileSelector(d, recursive=True, allow_not_found=True))
            infos = infos or [self.fs.get_file_info(f"{d}.parquet")]
            infos = sorted((i for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                            and i.base_name[0] not in "._"), key=lambda i: i.path)

        def one(info):  # None: unreadable, or deleted since listed
            data = self.read_bytes(info.path)
            return None if data is None else self.parse_checked(info.path, data, schema)

        tables = [t for t in index.read_map(self, one, infos) if t is not None]
        # one chunk per column, not one per file: pandas keeps Arrow strings chunked, and every
        # groupby, merge or filter on a 40,000-chunk column pays per chunk
        t = pa.concat_tables(tables).combine_chunks() if tables else schema.empty_table()
        return (t if filter_run is None else t.filter(pc.equal(t["run_id"], filter_run))).to_pandas()

    def summary(self, histories: bool = False) -> "Summary":
        """What `study status` and a resume's planning need of every run, in one pass over the store.

        The same verdicts as run_row / eval_keys / readable("history", ...) per run, from one listing
        and one index per table instead of a few reads per run and point (see store/index.py). `histories`
        (a rerun's planning): a history whose rows are not those its runs row recorded is unreadable too."""
        _, _, runs = index.scan(self, "runs", RUNS, first=True)
        _, evals, _ = index.scan(self, "evals", EVALS)
        sample_files, samples, _ = index.scan(self, "samples", SAMPLES)
        hist_files, hist, *_ = index.scan(self, "history", HISTORY) if not histories else \
            self.read_history({n[: -len(".parquet")]: r.get("history_sha256") for n, r in runs.items()})

        def unreadable(files, table, ok):  # listed, not parsed: damaged (or deleted since the listing)
            prefix = f"{self.dir}/{table}/"
            return {i.path[len(prefix):] for i in files} - set(ok)

        return Summary(runs, evals, unreadable(sample_files, "samples", samples),
                       unreadable(hist_files, "history", hist), set(samples), set(hist))

    def read_history(self, recorded: dict) -> tuple[list, dict, pa.Table, set]:
        """(files listed, {file: rows}, rows, runs left out) of the history table without the runs whose rows
        are not those their runs row recorded (`recorded`: run_id -> field history_sha256), each named in
        `unreadable`. A read index holding such rows is read again from the files first (the files are the
        truth)."""
        got = index.scan(self, "history", HISTORY, whole=True)
        if digest.edited_histories(recorded, got[2]):
            self.delete(f"{self.dir}/{index.INDEX_DIR}/history.parquet")
            got = index.scan(self, "history", HISTORY, whole=True)
        files, counts, t = got
        edited = digest.edited_histories(recorded, t)
        for rid in edited:
            self.unreadable[self.path("history", f"{rid}.parquet")] = "edited: not the rows its runs row recorded"
            counts.pop(f"{rid}.parquet", None)
        if edited:
            t = t.filter(pc.invert(pc.is_in(t["run_id"], pa.array(sorted(edited), pa.string()))))
        return files, counts, t, edited

    # ---- run-level helpers -----------------------------------------------------------------
    def _parse(self, path: str, data: bytes, schema: pa.Schema) -> pa.Table | None:
        """A file's table in `schema`, or None (and the file noted in `unreadable`) if it does not parse."""
        try:
            # ParquetFile.read, not read_table: no dataset machinery per small file (~5x faster)
            t = self._conform(pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
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

    @staticmethod
    def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
        """`t` in `schema` when its columns are the schema's (this format's; only `study migrate` reads others)."""
        if t.column_names != schema.names:
            odd = ", ".join(sorted(set(t.column_names) ^ set(schema.names))) or "their order"
            raise ValueError(f"its columns are not those of this store format ({odd} differ)")
        return t.cast(schema)

    def parse_checked(self, path: str, data: bytes, schema: pa.Schema) -> pa.Table | None:
        """_parse, and a runs or evals file whose rows are not those written (store.digest.edited_rows) unreadable
        too: what every reader sees (`study verify` parses with _parse, and says which field changed)."""
        t = self._parse(path, data, schema)
        why = self._edited(t, schema) if t is not None else None
        if why:
            self.unreadable[path] = why
            return None
        return t

    def _edited(self, t: pa.Table, schema: pa.Schema) -> str | None:
        return digest.edited_rows(t) if schema is RUNS or schema is EVALS else None

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
            got = pc.unique(t[col]).to_pylist()
            if got != [name]:
                shown = ", ".join(map(str, got[:3])) + (", ..." if len(got) > 3 else "")
                return f"mismatched: holds rows of {col} {shown}, but its path says {name} (copied or renamed?)"
        return None

    def read_file(self, table: str, *parts: str) -> pa.Table | None:
        """One table file (None when missing or unreadable; unreadable ones are noted)."""
        path = self.path(table, *parts)
        data = self.read_bytes(path)
        return None if data is None else self.parse_checked(path, data, SCHEMAS[table])

    def readable(self, table: str, *parts: str) -> bool:
        """False when the file exists but does not parse (a missing file is not damage)."""
        path = self.path(table, *parts)
        data = self.read_bytes(path)
        return data is None or self.parse_checked(path, data, SCHEMAS[table]) is not None

    def run_row(self, run_id: str) -> dict | None:
        """The run's row; None when missing or unreadable (a damaged row is a run not done)."""
        t = self.read_file("runs", f"{run_id}.parquet")
        rows = t.to_pylist() if t is not None else []
        return rows[0] if rows else None

    def eval_keys(self, run_id: str, whole: bool = False, weights: str | None = None) -> set[str]:
        """Eval points of a run whose evals file (and samples file, if any; `whole`: which must be there) parse:
        the points done (`whole`, as Store.summary's eval_keys: what `study run` redoes is every other).
        `weights`: the digest of the run's final weights; a point whose rows record other weights (scored
        before a retraining, or another run's) is not done."""
        d = f"{self.dir}/evals/{safe_name(run_id)}"
        sel = pafs.FileSelector(d, allow_not_found=True)
        keys = set()
        for i in self.fs.get_file_info(sel):
            if not i.base_name.endswith(".parquet") or not is_safe_name(i.base_name):
                continue
            key = i.base_name[: -len(".parquet")]
            t = self.read_file("evals", run_id, i.base_name)
            if t is None or not t.num_rows or (weights and set(t["weights_sha256"].to_pylist()) - {None, weights}):
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
                return atomicio.loads_json(data) if data else {}
            except ValueError:
                return None

        beats = index.read_map(self, one, names.values())
        return {rid: hb for rid, hb in zip(names, beats) if hb is not None}

