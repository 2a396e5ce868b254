"""Local files written whole or not at all, the versioned JSON caches kept that way, and user-named
files opened only once they are known to be regular files (`open_regular`).

A write goes to a hidden temp file beside its target (`.<name>.<8 hex>.tmp`: the same directory, so
the final rename is atomic; unique to the write, so concurrent writers of one file never mix their
bytes), then is renamed onto the target; a failed write removes its temp file. A reader, another
trial or another process, sees the old file or the new one, never half of one. The results store
recognises this name as a temp file left by an interrupted write (`store.TEMP`).

Why a package of its own: model/, tasks/, store/ and study/ all write such files, and the layer
rule keeps them apart (model and tasks never import each other; store and stats import no other
package of the project). So the one implementation sits below all of them, imports only the
standard library, and every layer may import it.
"""
from __future__ import annotations

import json
import os
import stat
import uuid
from typing import IO


def temp_name(path: str) -> str:
    """Where a write of `path` goes first: a hidden file beside it, unique to this write."""
    parent, name = os.path.split(path)
    return os.path.join(parent, f".{name}.{uuid.uuid4().hex[:8]}.tmp")


class AtomicFile:
    """An open temp file beside `path`: `commit()` renames it onto `path`, `discard()` removes it.

    As a context manager it commits on a normal exit and discards on an exception. Used directly, it
    lets a caller open the output before any work (so that a bad path fails first) and commit it
    once everything else succeeded."""

    def __init__(self, path: str, mode: str = "wb", encoding: str | None = None):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path, self.tmp = path, temp_name(path)
        self.file: IO = open(self.tmp, mode, encoding=encoding)

    def write(self, data) -> int:
        return self.file.write(data)

    def commit(self) -> None:
        try:
            self.file.close()  # flushes: a full disk fails here, and the temp file goes too
            os.replace(self.tmp, self.path)
        except OSError:
            self.discard()
            raise
        self.tmp = None

    def discard(self) -> None:
        """Remove the temp file (nothing after a commit)."""
        if self.tmp is not None:
            self.file.close()
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass
            self.tmp = None

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()


def write_bytes(path: str, data: bytes) -> None:
    with AtomicFile(path, "wb") as f:
        f.write(data)


def write_text(path: str, text: str) -> None:
    with AtomicFile(path, "w", encoding="utf-8") as f:
        f.write(text)


MAX_JSON = 64 << 20  # bytes: no JSON file of a store or cache is near this


def parse_text(parse, data: bytes | str, max_bytes: int = MAX_JSON):
    """parse(data) (json.loads, yaml.safe_load), but too large, too deeply nested (a RecursionError otherwise
    ends the command) and undecodable input all fail alike, with a ValueError saying which: what a reader of
    a store's file sets aside (where it is derived) or names with the file."""
    if len(data) > max_bytes:
        raise ValueError(f"{len(data):,} bytes, more than the {max_bytes:,} a file here may hold")
    try:
        return parse(data)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None


def loads_json(data: bytes | str, max_bytes: int = MAX_JSON):
    return parse_text(json.loads, data, max_bytes)


def read_versioned_json(path: str, version: int) -> dict:
    """The JSON object at `path` if its "version" is `version`; {} when absent, broken or of another
    version (a cache: measure again and rewrite it)."""
    try:
        with open(path, "rb") as f:
            data = loads_json(f.read())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("version") == version else {}


def open_regular(path: str, what: str, max_bytes: int | None = None, exc: type[Exception] = ValueError):
    """A binary file object of `path` once it is known to be a regular file (of at most `max_bytes`):
    opened without blocking (a FIFO with no writer would wait forever), refused otherwise with `exc`
    naming the file (a directory, a FIFO, a device such as /dev/zero, a socket)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise exc(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise exc(f"{path}: is a directory, not a {what}") from None
    except OSError as e:
        raise exc(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise exc(f"{path}: is a directory, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                    or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
            raise exc(f"{path}: is {kind}, not a regular file: give a {what}")
        if max_bytes is not None and st.st_size > max_bytes:
            raise exc(f"{path}: {st.st_size:,} bytes; a {what} is at most {max_bytes:,} bytes")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
