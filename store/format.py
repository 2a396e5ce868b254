"""The store's format version: `<study>/FORMAT`, one line holding an integer.

Every study directory the store writes holds it (written with the study's first file). A study that holds
data (runs, evals, configs, grids ...) but no FORMAT was written by the code before the version was
recorded: version 0. A store whose version is not `VERSION` is refused by every command that reads or
writes it, in one line naming the version found, the version expected and the command that brings it to
the current format (`study migrate`, study/commands/migrate.py), which then stamps `VERSION` here.

Versions:
    0   no FORMAT file (the code up to round 4): runs rows may lack their digests, evals rows their
        forward_passes_mean
    1   FORMAT recorded; every done run's row holds its digests (store/digest.py); forward_passes_mean
        null only where the samples hold no per-example cost (unknown)
    2   every evals row names its evaluation kind (`kind`: study/engine/kinds)
    3   every evals row holds its point's digest and the weights' (point_sha256, weights_sha256: store/digest.py;
        weights_sha256 null only where the weights were not there to hash); every table file holds exactly the
        columns of its schema (store/schemas.py)
"""
from __future__ import annotations

import pyarrow.fs as pafs

VERSION = 3
FILE = "FORMAT"
# what a study directory holds once anything of the study was written (lease/ and data/ alone are not data)
DATA = ("runs", "evals", "history", "samples", "configs", "weights", "checkpoints", "grids", "grid.yaml")


class FormatMismatch(ValueError):
    """The store is of another format version than this code's: one line, exit 2."""


def path(store) -> str:
    return f"{store.dir}/{FILE}"


def found(store) -> int | None:
    """The study's format version: its FORMAT file's, 0 when it holds data but no FORMAT, None when it
    holds no data yet (a new study: stamped with its first file). A FORMAT that is no integer reads -1."""
    try:
        with store.fs.open_input_stream(path(store)) as f:
            raw = f.read()
    except OSError:
        raw = None
    if raw is not None:
        try:
            return int(raw.decode().strip())
        except ValueError:
            return -1
    names = {i.base_name for i in store.fs.get_file_info(pafs.FileSelector(store.dir, allow_not_found=True))}
    return 0 if names & set(DATA) else None


def message(store, version: int) -> str:
    results = "" if store.root in ("results", "./results") else f" --results {store.root}"
    what = "none recorded (version 0)" if version == 0 else (
        "unreadable" if version < 0 else f"version {version}")
    return (f"store {store.dir} is of format {what}; this code reads and writes format version {VERSION}: "
            f"run `study migrate --study {store.study}{results}` first")


def check(store) -> bool:
    """Raise FormatMismatch unless the study is of VERSION; True when it is new (to be stamped)."""
    v = found(store)
    if v is None:
        return True
    if v != VERSION:
        raise FormatMismatch(message(store, v))
    return False


def stamp_bytes() -> bytes:
    return f"{VERSION}\n".encode()
