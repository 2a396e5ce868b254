"""The store under concurrent use and on non-local filesystems. Run: pytest tests/test_resume_store.py"""
from __future__ import annotations

import os
import shutil
import threading

import pyarrow.fs as pafs

from store import Store


def hist_rows(run_id: str, n: int) -> list[dict]:
    return [{"run_id": run_id, "step": i, "loss": 1.0 / (i + 1), "loop_losses": [1.0] * 3, "L_t": 3, "lr": 1e-3,
             "seconds": float(i), "attempt": 1, "val": None} for i in range(n)]


def test_tables_read_consistently_while_a_writer_replaces_files(tmp_path):
    """A reader (study status) and a writer (a checkpoint rewriting history) at the same time."""
    store = Store(str(tmp_path), "conc")
    store.write_rows("history", hist_rows("b", 5), "b.parquet")
    stop, errors, sizes = threading.Event(), [], []

    def writer():
        n = 1
        while not stop.is_set():
            store.write_rows("history", hist_rows("a", n), "a.parquet")  # grows: a new size every time
            n = n % 400 + 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(150):
            try:
                h = store.read("history")
            except Exception as e:  # a half-read or stale-size file would raise here
                errors.append(repr(e))
                continue
            a = h[h.run_id == "a"]
            # each file is one consistent version: steps 0..n-1, once each
            assert sorted(a.step) == list(range(len(a))) and (h.run_id == "b").sum() == 5
            sizes.append(len(a))
    finally:
        stop.set()
        t.join()
    assert not errors, errors[:3]
    assert len(set(sizes)) > 10  # the reader did see the file change under it
    assert not [f for f in os.listdir(store.path("history")) if f.startswith(".")]  # no temp files left


def test_remote_store_mirrors_task_data_and_appends_logs(tmp_path):
    """Everything through pyarrow.fs: a URI store; task data cached locally per node, mirrored to the store."""
    store = Store(f"file://{tmp_path}/bucket", "remote")
    store.local = False  # take the object-store path (no shared disk) on a real filesystem
    local = store.data_dir()
    assert not local.startswith(str(tmp_path))  # a node-local cache, not inside the store
    shutil.rmtree(local, ignore_errors=True)
    with store.task_data() as d:
        with open(os.path.join(d, "sudoku4-abc.npz"), "wb") as f:
            f.write(b"dataset bytes")
    assert store.read_bytes(store.path("data", "sudoku4-abc.npz")) == b"dataset bytes"
    # another node: an empty local cache gets the dataset from the store instead of generating it
    shutil.rmtree(local)
    with store.task_data() as d:
        with open(os.path.join(d, "sudoku4-abc.npz"), "rb") as f:
            assert f.read() == b"dataset bytes"
    shutil.rmtree(local)

    store.append_log("r1", "line one")
    store.append_log("r1", "line two\n")
    assert store.read_bytes(store.path("logs", "r1.log")) == b"line one\nline two\n"
    store.write_rows("history", hist_rows("r1", 3), "r1.parquet")
    assert len(store.read("history", "r1")) == 3 and store.read("history", "zz").empty
    info = store.fs.get_file_info(store.path("history", "r1.parquet"))
    assert info.type == pafs.FileType.File and info.path.startswith(f"{tmp_path}/bucket/remote/")
