"""`study prune GRID`: the runs of a study that no grid of the study asks for any more, set aside.

A store keeps every run it ever started: failed runs of a grid since fixed, runs of a grid since
changed that never finished. `study status` and `study report` would list them forever. Here:

- the grids of the study are the GRID given (after its overrides) and every grid the study ran
  (store/provenance.py: grids/log.jsonl; `study migrate` adopts the grid.yaml of a study from before it);
- a run is kept when the GRID given asks for it (whatever its state), when it is done and any grid
  of the study asks for it, or when it is a trial of a search group (`study tune`);
- every other run is listed with why (failed, never finished, done but asked for by no grid);
- nothing moves without `--apply`; then the lease is taken (no driver may run meanwhile) and every
  file of each such run is moved, never deleted, to <study>/pruned/<UTC time>/ under its own
  relative path (moving the files back restores the run), with PRUNED.txt listing runs and reasons.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow.fs as pafs

from store import Store, is_safe_name
from study.engine.errors import root_cause
from study.spec.grid import Grid

PRUNED = "pruned"  # <study>/pruned/<UTC time>/<the run's files, by their paths in the study>
# where a run's files live: <dir>/<run_id><suffix> files, and <dir>/<run_id>/ directories
RUN_FILES = ("runs", "history", "weights", "checkpoints", "configs", "logs", "progress")
RUN_DIRS = ("evals", "samples")


@dataclass
class Candidate:
    run_id: str
    state: str  # failed, unfinished, done, ...
    reason: str
    files: list[str] = field(default_factory=list)  # absolute paths in the store


@dataclass
class PrunePlan:
    prune: list[Candidate]
    kept_asked: int  # runs the grid given asks for
    kept_done: int  # done runs only an earlier grid asks for
    kept_search: int  # trials of search groups
    notes: list[str] = field(default_factory=list)


def study_grids(store: Store, notes: list[str]) -> list[Grid]:
    """Every grid the study recorded (its provenance log), expanded; those that no longer
    expand are named in `notes` (None in the list: what they ask for is unknown)."""
    import yaml

    from store import provenance
    from study.spec.grid import expand

    out = []
    for name, text in ((f"grids/{g['grid']}.yaml", g["text"]) for g in provenance.grids(store)):
        if text is None:
            notes.append(f"{store.dir}/{name} is missing: done runs only it asked for are kept")
            out.append(None)
            continue
        try:
            out.append(expand(yaml.safe_load(text), f"{store.dir}/{name}"))
        except Exception as e:  # a grid of an older schema: what it asks for is unknown
            notes.append(f"{store.dir}/{name} no longer expands ({str(e).splitlines()[0][:120]}): "
                         f"done runs of the study are all kept")
            out.append(None)
    return out


def run_files(store: Store) -> dict[str, list[str]]:
    """run_id -> every file of the run in the store (tables, weights, checkpoints, config, logs, heartbeat)."""
    out: dict[str, list[str]] = {}
    for d in RUN_FILES:
        for info in store.fs.get_file_info(pafs.FileSelector(f"{store.dir}/{d}", allow_not_found=True)):
            if info.type == pafs.FileType.File and info.base_name[0] not in "._":
                rid = info.base_name.split(".", 1)[0]
                if is_safe_name(rid):
                    out.setdefault(rid, []).append(info.path)
    for d in RUN_DIRS:
        for info in store.fs.get_file_info(pafs.FileSelector(f"{store.dir}/{d}", allow_not_found=True)):
            if info.type == pafs.FileType.Directory and is_safe_name(info.base_name):
                files = [i.path for i in store.fs.get_file_info(pafs.FileSelector(info.path, recursive=True))
                         if i.type == pafs.FileType.File]
                out.setdefault(info.base_name, []).extend(files)
    return out


def plan_prune(grid: Grid, store: Store) -> PrunePlan:
    """What `study prune` would set aside, and what it keeps (see the module's docstring)."""
    notes: list[str] = []
    grids = [grid, *study_grids(store, notes)]
    unknown = any(g is None for g in grids)
    asked_now = {r.run_id for r in grid.runs}
    asked_ever = {r.run_id for g in grids if g is not None for r in g.runs}
    groups = {sg.name for g in grids if g is not None and g.search is not None for sg in g.search_groups}
    runs = store.read("runs")
    rows = {r["run_id"]: r for r in runs.to_dict("records")} if len(runs) else {}
    files = run_files(store)
    prune, kept_asked, kept_done, kept_search = [], 0, 0, 0
    for rid in sorted(set(files) | set(rows)):
        row = rows.get(rid)
        status = row.get("status") if row else None
        if rid in asked_now:
            kept_asked += 1
            continue
        if row is not None and row.get("group") in groups:  # a trial of a search (study tune)
            kept_search += 1
            continue
        if status == "done":
            if rid in asked_ever or unknown:
                kept_done += 1
                continue
            state, why = "done", "done, but no grid of the study asks for it"
        elif status == "failed":
            state, why = "failed", f"failed ({root_cause(row.get('error')) or 'no error recorded'})"
        elif status:
            state, why = status, f"{status}"
        else:
            state, why = "unfinished", "never finished (no runs row)"
        elsewhere = "an earlier grid of the study asked for it" if rid in asked_ever else "no grid of the study asks for it"
        if state != "done":
            why += f"; {grid.path} does not ask for it ({elsewhere})"
        prune.append(Candidate(rid, state, why, sorted(files.get(rid, []))))
    return PrunePlan(prune, kept_asked, kept_done, kept_search, notes)


def apply_prune(store: Store, plan: PrunePlan) -> str:
    """Move every file of every candidate to <study>/pruned/<UTC time>/ (never deleting); returns that
    directory. The caller holds the study's lease."""
    dest = store.stamped_path(f"{store.dir}/{PRUNED}/")
    lines = []
    for c in plan.prune:
        for path in c.files:
            rel = path[len(store.dir) + 1:]
            target = f"{dest}/{rel}"
            store.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            store.fs.move(path, target)
        lines.append(f"{c.run_id}\t{c.state}\t{c.reason}")
    store.write_text(f"{dest}/PRUNED.txt", "run_id\tstate\treason\n" + "\n".join(lines) + "\n")
    for c in plan.prune:  # evals/<run_id>/ and samples/<run_id>/ are empty now: gone, so no reader lists them
        for d in RUN_DIRS:
            p = f"{store.dir}/{d}/{c.run_id}"
            info = store.fs.get_file_info(p)
            if info.type == pafs.FileType.Directory and not store.fs.get_file_info(
                    pafs.FileSelector(p, recursive=True)):
                store.fs.delete_dir(p)
    return dest


def prune(grid: Grid, results: str, apply: bool, echo=print) -> int:
    """`study prune`: list (and with `apply`, set aside) the runs no grid of the study asks for any more."""
    store = Store(results, grid.study)
    if not store.exists(store.dir):
        echo(f"study {grid.study}: nothing under {store.dir}")
        return 0
    store.refuse_links_out()  # OutsideStore: nothing is listed or moved through a link out of the store
    plan = plan_prune(grid, store)
    for note in plan.notes:
        echo(f"note: {note}")
    kept = (f"kept: {plan.kept_asked} run(s) {grid.path} asks for, {plan.kept_done} done run(s) of earlier grids"
            + (f", {plan.kept_search} search trial(s)" if plan.kept_search else ""))
    if not plan.prune:
        echo(f"study {grid.study}: no run to prune; {kept}")
        return 0
    echo(f"study {grid.study}: {len(plan.prune)} run(s) no grid of the study asks for any more"
         + ("" if apply else " (dry run: `--apply` moves them aside, never deleting)") + ":")
    for c in plan.prune:
        echo(f"  {c.run_id}  {c.state:<10} {c.reason}  ({len(c.files)} file(s))")
    echo(kept)
    if not apply:
        return 0
    from store.lease import acquire

    with acquire(store, "prune", echo=echo):  # no `study run` or `study tune` of this study meanwhile
        plan = plan_prune(grid, store)  # again, under the lease
        dest = apply_prune(store, plan)
    echo(f"moved {sum(len(c.files) for c in plan.prune)} file(s) of {len(plan.prune)} run(s) to {dest} "
         f"(list: {dest}/PRUNED.txt; move them back to restore)")
    return 0

