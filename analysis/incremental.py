"""A report that redraws only what changed: each figure's key, and the manifest of what the last report wrote.

A figure's key is a sha256 of everything its files are made from:
- its name, the study's name (in every title) and every report option (analysis.plotting.Options: all of
  them, not only those the figure reads, so a changed --threshold redraws every figure);
- the code: the figure module's own source, and the source of every other module of analysis/ (the
  shared plotting, tables and derived code; not the other figure modules), stats/ and tasks/ (metric
  labels), with the versions of matplotlib, numpy and pandas (a changed library redraws all);
- the rows it reads: a digest (pandas.util.hash_pandas_object, in row order) of each input the figure
  module declares in READS (INPUTS below: the aggregated evaluations, or only their likelihood tasks' rows,
  the runs, the evaluations, the history, the continuous quantities, the Optuna storage's bytes); a module
  without READS reads all of them. The key is per table, not per panel: a new seed of one model changes
  the aggregated rows, so every figure that reads them is redrawn, including its panels without that
  model; figures that read other tables (tuning, or text8's likelihood rows after a Sudoku run) are not.
  The samples some figures read (effective parameters) are named by the evaluations rows (eval_key,
  n_examples, created_at), which are in the key; a samples file rewritten under an unchanged evals row
  is not seen.

The manifest (`.manifest.json` in the figures folder) maps each figure drawn to its key and the files it
wrote (relative to the folder) with their sha256. A report redraws a figure whose key changed, that the
manifest lacks, or one of whose files is missing or differs from its recorded sha256; it copies the
other figures' files unchanged (analysis/render.py). A figure not drawn (MissingData) is recorded apart
(`not_drawn`: its key, why it was not drawn and the study's folder, which a message may name): while its
key and the study's folder are those recorded, a report says the recorded why again without calling the
figure (the key covers everything the figure reads, so it would raise the same); otherwise, or with
--redraw, the figure is tried again.

Some figures compute derived tables the report's tables read again (analysis/derived.py: the threshold
crossings of pareto, the effective parameters of effective-params, even when it then raises MissingData).
Those of a figure called are written beside the manifest as Parquet (`.derived.<figure>.<table>.parquet`,
recorded in its entry, or its not_drawn entry, with their sha256) when each reads back exactly equal to the
table computed, dtypes included (else none is kept); when the figure is reused or its message said again,
they are read back for the report instead of computed again (they come from the rows, options and code its
key covers). A file missing or changed is not read: the report computes the tables and keeps them again.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from importlib import metadata

import pandas as pd

import tasks
from analysis.derived import Computed, Derived
from analysis.effective import Effective
from analysis.load import StudyData

MANIFEST = ".manifest.json"
VERSION = 1  # of the key's recipe and the manifest's layout: a change redraws everything (the not_drawn section,
# added later, is optional both ways: a manifest without it tries every figure it lacks; code that predates it
# ignores it)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE_PACKAGES = ("analysis", "stats", "tasks")  # the code a figure's files depend on, besides its own module
LIBRARIES = ("matplotlib", "numpy", "pandas")  # seaborn is not drawn with (analysis/theme.py)


def _split_of(df: pd.DataFrame | None, split: str) -> pd.DataFrame | None:
    return df[df["split"] == split] if df is not None and "split" in df else df


def _likelihood_rows(data: StudyData, derived: Derived, split: str):
    agg = _split_of(derived.aggregated(), split)
    return agg[agg["task"].map(tasks.is_likelihood).astype(bool)] if len(agg) else agg


def _storage_bytes(data: StudyData, derived: Derived, split: str):
    from analysis.tuning import find_storage

    path = find_storage(data.dir)
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


# what a figure may read, each a function of (study, derived tables, split): a DataFrame, bytes or None
INPUTS = {
    "aggregated": lambda data, derived, split: _split_of(derived.aggregated(), split),
    "likelihood": _likelihood_rows,  # the aggregated rows of tasks evaluated by their likelihood (text8)
    "runs": lambda data, derived, split: data.runs,
    "evals": lambda data, derived, split: data.evals,
    "history": lambda data, derived, split: data.history,
    "continuous": lambda data, derived, split: data.continuous,
    "searches": _storage_bytes,  # the Optuna storage `study tune` wrote into the study's folder
}


def frame_digest(df) -> str:
    """sha256 of a table's columns, dtypes and rows in order (bytes: of the bytes; None: 'none')."""
    h = hashlib.sha256()
    if df is None or isinstance(df, bytes):
        h.update(b"none" if df is None else b"bytes:" + df)
        return h.hexdigest()
    h.update(repr((list(map(str, df.columns)), [str(t) for t in df.dtypes], len(df))).encode())
    for c in df.columns:
        col = df[c]
        try:
            hashed = pd.util.hash_pandas_object(col, index=False)
        except (TypeError, ValueError):  # lists (history's loop_losses), dicts: hashed by their full text
            hashed = pd.util.hash_pandas_object(col.map(lambda v: repr(v.tolist() if hasattr(v, "tolist") else v)),
                                                index=False)
        h.update(hashed.to_numpy().tobytes())
    return h.hexdigest()


def _file_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sources(package: str, skip: str | None) -> list[tuple[str, str]]:
    out = []
    for where, dirs, files in os.walk(os.path.join(ROOT, package)):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for f in sorted(files):
            p = os.path.join(where, f)
            if f.endswith(".py") and p != skip:
                out.append((os.path.relpath(p, ROOT), _file_sha(p)))
    return out


class Keys:
    """The keys of one study's figures under one set of options; each input and the shared code digested once."""

    def __init__(self, data: StudyData, derived: Derived, opts):
        self.data, self.derived, self.opts = data, derived, opts
        self._inputs: dict[str, str] = {}
        self._shared: str | None = None

    def _input(self, name: str) -> str:
        if name not in self._inputs:
            self._inputs[name] = frame_digest(INPUTS[name](self.data, self.derived, self.opts.split))
        return self._inputs[name]

    def _code(self, path: str) -> list:
        if self._shared is None:
            figures = os.path.join(ROOT, "analysis", "figures")
            shared = [s for p in CODE_PACKAGES for s in _sources(p, None)
                      if not (s[0].startswith(os.path.relpath(figures, ROOT) + os.sep)
                              and not s[0].endswith("__init__.py"))]
            versions = [(lib, _version(lib)) for lib in LIBRARIES]
            self._shared = hashlib.sha256(json.dumps([shared, versions]).encode()).hexdigest()
        return [self._shared, _file_sha(path)]

    def key(self, name: str) -> str:
        from analysis.catalog import figures

        info = figures()[name]  # from the module's source: matplotlib is not imported for a key
        reads = info.reads if info.reads is not None else tuple(INPUTS)
        parts = {"version": VERSION, "figure": name, "study": self.data.name,
                 "options": json.dumps(dataclasses.asdict(self.opts), sort_keys=True, default=str),
                 "code": self._code(info.path), "rows": {r: self._input(r) for r in sorted(reads)}}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _version(lib: str) -> str:
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return "absent"


def _read(out_dir: str) -> dict:
    try:
        with open(os.path.join(out_dir, MANIFEST), encoding="utf-8") as f:
            got = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(got, dict) or got.get("version") != VERSION or not isinstance(got.get("figures"), dict):
        return {}
    return got


def read_manifest(out_dir: str) -> dict:
    """{figure: {"key": ..., "files": [[path relative to out_dir, sha256], ...]}}; {} when none or unreadable."""
    return _read(out_dir).get("figures", {})


def read_not_drawn(out_dir: str) -> dict:
    """{figure: {"key": ..., "why": its MissingData message, "study_dir": ...}} of the figures the last report
    could not draw; {} when none or unreadable (a manifest written before they were recorded has none)."""
    got = _read(out_dir).get("not_drawn", {})
    return got if isinstance(got, dict) else {}


def not_drawn_again(entry, key: str, study_dir: str) -> str | None:
    """The recorded MissingData message of a figure, when its entry holds it for this key and study folder."""
    if isinstance(entry, dict) and entry.get("key") == key and entry.get("study_dir") == study_dir \
            and isinstance(entry.get("why"), str):
        return entry["why"]
    return None


def intact(out_dir: str, entry: dict) -> bool:
    """Whether every file the manifest lists for a figure is in out_dir with its recorded sha256."""
    try:
        return bool(entry["files"]) and all(
            _inside(rel) and os.path.isfile(os.path.join(out_dir, rel)) and _file_sha(os.path.join(out_dir, rel)) == sha
            for rel, sha in entry["files"])
    except (KeyError, TypeError, ValueError, OSError):
        return False


def _inside(rel: str) -> bool:
    """A path the manifest may name: relative, below the folder (a hand-edited '../x' is never read or copied)."""
    return isinstance(rel, str) and not os.path.isabs(rel) and os.path.normpath(rel) == rel and \
        rel.split(os.sep)[0] != ".."


def entry(key: str, paths: list[str], base: str) -> dict:
    """A manifest entry: the key and each written file (relative to `base`) with its sha256, in order."""
    return {"key": key, "files": [[os.path.relpath(p, base), _file_sha(p)] for p in paths]}


def write_manifest(out_dir: str, figures: dict, not_drawn: dict | None = None) -> str:
    path = os.path.join(out_dir, MANIFEST)
    got = {"version": VERSION, "figures": dict(sorted(figures.items()))}
    if not_drawn:
        got["not_drawn"] = dict(sorted(not_drawn.items()))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(got, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


# the derived tables a figure computes that the report's tables read again, kept under the figure's key
KEPT = {"pareto": "crossings", "effective-params": "effective"}
KEPT_PREFIX = ".derived."


def _kept_frames(computed: Computed, what: str, opts) -> tuple[dict[str, pd.DataFrame], list[str]] | None:
    """(the frames of `what` as computed under `opts`, by name; its notes), or None when it was not computed
    or is a MissingData."""
    if what == "crossings":
        got = computed.crossings.get((opts.threshold, opts.pareto_x, opts.split))
        return ({"crossings": got}, []) if isinstance(got, pd.DataFrame) else None
    got = computed.effective.get(opts.split)
    if isinstance(got, Effective):
        return {"table": got.table, "curves": got.curves, "beta": got.beta}, list(got.skipped)
    return None


def keep_derived(out_dir: str, figure: str, key: str, computed: Computed, opts) -> dict | None:
    """Write the derived tables `figure` (of this key) computed (KEPT) into out_dir as Parquet: the manifest's
    record of them, or None when there are none or one does not read back exactly as computed (none is kept)."""
    from pandas.testing import assert_frame_equal

    got = _kept_frames(computed, KEPT[figure], opts)
    if got is None:
        return None
    frames, notes = got
    files = []
    for part, df in frames.items():
        rel = f"{KEPT_PREFIX}{figure}.{part}.parquet"
        path = os.path.join(out_dir, rel)
        files.append(rel)
        try:
            df.to_parquet(path)
            assert_frame_equal(pd.read_parquet(path), df, check_exact=True)
        except (AssertionError, ValueError, TypeError, ImportError, OSError):  # a type Parquet does not keep
            for r in files:
                if os.path.exists(os.path.join(out_dir, r)):
                    os.remove(os.path.join(out_dir, r))
            return None
    return {"what": KEPT[figure], "key": key, "files": [[r, _file_sha(os.path.join(out_dir, r))] for r in files],
            "notes": notes}


def load_derived(out_dir: str, figure: str, key: str, record, computed: Computed, opts) -> bool:
    """Put the derived tables a reused figure's manifest entry records (keep_derived) into `computed`; False,
    reading nothing into it, when the record is not one of this key or a file is missing or differs from its
    sha256."""
    what = KEPT.get(figure)
    try:
        if what is None or not isinstance(record, dict) or record.get("what") != what or record.get("key") != key or \
                not intact(out_dir, record) or not all(isinstance(n, str) for n in record["notes"]):
            return False
        head = f"{KEPT_PREFIX}{figure}."
        if not all(rel.startswith(head) and rel.endswith(".parquet") for rel, _ in record["files"]):
            return False
        frames = {rel[len(head):-len(".parquet")]: pd.read_parquet(os.path.join(out_dir, rel))
                  for rel, _ in record["files"]}
        notes = list(record["notes"])
    except (KeyError, TypeError, ValueError, OSError):
        return False
    if what == "crossings" and set(frames) == {"crossings"}:
        computed.crossings.setdefault((opts.threshold, opts.pareto_x, opts.split), frames["crossings"])
    elif what == "effective" and set(frames) == {"table", "curves", "beta"}:
        computed.effective.setdefault(opts.split, Effective(frames["table"], frames["curves"], frames["beta"], notes))
    else:
        return False
    return True
