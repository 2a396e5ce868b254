"""`study verify`: check a study's store before believing a figure drawn from it.

Re-scores every stored sample with its task's scorer and compares with the stored scores and,
where every example of an eval point was kept, with the `evals` metric values; checks the
store's invariants: every table file parses and lies where the layout puts it, one runs row
per id, every eval point of a done run present, weights present (and loadable without
running code) for every done run, histories monotone within an attempt. Reads the store only.
"""
from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass, field

import pyarrow.fs as pafs
import torch
import yaml

from model.config import ModelConfig, TrainConfig
from model.train import CheckpointError, load_state
from store import SCHEMAS, Store, is_safe_name
from study.grid import EvalConfig, GridError, Resources, Run, expand
from tasks import TASKS, make_task

TOL = 1e-9  # scores are means of 0/1 or of floats computed the same way: equal up to rounding


@dataclass
class Verdict:
    study: str
    dir: str
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why (not failures)

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        c = self.counts
        lines = [f"study {self.study} ({self.dir}): {c.get('runs', 0)} runs ({c.get('done', 0)} done), "
                 f"{c.get('eval_files', 0)} eval points, {c.get('samples', 0)} samples re-scored, "
                 f"{c.get('metrics_recomputed', 0)} metric values recomputed, {c.get('histories', 0)} histories, "
                 f"{c.get('weights', 0)} weights files"]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines.append(f"{len(self.problems)} problem(s): the store disagrees with itself" if self.problems
                     else "OK: every check agrees")
        return "\n".join(lines)


# ---- re-scoring from the stored text -----------------------------------------------------------
def _rescore_sudoku(task, inp: str, out: str, ref: str | None) -> dict[str, float]:
    from tasks.base import EvalSet
    from tasks.sudoku import DIGITS

    digits = DIGITS[: task.n]
    cells = task.n * task.n
    for name, text in (("input", inp), ("output", out), ("reference", ref)):
        if text is not None and len(text) != cells:
            raise ValueError(f"{name} has {len(text)} cells, a {task.n}x{task.n} grid has {cells}")

    def tokens(text: str, blank: int) -> torch.Tensor:
        return torch.tensor([[digits.index(ch) if ch in digits else blank for ch in text]])

    cond = torch.tensor([[ch != "." for ch in inp]])
    x_ref = tokens(ref, 0) if ref is not None else tokens(inp, 0)  # no reference: the givens only
    scores = task.score(tokens(out, -1), EvalSet(x_ref, cond))[0]  # '.' in an output: never filled
    return scores if ref is not None else {"vpr": scores["vpr"]}


def _rescore_countdown(task, inp: str, out: str, ref: str | None) -> dict[str, float]:
    from tasks.countdown import check_solution, last_result, parse_input, well_formed

    operands, target = parse_input(inp)
    ok, _ = check_solution(operands, target, out)
    scores = {"rtr": float(ok), "well_formed": float(well_formed(out)),
              "ends_on_target": float(last_result(out) == target)}
    if ref is not None:
        scores["exact"] = float(out == ref)
    return scores


# Text8's samples are scored against the corpus vocabulary (known words): not re-scored here.
RESCORE = {"sudoku": _rescore_sudoku, "countdown": _rescore_countdown}


# ---- the checks ----------------------------------------------------------------------------------
def verify_study(store: Store) -> Verdict:
    v = Verdict(store.study, store.dir)
    files = _table_files(store, v)
    tables = {}  # (table, rel path) -> pyarrow table of every readable file
    for (table, rel), path in files.items():
        data = store.read_bytes(path)
        t = store._parse(path, data, SCHEMAS[table]) if data is not None else None
        if t is None:
            v.problems.append(f"unreadable file {path}: {store.unreadable.get(path, 'vanished while read')}")
        else:
            tables[(table, rel)] = t

    runs = _check_runs(store, v, tables)
    points = _expected_points(store, v, runs)
    _check_evals_and_samples(store, v, files, tables, runs, points)
    _check_histories(v, tables)
    _check_leftovers(store, v)
    return v


def _table_files(store: Store, v: Verdict) -> dict[tuple[str, tuple[str, ...]], str]:
    """(table, path parts inside the table) -> path, for every Parquet file; misplaced files are problems."""
    out = {}
    for table in SCHEMAS:
        root = f"{store.dir}/{table}"
        for info in store.fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
            if info.type != pafs.FileType.File or info.base_name[0] in "._":
                continue  # temp files of interrupted writers are not part of the store
            rel = tuple(info.path[len(root) + 1:].split("/"))
            flat = table in ("runs", "history")
            if (not info.base_name.endswith(".parquet") or len(rel) != (1 if flat else 2)
                    or not all(is_safe_name(p) for p in rel)):
                v.problems.append(f"orphan file {info.path}: not where the store's layout puts a {table} file")
                continue
            out[(table, rel)] = info.path
    return out


def _stem(name: str) -> str:
    return name[: -len(".parquet")]


def _check_runs(store: Store, v: Verdict, tables: dict) -> dict[str, dict]:
    runs = {}
    for (table, rel), t in tables.items():
        if table != "runs":
            continue
        rid, rows = _stem(rel[0]), t.to_pylist()
        path = store.path("runs", rel[0])
        if len(rows) != 1:
            v.problems.append(f"{path}: {len(rows)} rows, one runs row per id expected")
        bad = [r["run_id"] for r in rows if r["run_id"] != rid]
        if bad:
            v.problems.append(f"{path}: holds rows of run(s) {', '.join(map(str, bad))}, not of {rid}")
        if rows:
            runs[rid] = rows[-1]
    v.add("runs", len(runs))
    for rid, row in sorted(runs.items()):
        if row["status"] != "done":
            continue
        v.add("done")
        wpath = store.weights_path(rid)
        data = store.read_bytes(wpath)
        if data is None:
            v.problems.append(f"run {rid} is done but has no weights ({wpath})")
            continue
        try:
            sd = load_state(io.BytesIO(data), "cpu", wpath)
            from study.trial import STATE_KEYS

            lacking = [k for k in STATE_KEYS if k not in sd]
            if lacking:
                raise CheckpointError(f"{wpath}: not this project's weights (no {', '.join(lacking)})")
            v.add("weights")
        except CheckpointError as e:
            v.problems.append(f"{e}; `study run` sets it aside and retrains the run")
    return runs


def _expected_points(store: Store, v: Verdict, runs: dict[str, dict]) -> dict[str, set[str]]:
    """run_id -> eval keys its grid owes: from grid.yaml, else from the config stored in its runs row."""
    owed: dict[str, set[str]] = {}
    raw = store.read_bytes(store.path("grid.yaml"))
    if raw is not None:
        try:
            grid = expand(yaml.safe_load(raw), store.path("grid.yaml"))
            owed = {r.run_id: {p.key for p in r.eval_points()} for r in grid.runs}
        except (GridError, yaml.YAMLError, ValueError, TypeError) as e:
            v.notes.append(f"grid.yaml not expanded ({str(e).splitlines()[0][:120]}): eval points from runs rows")
    for rid, row in runs.items():
        if rid in owed or row["status"] != "done":
            continue
        try:
            cfg = json.loads(row["config"])
            # the grid's own rule (Run.eval_points) on the run as stored: its config, and its task's
            # full parameters (evaluation-only fields included) from the runs row
            run = Run(study=store.study, task=TASKS[row["task"]][0].model_validate(json.loads(row["task_params"])),
                      model=ModelConfig.model_validate(cfg["model"]), train=TrainConfig.model_validate(cfg["train"]),
                      eval=EvalConfig.model_validate(cfg["eval"]), resources=Resources.model_validate(cfg["resources"]),
                      retries=cfg.get("retries", 0), group=cfg.get("group"))
            owed[rid] = {p.key for p in run.eval_points()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            v.problems.append(f"run {rid}: stored config unreadable ({str(e).splitlines()[0][:120]})")
    return owed


def _task_of(row: dict, cache: dict):
    key = (row["task"], row["task_params"])
    if key not in cache:
        name = row["task"]
        if name not in TASKS:
            raise ValueError(f"task {name!r} unknown here; known: {', '.join(sorted(TASKS))}")
        cache[key] = make_task(TASKS[name][0].model_validate(json.loads(row["task_params"])))
    return cache[key]


def _check_evals_and_samples(store: Store, v: Verdict, files: dict, tables: dict, runs: dict, owed: dict) -> None:
    evals = {rel: t for (table, rel), t in tables.items() if table == "evals"}
    samples = {rel: t for (table, rel), t in tables.items() if table == "samples"}
    # every eval file, readable or not (an unreadable one is already a problem of its own)
    on_disk = {table: {rel for (tb, rel) in files if tb == table} for table in ("evals", "samples")}
    for rid in sorted({rel[0] for rels in on_disk.values() for rel in rels} - set(runs)):
        v.problems.append(f"orphan eval files under evals/{rid}/ or samples/{rid}/: no readable runs row for "
                          f"run {rid} (a run still evaluating, or left over)")
    present: dict[str, set[str]] = {}
    tasks: dict = {}
    for rel, t in evals.items():
        rid, key = rel[0], _stem(rel[1])
        present.setdefault(rid, set()).add(key)
        path = store.path("evals", *rel)
        if any(r != rid for r in t.column("run_id").to_pylist()) or any(
                k != key for k in t.column("eval_key").to_pylist()):
            v.problems.append(f"{path}: rows of another run or eval point than its path says")
        if rel not in on_disk["samples"]:
            v.notes.append(f"{path}: no samples file: nothing to re-score")
        metrics = t.column("metric").to_pylist()
        for m in sorted({m for m in metrics if metrics.count(m) > 1}):
            v.problems.append(f"{path}: {metrics.count(m)} rows of metric {m}, one expected")
        for m in sorted(_metrics_owed(rid, key, runs, owed, samples.get(rel), tasks) - set(metrics)):
            v.problems.append(f"{path}: no evals row of metric {m} (run {rid}, eval point {key})")
    v.add("eval_files", len(evals))
    for rel in sorted(on_disk["samples"] - on_disk["evals"]):
        v.problems.append(f"orphan file {store.path('samples', *rel)}: samples without an evals file")

    for rid, keys in sorted(owed.items()):
        row = runs.get(rid)
        if row is None or row["status"] != "done":
            continue
        for key in sorted(keys - present.get(rid, set())):
            v.problems.append(f"run {rid} is done but eval point {key} has no readable evals rows")

    skipped: set[str] = set()
    for rel, st in sorted(samples.items()):
        rid, key = rel[0], _stem(rel[1])
        row = runs.get(rid)
        if row is None:
            continue
        rescore = RESCORE.get(row["task"])
        if rescore is None:
            skipped.add(row["task"])
            continue
        try:
            task = _task_of(row, tasks)
        except (ValueError, TypeError) as e:
            v.problems.append(f"run {rid}: task not rebuilt from its runs row: {str(e).splitlines()[0][:160]}")
            continue
        path = store.path("samples", *rel)
        rescored = _rescore_file(v, path, st.to_pylist(), task, rescore)
        if rel in evals and rescored is not None:
            _check_metrics(v, store.path("evals", *rel), evals[rel].to_pylist(), rescored)
    for name in sorted(skipped):
        v.notes.append(f"{name} samples not re-scored (no text re-scorer for this task)")


def _metrics_owed(rid: str, key: str, runs: dict, owed: dict, samples, tasks: dict) -> set[str]:
    """Metrics an evals file must hold: those its samples were scored on, and for a point of the
    grid of a sample-and-score task, every metric of the task."""
    out = set()
    for js in (samples.column("scores").to_pylist() if samples is not None else []):
        try:
            out |= set(json.loads(js or "{}"))
        except ValueError:
            pass  # reported with the samples
    row = runs.get(rid)
    if row is not None and key in owed.get(rid, ()):
        try:
            task = _task_of(row, tasks)
        except (ValueError, TypeError):
            return out  # reported with the samples
        if getattr(task, "eval_mode", "sample") == "sample":
            out |= set(task.metric_names)
    return out


def _rescore_file(v: Verdict, path: str, rows: list[dict], task, rescore) -> list[dict] | None:
    """Re-scores of a samples file in example order; None when some example could not be re-scored."""
    out, whole = [], True
    for r in sorted(rows, key=lambda r: r["example"]):
        where = f"{path} example {r['example']}"
        try:
            s = rescore(task, r["input"], r["output"], r["reference"])
        except (ValueError, IndexError) as e:
            v.problems.append(f"{where}: output does not re-score: {str(e).splitlines()[0][:160]}")
            whole = False
            continue
        v.add("samples")
        primary = s.get(task.primary_metric)
        if primary is not None and not _same(r["score"], primary):
            v.problems.append(f"{where}: stored score {r['score']} but its output re-scores to {primary} "
                              f"({task.primary_metric}; output {str(r['output'])[:60]!r})")
        try:
            stored = json.loads(r["scores"]) if r["scores"] else {}
        except ValueError:
            stored = {}
            v.problems.append(f"{where}: per-metric scores are not JSON")
        for m, val in s.items():
            if m in stored and m != task.primary_metric and not _same(stored[m], val):
                v.problems.append(f"{where}: stored {m} {stored[m]} but re-scored {val}")
        out.append({"example": r["example"], **s})
    return out if whole else None


def _check_metrics(v: Verdict, path: str, eval_rows: list[dict], rescored: list[dict]) -> None:
    """Where every example was kept (indices 0..n-1), each metric value is the mean of the re-scores."""
    for e in eval_rows:
        n, m = e["n_examples"], e["metric"]
        if not n or len(rescored) != n or [r["example"] for r in rescored] != list(range(n)):
            continue  # only some examples kept: the per-sample checks are all there is
        if m not in rescored[0]:
            continue
        mean = sum(r[m] for r in rescored) / n
        v.add("metrics_recomputed")
        if not _same(e["value"], mean):
            v.problems.append(f"{path}: {m} is {e['value']} but the {n} stored samples re-score to {mean}")


def _check_histories(v: Verdict, tables: dict) -> None:
    for (table, rel), t in sorted(tables.items()):
        if table != "history":
            continue
        v.add("histories")
        rid = _stem(rel[0])
        last: dict = {}
        for r in t.to_pylist():
            a = r["attempt"]
            if r["run_id"] != rid:
                v.problems.append(f"history/{rel[0]}: a row of run {r['run_id']}")
                break
            prev = last.get(a)
            if prev is not None and (r["step"] <= prev["step"] or (
                    r["seconds"] is not None and prev["seconds"] is not None and r["seconds"] < prev["seconds"])):
                v.problems.append(f"history/{rel[0]}: attempt {a}: step {r['step']} (at {r['seconds']} s) "
                                  f"after step {prev['step']} (at {prev['seconds']} s): not monotone")
                break
            last[a] = r


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=TOL, abs_tol=TOL)


# ---- what interrupted writes and damage leave behind ------------------------------------------------
def _check_leftovers(store: Store, v: Verdict) -> None:
    """Temp files of writes that never finished, cached task data that does not load, files that exist but
    cannot be read (a directory or a dangling link in a file's place); files set aside in quarantine/ are
    noted (kept, never deleted)."""
    import time

    from store import QUARANTINE, TEMP_AGE_S
    from study.trial import damaged_data

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
    runs_dir = f"{store.dir}/runs"
    for info in store.fs.get_file_info(pafs.FileSelector(runs_dir, allow_not_found=True)):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet") or info.base_name[0] in "._":
            continue
        t = store.read_file("runs", info.base_name)
        rows = t.to_pylist() if t is not None else []
        if not rows or rows[-1]["status"] != "done":
            continue
        rid = info.base_name[: -len(".parquet")]
        cpath = store.path("configs", f"{rid}.json")
        if any(cpath in p for p in v.problems):
            continue  # said by the config checks
        raw = store.read_bytes(cpath)
        try:
            cfg = json.loads(raw) if raw is not None else None
        except ValueError as e:
            v.problems.append(f"{cpath}: not JSON ({str(e)[:80]}); `study run` rewrites it")
            continue
        if raw is None and cpath not in store.unreadable:
            v.problems.append(f"{cpath}: missing: run {rid} is done; `study run` rewrites it")
        elif raw is not None and (not isinstance(cfg, dict) or cfg.get("run_id") != rid):
            v.problems.append(f"{cpath}: not the config of run {rid}; `study run` rewrites it")
    for path, why in sorted(store.unreadable.items()):  # read but not parsed by the checks above
        if not any(path in p for p in v.problems):
            v.problems.append(f"unreadable file {path}: {why}")
