"""Store health before dispatch: which runs of a grid are done, to do or failed, whether a run whose row
says done is whole, and the healing `study run` does first (temp files, damaged cached task data)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from atomicio import loads_json
from store import Store, digest
from study.spec.grid import Grid, Run
from study.engine.rows import NLL_KEYS
from study.engine.progress import retried_since


@dataclass
class Plan:
    done: list[Run]
    todo: list[Run]  # to train and/or evaluate
    failed: list[Run]  # failed earlier; skipped unless --retry-failed
    # run_id -> what its trial does and why, for runs whose row says done but that are not whole
    why: dict[str, str] = field(default_factory=dict)


def classify(grid: Grid, store: Store, retry_failed: bool = False) -> Plan:
    """Done, to do, failed. A run is done only when everything a done run must have is there and readable:
    its row says done, every eval point's evals (and samples) parse, its history parses, and
    its final weights load and configs/<run_id>.json parses and matches the run. Otherwise its trial redoes
    what is missing: re-evaluates from the weights, or retrains when they are damaged (`why` says which)."""
    done, todo, failed = [], [], []
    why: dict[str, str] = {}
    seen = store.summary(histories=True)  # one pass over the store, not a few reads per run and point
    for run in grid.runs:
        row = seen.run_row(run.run_id)
        status = row["status"] if row else None
        missing = {p.key for p in run.eval_points()} - seen.eval_keys(run.run_id, whole=True)
        missing |= seen.half_keys(run.run_id) & set(NLL_KEYS.values())  # a continuous point half there
        if status == "done":
            problem = not_whole(store, run) or digest.recorded_weights_problem(store, row)
            if problem is None and missing:
                problem = f"re-evaluate: eval point(s) {', '.join(sorted(missing))} missing or unreadable"
            if problem is None and not seen.has_history(run.run_id):
                problem = (f"re-evaluate: history/{run.run_id}.parquet missing or unreadable (rewritten from the "
                           f"weights)")
            if problem is None:
                done.append(run)
                continue
            why[run.run_id] = problem
            todo.append(run)
        elif status == "failed" and not retry_failed and not retried_since(store, run.run_id, row):
            failed.append(run)  # (a --retry-failed that was interrupted is resumed, as status says)
        else:
            todo.append(run)
    return Plan(done, todo, failed, why)


def todo_note(store: Store, plan: Plan) -> str:
    """What the runs to do start from, as `study run` says it: "2 to run, 1 to resume (from step 30),
    1 trained, evaluating" (a run with a whole checkpoint resumes from it; one whose final weights are there and
    not to be retrained only evaluates; the others start at step 0). The step is the checkpoint's as the
    run's heartbeat recorded it."""
    from study.engine.trial import previous_checkpoint_path

    beats = store.read_progress({r.run_id for r in plan.todo})
    fresh, resumed, trained = 0, [], 0
    for run in plan.todo:
        rid = run.run_id
        if not plan.why.get(rid, "").startswith("retrain") and store.exists(store.weights_path(rid)):
            trained += 1
        elif weights_problem(store, store.checkpoint_path(rid)) is None:  # a damaged one is set aside
            resumed.append((beats.get(rid) or {}).get("checkpoint"))
        elif weights_problem(store, previous_checkpoint_path(store, rid)) is None:
            resumed.append(None)  # from the one kept before it: its step is not recorded
        else:
            fresh += 1
    parts = [f"{fresh} to run"] if fresh or not (resumed or trained) else []
    if resumed:
        known = sorted({int(s) for s in resumed if isinstance(s, (int, float))})
        at = ("" if not known else f" (from step {known[0]})" if len(known) == 1
              else f" (from steps {known[0]} to {known[-1]})")
        parts.append(f"{len(resumed)} to resume{at}")
    if trained:
        parts.append(f"{trained} trained, evaluating")
    return ", ".join(parts)


def not_whole(store: Store, run: Run) -> str | None:
    """What a run whose row says done lacks, as "retrain: ..." (its final weights are missing or do not load)
    or "re-evaluate: ..." (its config file is missing, garbled or of another run); None when whole."""
    rid = run.run_id
    wpath = store.weights_path(rid)
    bad = weights_problem(store, wpath)
    if bad:
        return f"retrain: {wpath} {bad}"
    cpath = store.path("configs", f"{rid}.json")
    raw = store.read_bytes(cpath)
    if raw is None:
        return f"re-evaluate: {cpath} {store.unreadable.get(cpath, 'is missing')} (rewritten)"
    try:
        cfg = loads_json(raw)
    except ValueError as e:
        return f"re-evaluate: {cpath} is not JSON ({str(e)[:80]}) (rewritten)"
    want = json.loads(json.dumps(run.resolved(), sort_keys=True, default=str))
    if not isinstance(cfg, dict) or any(cfg.get(k) != want.get(k) for k in ("run_id", "task", "model", "train")):
        return f"re-evaluate: {cpath} is not this run's config (rewritten)"
    return None


def weights_problem(store: Store, path: str) -> str | None:
    """Why the final weights at `path` cannot be used ("is missing", "is not a whole torch file ..."), or None.

    Cheap, for every done run at every `study run` (the trial that loads them checks the rest): on a local
    disk the zip directory torch writes is read and its pickle (data.pkl, CRC-checked, no tensor read) must
    name the trainer's state keys (~0.6 ms a run); on an object store its first and last bytes are checked."""
    import zipfile

    import pyarrow.fs as pafs

    from study.engine.trial import STATE_KEYS

    info = store.fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return "is a dangling symlink" if store.local and os.path.islink(path) else "is missing"
    if info.type != pafs.FileType.File:
        return "is not a file"
    if not store.local:
        try:
            with store.fs.open_input_file(path) as f:
                size = f.size()
                head, tail = f.read_at(4, 0), f.read_at(min(22, size), max(0, size - 22))
        except OSError as e:
            return f"cannot be read ({e})"
        return None if head == b"PK\x03\x04" and tail[:4] == b"PK\x05\x06" else \
            "is not a whole torch file (truncated or foreign)"
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next((n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1), None)
            if pkl is None:
                return "is not a torch file (no data.pkl)"
            names = z.read(pkl)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as e:  # zlib/CRC errors too
        return f"is not a whole torch file (truncated or foreign: {type(e).__name__}: {str(e)[:100]})"
    lacking = [k for k in STATE_KEYS if k.encode() not in names]
    return f"does not hold this project's weights (no {', '.join(lacking)})" if lacking else None


def heal_and_plan(grid: Grid, store: Store, retry_failed: bool, echo) -> Plan:
    """What `study run` does to a store before it dispatches: removes temp files of interrupted writes, sets
    damaged cached data aside and makes it anew, and plans, naming every unreadable file and every run
    whose row says done but that is not whole (re-evaluated or retrained, and why)."""
    gone = store.clean_temp()
    if gone:
        echo(f"removed {len(gone)} temp file(s) left by interrupted writes: {', '.join(gone[:3])}"
             + (", ..." if len(gone) > 3 else ""))
    heal_data(grid, store, echo)
    plan = classify(grid, store, retry_failed)
    for path, why in sorted(store.unreadable.items()):
        echo(f"unreadable: {path} ({why}): its run is redone")
    for rid, why in sorted(plan.why.items()):
        echo(f"run {rid}: {why}")
    return plan


def heal_data(grid: Grid, store: Store, echo) -> None:
    """Cached task data (data/*.npz) whose zip does not read is set aside and made anew now (it is derived
    from the grid's task configs, by seed), so a finished study heals too. Local stores."""
    from study.engine.trial import damaged_data, prepared_task

    if not store.local:
        return
    bad = damaged_data(store.data_dir(), deep=False)
    for path, why in bad:
        echo(store.quarantine(path, why))
    if bad:
        seen = set()
        for run in grid.runs:
            key = run.task.model_dump_json()
            if key not in seen:
                seen.add(key)
                task = prepared_task(run, store, echo)
                for split in {pt.split for pt in run.eval_points()}:
                    task.eval_set(split)
        echo(f"remade the cached task data of {len(seen)} task config(s)")


def quarantined(store: Store) -> set[str]:
    import pyarrow.fs as pafs

    from store import QUARANTINE

    sel = pafs.FileSelector(f"{store.dir}/{QUARANTINE}", recursive=True, allow_not_found=True)
    return {i.path for i in store.fs.get_file_info(sel) if i.type == pafs.FileType.File}
