"""Names and places in a store: the one name rule, temp and quarantine names, the filesystem of a root, and
the errors of a write that cannot go where it should (a full disk, a symlink out of the study)."""
from __future__ import annotations

import errno
import os
import re
import shutil

import pyarrow.fs as pafs

# The one name rule of the store (study names, run ids, eval keys, file names): matched whole
# (`fullmatch`: `$` would let a trailing newline through), no '..' anywhere.
SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
NAME_RULE = "1-200 letters, digits, '_', '-', '.', starting with a letter or digit, no '..'"
QUARANTINE = "quarantine"  # <study>/quarantine/<where it was>.<UTC time>: damaged files set aside, never deleted
# temp files of a write that never finished (a killed process, a full disk): atomicio's `.<name>.<8 hex>.tmp`
# (Store.write_bytes names its temp files the same way; `study migrate` clears format 0's other names)
TEMP = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")
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


def is_enospc(e: BaseException) -> bool:
    return getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)


def free_space(path: str) -> str:
    """Free space of the local filesystem holding `path` (or its nearest existing parent), in words."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        u = shutil.disk_usage(path or "/")
    except OSError:
        return "free space unknown"
    return f"{human_bytes(u.free)} free of {human_bytes(u.total)}"


def first_link(top: str, path: str) -> str | None:
    """The first component of `path` below `top` that is a symlink (None if none)."""
    rel = os.path.relpath(path, top)
    cur = top
    for part in rel.split(os.sep):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            return cur
    return None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


GCS_RETRY_S = 10  # a gs:// store unreachable (no network, no credentials) fails within this, as s3:// does


def filesystem_from_uri(uri: str):
    """pyarrow's (filesystem, path) of `uri`, a local path or any pyarrow URI. A gs:// (gcs://) URI gets
    `retry_limit_seconds` (unless it gives its own): the Google client otherwise retries for about 15
    minutes, where S3's gives up in seconds."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    scheme = uri.split("://", 1)[0].lower()
    if scheme in ("gs", "gcs") and "retry_limit_seconds=" not in uri:
        uri = f"{uri}{'&' if '?' in uri else '?'}retry_limit_seconds={GCS_RETRY_S}"
    return pafs.FileSystem.from_uri(uri)

