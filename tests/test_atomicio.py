"""atomicio: a local file is replaced whole or not at all, and a failed write leaves nothing behind.

Run: pytest tests/test_atomicio.py -q   (no training; well under a second)
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import atomicio
from store import TEMP
from tasks.base import save_npz


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = str(tmp_path / "sub" / "f.txt")
    atomicio.write_text(path, "old")
    with pytest.raises(RuntimeError):
        with atomicio.AtomicFile(path, "w", encoding="utf-8") as f:
            f.write("half of the new")
            raise RuntimeError("killed mid-write")
    assert open(path).read() == "old"
    assert os.listdir(tmp_path / "sub") == ["f.txt"]


def test_discard_before_commit_and_commit_once(tmp_path):
    path = str(tmp_path / "out.txt")
    f = atomicio.AtomicFile(path, "w", encoding="utf-8")  # opened before any work, as `study eval --out`
    f.write("x")
    assert not os.path.exists(path)  # nothing under the name until the commit
    f.commit()
    f.discard()  # after a commit: nothing to remove
    assert open(path).read() == "x" and os.listdir(tmp_path) == ["out.txt"]


def test_temp_names_are_the_stores_and_unique_per_write(tmp_path):
    names = {os.path.basename(atomicio.temp_name(str(tmp_path / "a.npz"))) for _ in range(100)}
    assert len(names) == 100 and all(TEMP.fullmatch(n) and n.startswith(".a.npz.") for n in names)


def test_concurrent_writers_of_one_file_never_mix(tmp_path):
    path = str(tmp_path / "d.npz")
    big = {f"k{i}": np.full(50_000, i) for i in range(4)}

    def write(i):
        save_npz(path, **{k: v + i for k, v in big.items()})

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with np.load(path) as z:  # one writer's arrays, whole
        first = int(z["k0"][0])
        assert all((z[k] == v + first).all() for k, v in big.items())
    assert os.listdir(tmp_path) == ["d.npz"]


def test_versioned_json_cache(tmp_path):
    path = str(tmp_path / "c.json")
    assert atomicio.read_versioned_json(path, 2) == {}
    atomicio.write_text(path, '{"version": 2, "x": 1}')
    assert atomicio.read_versioned_json(path, 2) == {"version": 2, "x": 1}
    assert atomicio.read_versioned_json(path, 3) == {}  # another version: measured again
    atomicio.write_text(path, "{not json")
    assert atomicio.read_versioned_json(path, 2) == {}
