"""Provenance: every grid the study recorded, each file's hash checked, and the eval points they owe."""
from __future__ import annotations

import pyarrow.fs as pafs
import yaml

from atomicio import parse_text
from store import provenance
from study.commands.verify.context import Context, Verdict
from study.spec.grid import GridError, expand


def check_grids(c: Context) -> None:
    """Every grid the study recorded (grids/log.jsonl), each file's hash checked (a study from before the
    record has its grid.yaml adopted as the first entry by `study migrate`)."""
    store, v, runs = c.store, c.v, c.runs
    entries, bad = provenance.read_log(store)
    v.problems += bad
    out, seen = c.grids, set()
    if not entries and not bad:
        _check_log_kept(c)
        return
    for e in entries:
        sha = e["grid"]
        if sha in seen:
            continue
        seen.add(sha)
        path = store.path(provenance.GRIDS, f"{sha}.yaml") if provenance._safe(sha) else None
        raw = store.read_bytes(path) if path else None
        if raw is None:
            v.problems.append(f"{store.path(provenance.GRIDS, provenance.LOG)}: grid {sha!r} ran (at {e.get('time')}) "
                              f"but its file grids/{sha}.yaml is missing: the points it owes are unknown")
            continue
        v.add("grids")
        got = provenance.grid_sha(raw.decode(errors="replace"))
        if got != sha:
            v.problems.append(f"{path}: its content hashes to {got}, not to its name {sha}: the grid record was edited")
            continue
        out.append((sha, path, _expand(v, raw, path)))  # its runs: None when not expanded (or a search)
    last = store.read_bytes(store.path("grid.yaml"))
    if entries and last is not None and provenance.grid_sha(last.decode(errors="replace")) != entries[-1]["grid"]:
        v.problems.append(f"{store.path('grid.yaml')}: not the last grid recorded in grids/log.jsonl "
                          f"({entries[-1]['grid']}): one of the two was edited")
    shas = {g[0] for g in out}
    for rid, row in sorted(runs.items()):
        g = row.get("grid")
        if g is not None and entries and g not in seen:
            v.problems.append(f"{store.path('runs', rid + '.parquet')}: field grid is {g!r}, no grid the study "
                              f"recorded ({', '.join(sorted(shas)) or 'none'})")


def _check_log_kept(c: Context) -> None:
    """A study whose runs rows name the grid that ran them, or that keeps grid files or a grid.yaml (written
    with the record, study/engine/runner.py; `study migrate` adopts an older one), recorded them in
    grids/log.jsonl: that log missing or empty is a deletion."""
    named = sorted({(row["grid"], rid) for rid, row in c.runs.items() if row.get("grid")})
    kept = c.store.fs.get_file_info(pafs.FileSelector(c.store.path(provenance.GRIDS), allow_not_found=True))
    kept = sorted(i.base_name for i in kept if i.base_name.endswith(".yaml"))
    last = c.store.read_bytes(c.store.path("grid.yaml"))
    if named or kept or last is not None:
        sha, rid = named[0] if named else (kept[0][: -len(".yaml")] if kept else None, None)
        by = (f"runs/{rid}.parquet field grid names grid {sha}" if rid else f"grids/ keeps grid {sha}" if sha
              else "the study keeps its grid.yaml")
        c.v.problems.append(f"{c.store.path(provenance.GRIDS, provenance.LOG)}: missing or empty, but {by} "
                            f"({len(named)} runs row(s) name a grid, {len(kept)} grid file(s) kept): the record of "
                            f"the grids the study ran was deleted")


def _expand(v: Verdict, raw: bytes, path: str):
    try:
        grid = expand(parse_text(yaml.safe_load, raw), path)
    except (GridError, yaml.YAMLError, ValueError, TypeError, AttributeError) as e:
        v.notes.append(f"{path} not expanded ({str(e).splitlines()[0][:160]}): the points it owes are taken "
                       f"from the runs' own configs")
        v.underived.add("eval points owed by a grid that no longer expands")
        return None
    if grid.search is not None:  # a search's trials are runs of their own: each owes its config's points
        return None
    return grid.runs


def expected_points(c: Context) -> None:
    """c.owed (run_id -> eval keys owed) and c.known (run_id -> {key: EvalPoint} known): from every recorded
    grid and from each done run's own config."""
    def owe(rid: str, run, row: dict | None) -> None:
        pts = {p.key: p for p in run.eval_points()}
        c.known.setdefault(rid, {}).update(pts)
        if row is not None and row["status"] == "done":
            c.owed.setdefault(rid, set()).update(pts)

    results = "" if c.store.root in ("results", "./results") else f" --results {c.store.root}"
    for sha, path, grid_runs in c.grids:
        todo = 0
        for run in grid_runs or ():
            row = c.runs.get(run.run_id)
            if row is None and ("runs", (f"{run.run_id}.parquet",)) not in c.files:
                todo += 1  # no row yet: owed (never started, or interrupted), not damage
                c.unrun.add(run.run_id)
            owe(run.run_id, run, row)
        if todo:
            c.v.owed.append(f"{todo} run(s) of grid {sha}: `study run {path}{results}` finishes them")
    for rid, run in c.rebuilt.items():
        owe(rid, run, c.runs[rid])
