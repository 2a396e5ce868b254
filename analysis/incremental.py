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
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from importlib import metadata

import pandas as pd

import tasks
from analysis.derived import Derived
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
