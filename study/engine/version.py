"""What a driver records of the code and the grid it runs: the code version of every runs row, and the
grid file kept by hash in the study's store."""
from __future__ import annotations

import os
import subprocess

from store import Store
from study.spec.grid import Grid


def code_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("rmdm-study")
    except PackageNotFoundError:
        v = "0+unknown"
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", ""
    return f"{v}+g{sha}{'.dirty' if dirty else ''}" if sha else v


def record_grid_file(store: Store, grid: Grid, command: str) -> str:
    """Keep the grid a `command` (run, tune) runs, by hash and logged with the time (store/provenance.py), and
    as the study's grid.yaml (replaced after). Returns its hash."""
    from store.provenance import record_grid
    from study.spec.overrides import grid_text

    text = grid_text(grid)  # after any command-line overrides, which it names in a comment header
    grid_sha = record_grid(store, text, command, grid.path)
    store.write_text(store.path("grid.yaml"), text)
    return grid_sha
