"""What a study holds in one pass (Store.summary's verdicts per run) and which studies a root holds."""
from __future__ import annotations

import pyarrow.fs as pafs

from store.paths import filesystem_from_uri, is_safe_name


class Summary:
    """Per-run verdicts of one pass over a store (Store.summary): the same rules as run_row, eval_keys
    and readable("history", ...), so status and planning agree with the trials' own per-file reads."""

    def __init__(self, runs: dict, evals: dict, bad_samples: set, bad_history: set, samples: set = frozenset(),
                 history: set = frozenset()):
        # runs: {runs file: its first row} of every readable runs file with a row; evals: {evals file: its
        # row count} of every readable one; samples, history: the files of those tables that parse (what a
        # done run must have: `whole`)
        self._rows = {name[: -len(".parquet")]: row for name, row in runs.items()}  # runs/<run_id>.parquet
        # evals/<run_id>/<eval_key>.parquet with rows, its samples file, if any, readable (whole: present too)
        keys = [name for name, n in evals.items() if n and name not in bad_samples]
        self._keys, self._whole = _by_run(keys), _by_run(n for n in keys if n in samples)
        self._sampled = _by_run(samples, safe=False)  # samples/<run_id>/<eval_key>.parquet that parse
        self._bad_history = {n[: -len(".parquet")] for n in bad_history}
        self._history = {n[: -len(".parquet")] for n in history}

    def run_row(self, run_id: str) -> dict | None:
        return self._rows.get(run_id)

    def eval_keys(self, run_id: str, whole: bool = False) -> set[str]:
        return set((self._whole if whole else self._keys).get(run_id, ()))

    def half_keys(self, run_id: str) -> set[str]:
        """Eval keys of a run held by one file of the pair only (an evals file without its samples, or
        samples without their evals file): a point that is neither whole nor absent."""
        return (self.eval_keys(run_id) | self._sampled.get(run_id, set())) - self.eval_keys(run_id, whole=True)

    def history_readable(self, run_id: str) -> bool:
        return run_id not in self._bad_history

    def has_history(self, run_id: str) -> bool:
        """Its history file is there and parses (what a done run must have)."""
        return run_id in self._history


def _by_run(names, safe: bool = True) -> dict[str, set[str]]:
    """{run_id: {eval_key}} of the files `<run_id>/<eval_key>.parquet` among `names` (`safe`: keys of the
    store's name rule only)."""
    out: dict[str, set[str]] = {}
    for name in names:
        parts = name.split("/")
        if len(parts) == 2 and (not safe or is_safe_name(parts[1])):
            out.setdefault(parts[0], set()).add(parts[1][: -len(".parquet")])
    return out


def list_studies(root: str) -> list[tuple[str, float]]:
    """(study, last modification time) of every study under a local root, newest last."""
    fs, base = filesystem_from_uri(root)
    out = []
    for info in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and is_safe_name(info.base_name):
            runs = fs.get_file_info(pafs.FileSelector(f"{info.path}/runs", allow_not_found=True))
            if runs:
                out.append((info.base_name, max(r.mtime.timestamp() for r in runs if r.mtime)))
    return sorted(out, key=lambda x: x[1])
