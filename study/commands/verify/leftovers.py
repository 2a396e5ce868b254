"""What interrupted writes and damage leave behind."""
from __future__ import annotations

import os

import pyarrow.fs as pafs

from study.commands.verify.context import Context


def check_leftovers(c: Context) -> None:
    """Temp files of writes that never finished, cached task data that does not load, files that exist but
    cannot be read (a directory or a dangling link in a file's place); files set aside in quarantine/ are
    noted (kept, never deleted)."""
    import time

    from store import QUARANTINE, TEMP_AGE_S
    from study.engine.rows import damaged_data

    store, v = c.store, c.v

    for info in store.temp_files(0.0):
        old = info.mtime is None or info.mtime.timestamp() < time.time() - TEMP_AGE_S
        (v.problems if old else v.notes).append(
            f"left-over temp file {info.path} ({info.size} bytes" + ("): an interrupted write; `study run` removes it"
                                                                   if old else ", being written now?)"))
    if store.local and os.path.isdir(store.path("data")):
        for path, why in damaged_data(store.path("data")):
            v.problems.append(f"damaged cached task data {path} ({why}): `study run` sets it aside and makes it anew")
    aside = [i for i in store.fs.get_file_info(pafs.FileSelector(f"{store.dir}/{QUARANTINE}", recursive=True,
                                                                 allow_not_found=True))
             if i.type == pafs.FileType.File]
    if aside:
        v.notes.append(f"{len(aside)} damaged file(s) set aside in {store.dir}/{QUARANTINE}/ (kept for inspection)")
    for path, why in sorted(store.unreadable.items()):  # read but not parsed by the checks above
        if not any(path in p for p in v.problems):
            v.problems.append(f"unreadable file {path}: {why}")
