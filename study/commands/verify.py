"""`study verify`: check a study's store before believing a figure drawn from it.

Recomputes everything the store lets it recompute, and names the file and field of each
disagreement:
- runs: the run id is the hash of the training config (configs/<id>.json and the row's `config`
  agree field by field); every column a config implies (task, K, L_t, d_model, heads, schedule,
  loss, lr, batch, steps, seed, parameter and FLOP counts) is what `study.engine.trial.run_row` and the
  model's own counting give for that config; `status` agrees with `error`, the weights and the eval
  points; `final_loss` is the history's last loss; `grid` names a grid the study recorded.
- evals: each file's key is the key of an evaluation point some grid of the study (grids/, see
  store/provenance.py) or the run's config owes, or the key of its rows' own fields; T, L_s,
  sampler, split and n_examples are that point's; value, ci_low and ci_high are what
  `study.engine.evaluate.metric_rows` (`study.engine.evaluate.likelihood_rows` for a likelihood point) gives the
  per-example scores of its samples file; forward_passes, forward_passes_mean and eval_flops are
  what `study.engine.evaluate.sampling_cost` (`likelihood_cost`) gives the per-example passes and steps.
- samples: one row per evaluated example (0..n-1); the outputs kept are re-scored from their text
  by the task (`Task.rescore`) and must match the stored scores; a task that cannot re-score from
  text says so (`NotRescorable`) and is named among what is not re-derived.
- every eval point owed by every grid the study ran (and by each done run's config) is present,
  with its samples file; the read index (_index/) agrees with the files it summarises.
- the store's invariants: every table file parses and lies where the layout puts it, one runs
  row per id, weights present (and loadable without running code) for every done run, histories
  monotone within an attempt.
What cannot be re-derived (measured times, hosts, per-example scores whose outputs were not kept)
is named in the summary line. Reads the store only.
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
from store import SCHEMAS, Store, index, is_safe_name, provenance
from study.spec.grid import EvalConfig, EvalPoint, GridError, Resources, Run, config_hash, expand
from tasks import TASKS, NotRescorable, make_task

TOL = 1e-9  # scores are means of 0/1 or of floats computed the same way: equal up to rounding


@dataclass
class Verdict:
    study: str
    dir: str
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why (not failures)
    underived: set[str] = field(default_factory=set)  # kinds of numbers that could not be re-derived here

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        c = self.counts
        lines = [f"study {self.study} ({self.dir}): {c.get('runs', 0)} runs ({c.get('done', 0)} done), "
                 f"{c.get('eval_files', 0)} eval points, {c.get('samples', 0)} samples re-scored, "
                 f"{c.get('scores_as_stored', 0)} per-example scores taken as stored (outputs not kept), "
                 f"{c.get('metrics_recomputed', 0)} metric values recomputed, {c.get('configs', 0)} configs "
                 f"re-hashed, {c.get('grids', 0)} grids, {c.get('index_entries', 0)} index entries checked, "
                 f"{c.get('histories', 0)} histories, {c.get('weights', 0)} weights files; not re-derived: "
                 + "; ".join([*sorted(self.underived), UNDERIVED])]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines.append(f"{len(self.problems)} problem(s): the store disagrees with itself" if self.problems
                     else "OK: every check agrees")
        return "\n".join(lines)


# measurements: recorded as they happened, nothing in the store determines them
UNDERIVED = ("measured times and places (train_seconds, eval_seconds, created_at, attempts, node, node_id, node_ip, "
             "device, gpu_ids, attention, precision, code_version)")


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
    grids = _check_grids(store, v, runs)
    rebuilt = _check_run_configs(store, v, runs, tables, grids)
    owed, known = _expected_points(store, v, runs, rebuilt, grids)
    _check_evals_and_samples(store, v, files, tables, runs, rebuilt, owed, known)
    _check_histories(v, tables)
    _check_final_loss(store, v, runs, tables)
    _check_index(store, v, files, tables)
    _check_leftovers(store, v)
    return v


def _check_final_loss(store: Store, v: Verdict, runs: dict, tables: dict) -> None:
    """A done run's final_loss is the loss of the last step of its history."""
    for rid, row in sorted(runs.items()):
        t = tables.get(("history", (f"{rid}.parquet",)))
        if row["status"] != "done" or t is None or not t.num_rows:
            continue
        steps, losses = t.column("step").to_pylist(), t.column("loss").to_pylist()
        last = losses[max(range(len(steps)), key=lambda i: steps[i])]
        if not _same(row["final_loss"], last):
            v.problems.append(f"{store.path('runs', rid + '.parquet')}: field final_loss is {row['final_loss']} but "
                              f"the last step of its history has loss {last}")


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
            from study.engine.trial import STATE_KEYS

            lacking = [k for k in STATE_KEYS if k not in sd]
            if lacking:
                raise CheckpointError(f"{wpath}: not this project's weights (no {', '.join(lacking)})")
            v.add("weights")
        except CheckpointError as e:
            v.problems.append(f"{e}; `study run` sets it aside and retrains the run")
    return runs


# ---- grids (provenance) ----------------------------------------------------------------------------
@dataclass
class _GridRec:
    sha: str
    path: str
    runs: list | None  # the grid's runs, None when it could not be expanded (or has a search)


def _check_grids(store: Store, v: Verdict, runs: dict) -> list[_GridRec]:
    """Every grid the study recorded (grids/log.jsonl), each file's hash checked; a study from before
    the record: its grid.yaml alone."""
    entries, bad = provenance.read_log(store)
    v.problems += bad
    out, seen = [], set()
    if not entries and not bad:
        raw = store.read_bytes(store.path("grid.yaml"))
        if raw is not None:
            v.underived.add("eval points of grids run before grids were recorded (only the last grid.yaml is known)")
            out.append(_GridRec("grid.yaml", store.path("grid.yaml"), _expand(v, raw, store.path("grid.yaml"))))
        return out
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
        out.append(_GridRec(sha, path, _expand(v, raw, path)))
    last = store.read_bytes(store.path("grid.yaml"))
    if entries and last is not None and provenance.grid_sha(last.decode(errors="replace")) != entries[-1]["grid"]:
        v.problems.append(f"{store.path('grid.yaml')}: not the last grid recorded in grids/log.jsonl "
                          f"({entries[-1]['grid']}): one of the two was edited")
    shas = {g.sha for g in out}
    for rid, row in sorted(runs.items()):
        g = row.get("grid")
        if g is not None and entries and g not in seen:
            v.problems.append(f"{store.path('runs', rid + '.parquet')}: field grid is {g!r}, no grid the study "
                              f"recorded ({', '.join(sorted(shas)) or 'none'})")
    return out


def _expand(v: Verdict, raw: bytes, path: str):
    try:
        grid = expand(yaml.safe_load(raw), path)
    except (GridError, yaml.YAMLError, ValueError, TypeError, AttributeError) as e:
        v.notes.append(f"{path} not expanded ({str(e).splitlines()[0][:160]}): the points it owes are taken "
                       f"from the runs' own configs")
        v.underived.add("eval points owed by a grid that no longer expands")
        return None
    if grid.search is not None:  # a search's trials are runs of their own: each owes its config's points
        return None
    return grid.runs


# ---- runs against their configs ---------------------------------------------------------------------
CONFIG_COLUMNS = ("study", "group", "task", "task_params", "K", "L_t", "schedule", "loss", "d_model", "heads", "lr",
                  "batch", "steps", "seed", "n_params", "n_params_non_embedding", "flops_per_forward", "config")
STATUSES = ("done", "failed", "pruned")


def _run_of(cfg: dict, study: str) -> Run:
    """The Run a resolved config (configs/<id>.json, runs.config) describes."""
    task_cls = TASKS[cfg["task"]["name"]][0]
    return Run(study=study, task=task_cls.model_validate({**cfg["task"], **cfg.get("task_eval", {})}),
               model=ModelConfig.model_validate(cfg["model"]), train=TrainConfig.model_validate(cfg["train"]),
               eval=EvalConfig.model_validate(cfg["eval"]), resources=Resources.model_validate(cfg["resources"]),
               retries=cfg.get("retries", 0), group=cfg.get("group"))


def _flat(d, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for k, x in d.items():
        out.update(_flat(x, f"{prefix}{k}.") if isinstance(x, dict) else {f"{prefix}{k}": x})
    return out


def _diff(a: dict, b: dict) -> list[str]:
    fa, fb = _flat(a), _flat(b)
    return [k for k in sorted(set(fa) | set(fb)) if not _equal(fa.get(k), fb.get(k))]


def _equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return a == b
    return a == b and type(a) is type(b) or (a is None and b is None)


def _check_run_configs(store: Store, v: Verdict, runs: dict, tables: dict, grids) -> dict[str, Run]:
    """run_id -> the Run its config describes, for every run whose config agrees with its id and row."""
    out = {}
    for rid, row in sorted(runs.items()):
        rpath = store.path("runs", f"{rid}.parquet")
        cpath = store.path("configs", f"{rid}.json")
        row_cfg = _row_config(v, row, rpath)
        file_cfg = _stored_config(store, v, rid, row, cpath)
        sources = [(p, c) for p, c in ((cpath, file_cfg), (rpath + " field config", row_cfg)) if c is not None]
        good = _config_of_its_id(v, rid, sources)
        if file_cfg is not None and row_cfg is not None:
            _check_configs_agree(v, row, file_cfg, row_cfg, cpath, rpath)
        if good is None:
            continue
        v.add("configs")
        where, cfg = good
        try:
            run = _run_of(cfg, store.study)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            v.problems.append(f"{where}: not a valid config ({' '.join(str(e).split())[:200]})")
            continue
        for k in _diff(json.loads(json.dumps(run.resolved(), sort_keys=True, default=str)),
                       {k: x for k, x in cfg.items() if k not in ("code_version", "grid")}):
            v.problems.append(f"{where}: field {k} is not what the config classes make of it "
                              f"({_flat(cfg).get(k)!r})")
        _check_row_columns(v, run, row, rpath)
        _check_status(store, v, rid, row, rpath)
        out[rid] = run
    return out


def _row_config(v: Verdict, row: dict, rpath: str) -> dict | None:
    """The resolved config the runs row holds (its `config` field), or None (a problem) when it is none."""
    try:
        row_cfg = json.loads(row["config"])
        if not isinstance(row_cfg, dict):
            raise ValueError("not a JSON object")
        return row_cfg
    except (TypeError, ValueError) as e:
        v.problems.append(f"{rpath}: field config is not a resolved config ({str(e)[:80]})")
        return None


def _stored_config(store: Store, v: Verdict, rid: str, row: dict, cpath: str) -> dict | None:
    """configs/<run_id>.json, or None: absent (a problem for a done run) or not a JSON object (a problem)."""
    raw = store.read_bytes(cpath)
    if raw is None:
        if row["status"] == "done":
            v.problems.append(f"{cpath}: missing: run {rid} is done, its config must be stored")
        return None
    try:
        file_cfg = json.loads(raw)
        if not isinstance(file_cfg, dict):
            raise ValueError("not a JSON object")
        return file_cfg
    except ValueError as e:
        v.problems.append(f"{cpath}: not a resolved config ({str(e)[:80]})")
        return None


def _config_of_its_id(v: Verdict, rid: str, sources: list[tuple[str, dict]]) -> tuple[str, dict] | None:
    """The first (where, config) of `sources` whose training sections hash to `rid`; each that does not
    is a problem."""
    good = None
    for where, cfg in sources:
        try:
            training = {k: cfg[k] for k in ("task", "model", "train")}
        except KeyError as e:
            v.problems.append(f"{where}: no {e.args[0]} section")
            continue
        h = config_hash(training)
        if h != rid:
            v.problems.append(f"{where}: run id {rid} is not the hash of its training config (task, model, "
                              f"train): that hashes to {h}")
            continue
        if cfg.get("run_id") != rid:
            v.problems.append(f"{where}: field run_id is {cfg.get('run_id')!r}, its file's run is {rid}")
        good = good or (where, cfg)
    return good


def _check_configs_agree(v: Verdict, row: dict, file_cfg: dict, row_cfg: dict, cpath: str, rpath: str) -> None:
    """configs/<run_id>.json says what the runs row's config says, and names the same code version and grid."""
    own = {k: x for k, x in file_cfg.items() if k not in ("code_version", "grid")}
    for k in _diff(own, row_cfg):
        v.problems.append(f"{cpath}: field {k} is {_flat(own).get(k)!r} but the runs row's config "
                          f"({rpath}) says {_flat(row_cfg).get(k)!r}")
    for k in ("code_version", "grid"):
        if k in file_cfg and file_cfg[k] != row.get(k):
            v.problems.append(f"{cpath}: field {k} is {file_cfg[k]!r} but {rpath} says {row.get(k)!r}")


def _check_row_columns(v: Verdict, run: Run, row: dict, rpath: str) -> None:
    """The runs row's config columns are those its config implies (as the trial that wrote it made them)."""
    from study.engine.trial import run_row  # the function that wrote the row

    want = run_row(run, run.costs(), status=row["status"], code_version=row["code_version"])
    for col in CONFIG_COLUMNS:
        got, exp = row.get(col), want[col]
        if col in ("config", "task_params"):
            try:
                same = json.loads(got) == json.loads(exp)
            except (TypeError, ValueError):
                same = False
        else:
            same = _equal(got, exp)
        if not same:
            shown = f"{exp!r}" if col not in ("config", "task_params") else "another value"
            v.problems.append(f"{rpath}: field {col} is {str(got)[:80]!r} but its config implies {shown}")


def _check_status(store: Store, v: Verdict, rid: str, row: dict, rpath: str) -> None:
    st = row["status"]
    if st not in STATUSES:
        v.problems.append(f"{rpath}: field status is {st!r}; a run is {', '.join(STATUSES)}")
    elif st == "done" and row["error"] is not None:
        v.problems.append(f"{rpath}: field status is 'done' but field error says {str(row['error'])[:80]!r}")
    elif st != "done" and row["error"] is None:
        has = store.exists(store.weights_path(rid))
        v.problems.append(f"{rpath}: field status is {st!r} without an error"
                          + (" although the run has final weights" if has else ""))


def _expected_points(store: Store, v: Verdict, runs: dict, rebuilt: dict, grids) -> tuple[dict, dict]:
    """(run_id -> eval keys owed, run_id -> {key: EvalPoint} known): from every recorded grid and from
    each done run's own config."""
    owed: dict[str, set[str]] = {}
    known: dict[str, dict[str, EvalPoint]] = {}
    for g in grids:
        for run in g.runs or ():
            row = runs.get(run.run_id)
            pts = {p.key: p for p in run.eval_points()}
            known.setdefault(run.run_id, {}).update(pts)
            if row is not None and row["status"] == "done":
                owed.setdefault(run.run_id, set()).update(pts)
    for rid, run in rebuilt.items():
        pts = {p.key: p for p in run.eval_points()}
        known.setdefault(rid, {}).update(pts)
        if runs[rid]["status"] == "done":
            owed.setdefault(rid, set()).update(pts)
    return owed, known


def _task_of(row: dict, cache: dict):
    key = (row["task"], row["task_params"])
    if key not in cache:
        name = row["task"]
        if name not in TASKS:
            raise ValueError(f"task {name!r} unknown here; known: {', '.join(sorted(TASKS))}")
        cache[key] = make_task(TASKS[name][0].model_validate(json.loads(row["task_params"])))
    return cache[key]


class _Counted:
    """What `sampling_cost` / `likelihood_cost` read of a model, its FLOP counting, without building one:
    RecursiveDenoiser.flops_per_forward is model.rmdm.flops_per_forward of its config and sequence spec."""

    def __init__(self, run: Run, task):
        self.cfg, self.seq_len, self.vocab = run.model, len(task.pos_ids()), task.vocab_size

    def flops_per_forward(self, n_loops: int | None = None, heads: int = 1) -> int:
        from model.rmdm import flops_per_forward

        return flops_per_forward(self.cfg, self.seq_len, self.vocab, n_loops, heads)


def _meta_model(run: Run, task) -> _Counted:
    return _Counted(run, task)


# ---- evals and samples -------------------------------------------------------------------------------
def _check_evals_and_samples(store: Store, v: Verdict, files: dict, tables: dict, runs: dict, rebuilt: dict,
                             owed: dict, known: dict) -> None:
    evals = {rel: t for (table, rel), t in tables.items() if table == "evals"}
    samples = {rel: t for (table, rel), t in tables.items() if table == "samples"}
    # every eval file, readable or not (an unreadable one is already a problem of its own)
    on_disk = {table: {rel for (tb, rel) in files if tb == table} for table in ("evals", "samples")}
    for rid in sorted({rel[0] for rels in on_disk.values() for rel in rels} - set(runs)):
        v.problems.append(f"orphan eval files under evals/{rid}/ or samples/{rid}/: no readable runs row for "
                          f"run {rid} (a run still evaluating, or left over)")
    present: dict[str, set[str]] = {}
    tasks: dict = {}
    for rel, t in sorted(evals.items()):
        rid, key = rel[0], _stem(rel[1])
        present.setdefault(rid, set()).add(key)
        path = store.path("evals", *rel)
        if any(r != rid for r in t.column("run_id").to_pylist()) or any(
                k != key for k in t.column("eval_key").to_pylist()):
            v.problems.append(f"{path}: rows of another run or eval point than its path says")
        metrics = t.column("metric").to_pylist()
        for m in sorted({m for m in metrics if metrics.count(m) > 1}):
            v.problems.append(f"{path}: {metrics.count(m)} rows of metric {m}, one expected")
        for m in sorted(_metrics_owed(rid, key, runs, owed, samples.get(rel), tasks) - set(metrics)):
            v.problems.append(f"{path}: no evals row of metric {m} (run {rid}, eval point {key})")
        if rel not in on_disk["samples"]:
            v.problems.append(f"{path}: no samples file {store.path('samples', *rel)}: its values cannot be "
                              f"derived again from per-example scores")
        row = runs.get(rid)
        if row is not None:
            _check_point(store, v, rel, t.to_pylist(), samples.get(rel), row, rebuilt.get(rid), known.get(rid, {}),
                         tasks)
    v.add("eval_files", len(evals))
    for rel in sorted(on_disk["samples"] - on_disk["evals"]):
        v.problems.append(f"orphan file {store.path('samples', *rel)}: samples without an evals file")

    for rid, keys in sorted(owed.items()):
        row = runs.get(rid)
        if row is None or row["status"] != "done":
            continue
        for key in sorted(keys - present.get(rid, set())):
            v.problems.append(f"run {rid} is done but eval point {key} has no readable evals rows")


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
        if task.eval_mode == "sample":
            out |= set(task.metric_names)
    return out


def _point_from_rows(run: Run, task, key: str, r: dict) -> EvalPoint | None:
    """The evaluation point whose key the rows' own fields (T, L_s, sampler, split, n_examples) and the
    run's eval settings give, if that is `key`: a point of a grid the study did not record."""
    sampler, _, rest = str(r["sampler"]).partition("+adaptive(")
    try:
        adaptive = float(rest.rstrip(")")) if rest else None
    except ValueError:
        return None
    for asked in ("test", "val"):
        try:
            if task.cfg.split_of(asked) != r["split"]:
                continue
            data = tuple(sorted(task.cfg.eval_fields(asked).items()))
        except (ValueError, AttributeError, KeyError):
            continue
        for n in {r["n_examples"], run.eval.n_examples}:
            pt = EvalPoint(T=r["T"], L_s=r["L_s"], sampler=sampler, temperature=run.eval.temperature,
                           remask=run.eval.remask, n_examples=n, split=r["split"], seed=run.eval.seed, data=data,
                           adaptive=adaptive)
            if pt.key == key:
                return pt
    return None


def _check_point(store: Store, v: Verdict, rel: tuple, rows: list[dict], st, row: dict, run: Run | None,
                 known: dict, tasks: dict) -> None:
    """One evals file against its evaluation point and its samples file."""
    rid, key = rel[0], _stem(rel[1])
    path, spath = store.path("evals", *rel), store.path("samples", *rel)
    if not rows:
        return
    try:
        task = _task_of(row, tasks)
    except (ValueError, TypeError) as e:
        v.problems.append(f"run {rid}: task not rebuilt from its runs row: {str(e).splitlines()[0][:160]}")
        return
    found = _point_of_key(v, path, rid, key, rows, run, task, known)
    if found is None:
        return
    pt, kind = found
    if pt is not None:
        _check_rows_at_point(v, path, key, rows, pt, kind)
    if st is None:
        return  # no samples file: a problem of its own
    checked = _checked_samples(v, spath, rid, key, rows, row, st)
    if checked is None:
        return
    srows, legacy = checked
    scores = _sample_scores(v, spath, srows)
    if scores is None:
        return
    primary = "known_words" if kind == "gen" else task.sample_score or task.primary_metric
    for s, sc in zip(srows, scores):
        if primary in sc and not _same(s["score"], sc[primary]):
            v.problems.append(f"{spath} example {s['example']}: field score is {s['score']} but its scores say "
                              f"{primary} = {sc[primary]}")
    m = len(srows)
    _check_texts(store, v, spath, srows, scores, task, row, run, kind, m, legacy)
    _check_values(v, path, spath, rows, scores, kind, legacy, task)
    if not legacy and m:
        _check_cost(v, path, spath, rows, srows, kind, pt, run, task)


def _point_of_key(v: Verdict, path: str, rid: str, key: str, rows: list[dict], run: Run | None, task,
                  known: dict) -> tuple[EvalPoint | None, str] | None:
    """(the evaluation point of eval key `key`, the kind of evaluation: sample, likelihood, gen or ext).

    The point is None for `ext` (an external puzzle file: only its digest is stored, so the key is checked
    against the rows instead). None in all (a problem) when no grid, config or row names the key."""
    from study.engine.evaluate import GEN_SUFFIX

    likelihood = task.eval_mode == "likelihood"
    kind = "sample"
    pt = known.get(key)
    if pt is None and likelihood and key.endswith(GEN_SUFFIX) and key[: -len(GEN_SUFFIX)] in known:
        pt, kind = known[key[: -len(GEN_SUFFIX)]], "gen"
    elif pt is not None and likelihood:
        kind = "likelihood"
    if pt is None and key.startswith("ext-"):
        kind = "ext"  # `study eval --puzzles`: the key names the file by its digest, and T, L_s, sampler
        v.underived.add("the puzzle file of an external evaluation (ext- keys: only its digest is stored)")
        for r in rows:
            for fld, want in (("T", f"-T{r['T']}-"), ("L_s", f"-Ls{r['L_s']}-"), ("sampler", f"-{r['sampler']}-")):
                if want not in key:
                    v.problems.append(f"{path}: field {fld} is {r[fld]!r} but the eval key {key} says otherwise")
    if pt is None and kind != "ext":
        pt = _point_from_rows(run, task, key, rows[0]) if run is not None else None
        if pt is None:
            v.problems.append(f"{path}: eval_key {key} is not the key of any evaluation point that a grid of the "
                              f"study or run {rid}'s config owes, nor of its rows' own fields (T, L_s, sampler, "
                              f"split, n_examples)")
            return None
    return pt, kind


def _check_rows_at_point(v: Verdict, path: str, key: str, rows: list[dict], pt: EvalPoint, kind: str) -> None:
    """Each evals row's T, L_s, sampler and split are its point's, and it evaluates no more examples."""
    label = pt.label if kind != "likelihood" and kind != "gen" else pt.sampler
    for r in rows:
        for fld, want in (("T", pt.T), ("L_s", pt.L_s), ("sampler", label), ("split", pt.split)):
            if r[fld] != want:
                v.problems.append(f"{path}: field {fld} is {r[fld]!r} but eval point {key} is {fld} = {want!r}")
        if kind != "gen" and r["n_examples"] is not None and r["n_examples"] > pt.n_examples:
            v.problems.append(f"{path}: field n_examples is {r['n_examples']} but eval point {key} evaluates at "
                              f"most {pt.n_examples} examples")


def _checked_samples(v: Verdict, spath: str, rid: str, key: str, rows: list[dict], row: dict,
                     st) -> tuple[list[dict], bool] | None:
    """(the samples rows by example, whether they are of an older store without per-example costs); None (a
    problem) when the examples are not 0..m-1 once each."""
    srows = sorted(st.to_pylist(), key=lambda s: (s["example"] is None, s["example"] or 0))
    m = len(srows)
    if [s["example"] for s in srows] != list(range(m)):
        v.problems.append(f"{spath}: examples are not 0..{m - 1}, one row each")
        return None
    # written before every example was stored with its cost: allowed for runs from before grids were recorded
    legacy = all(s["passes"] is None for s in srows)
    if legacy and row.get("grid") is not None:
        v.problems.append(f"{spath}: field passes is empty: a run of grid {row['grid']} stores every evaluated "
                          f"example with its cost")
        legacy = False
    if legacy:
        v.underived.add("forward_passes / eval_flops of older samples files (no per-example cost)")
    if any(s["run_id"] != rid or s["eval_key"] != key for s in srows):
        v.problems.append(f"{spath}: rows of another run or eval point than its path says")
    for s in srows:
        for fld in ("T", "L_s"):
            if s[fld] != rows[0][fld]:
                v.problems.append(f"{spath} example {s['example']}: field {fld} is {s[fld]!r}, its evals rows say "
                                  f"{rows[0][fld]!r}")
                break
    return srows, legacy


def _sample_scores(v: Verdict, spath: str, srows: list[dict]) -> list[dict] | None:
    """Each example's per-metric scores; None (a problem) at the first that is not a JSON object."""
    scores = []
    for s in srows:
        try:
            sc = json.loads(s["scores"]) if s["scores"] else None
            if not isinstance(sc, dict):
                raise ValueError
        except ValueError:
            v.problems.append(f"{spath} example {s['example']}: field scores is not a JSON object of per-metric scores")
            return None
        scores.append(sc)
    return scores


def _check_values(v: Verdict, path: str, spath: str, rows: list[dict], scores: list[dict], kind: str,
                  legacy: bool, task) -> None:
    """Each evals row's value derived again from the per-example scores, where the samples hold every example."""
    m = len(scores)
    partial = []
    for r in rows:
        if r["n_examples"] != m or (legacy and kind == "likelihood"):
            if legacy:
                partial.append(r["metric"])
            else:
                v.problems.append(f"{path}: field n_examples is {r['n_examples']} but {spath} holds {m} evaluated "
                                  f"examples")
            continue
        _check_value(v, path, r, scores, kind, task)
    if partial:
        v.underived.add("values of eval points whose samples keep only some examples (written before "
                        "per-example scores were stored for every example)")
        v.notes.append(f"{path}: {', '.join(partial)} not re-derived: its samples file is of an older store "
                       f"({m} examples kept of {rows[0]['n_examples']})")


def _check_value(v: Verdict, path: str, r: dict, scores: list[dict], kind: str, task) -> None:
    """value, ci_low, ci_high of one evals row, derived again from the per-example scores."""
    from study.engine.evaluate import likelihood_rows, metric_rows

    m = r["metric"]
    declared = {x.name: x for x in task.likelihood_metrics()}  # a likelihood point's rows: from the nats
    nats = next((x.name for x in declared.values() if x.likelihood == 1.0), None)
    if kind == "likelihood" and m in declared and all(nats in s for s in scores):
        want = likelihood_rows([s[nats] for s in scores], {}, [declared[m]])[0]
        if m != nats and all(m in s for s in scores):
            mean = sum(s[m] for s in scores) / len(scores)  # the contract: the mean of the per-example scores
            if not _same(mean, want["value"]):
                v.problems.append(f"{path}: {m} per-example scores average {mean}, not {nats} / "
                                  f"{declared[m].likelihood:.6g} = {want['value']}")
    elif kind == "likelihood" and m == "ppl" and all(nats in s for s in scores):  # older stores: exp(nll)
        nll = likelihood_rows([s[nats] for s in scores], {}, [declared[nats]])[0]
        want = {"value": math.exp(nll["value"]), "ci_low": math.exp(nll["ci_low"]), "ci_high": math.exp(nll["ci_high"])}
    elif all(m in s for s in scores):
        want = metric_rows(scores, [m], {})[0]
        if kind == "gen":
            want.update(ci_low=None, ci_high=None)  # the generations' known_words carry no interval
    else:
        v.underived.add(f"evals metric {m} (no per-example score of it)")
        v.notes.append(f"{path}: {m} not re-derived: the samples carry no per-example {m}")
        return
    v.add("metrics_recomputed")
    for fld in ("value", "ci_low", "ci_high"):
        if not _same(r[fld], want[fld]):
            v.problems.append(f"{path}: field {fld} of {m} is {r[fld]} but the {len(scores)} per-example scores "
                              f"give {want[fld]}")


def _check_cost(v: Verdict, path: str, spath: str, rows: list[dict], srows: list[dict], kind: str, pt, run, task):
    """forward_passes, forward_passes_mean and eval_flops derived again from the per-example cost."""
    if run is None:
        v.underived.add("evaluation cost of runs whose config is unusable")
        return
    model = _meta_model(run, task)
    if kind == "likelihood":
        from study.engine.evaluate import likelihood_cost

        n_t = len(task.t_values())
        want = likelihood_cost(model, n_t, rows[0]["L_s"], len(srows))
        want["forward_passes_mean"] = None
        for s in srows:
            if s["passes"] != n_t * rows[0]["L_s"]:
                v.problems.append(f"{spath} example {s['example']}: field passes is {s['passes']}, the bound runs "
                                  f"n_t x L_s = {n_t * rows[0]['L_s']}")
                break
    else:
        from model.sampler import Sampled
        from study.engine.evaluate import sampling_cost

        if any(s["passes"] is None or s["steps"] is None for s in srows):
            v.problems.append(f"{spath}: per-example passes or steps missing: the evaluation cost cannot be derived")
            return
        adaptive = pt.adaptive if pt is not None and kind != "ext" else None
        L_s = rows[0]["L_s"]
        steps = torch.tensor([s["steps"] for s in srows])
        passes = torch.tensor([s["passes"] for s in srows])
        if adaptive is None:
            for s in srows:
                if s["passes"] != s["steps"] * L_s:
                    v.problems.append(f"{spath} example {s['example']}: field passes is {s['passes']} but "
                                      f"{s['steps']} steps at L_s = {L_s} run {s['steps'] * L_s}")
                    break
            if pt is not None and any(s["steps"] > pt.T for s in srows):
                v.problems.append(f"{spath}: field steps exceeds T = {pt.T}")
        got = Sampled(x=torch.empty(0), steps=steps, loops=L_s,
                      step_loops=None if adaptive is None else passes[:, None], adaptive=adaptive)
        want = sampling_cost(model, got)
    for r in rows:
        if kind == "likelihood" and task.metric_of(r["metric"]) is None:
            continue  # an older store's generations row inside the likelihood point
        for fld in ("forward_passes", "eval_flops", "forward_passes_mean"):
            if fld == "forward_passes_mean" and (r[fld] is None and want[fld] is None):
                continue
            if not _same(r[fld], want[fld]):
                v.problems.append(f"{path}: field {fld} of {r['metric']} is {r[fld]} but the per-example cost in "
                                  f"{spath} gives {want[fld]}")


def _check_texts(store: Store, v: Verdict, spath: str, srows: list[dict], scores: list[dict], task, row: dict,
                 run: Run | None, kind: str, m: int, legacy: bool) -> None:
    """The kept outputs: a prefix of the examples, as many as the config keeps; each re-scored."""
    textual = [s for s in srows if s["output"] is not None or s["reference"] is not None]
    k = len(textual)
    if [s["example"] for s in textual] != list(range(k)):
        v.problems.append(f"{spath}: the examples with kept text are not the first {k}")
    if run is not None and kind in ("sample", "likelihood") and not legacy:
        want = min(run.eval.n_samples_kept, m)
        if k != want:
            v.problems.append(f"{spath}: text kept for {k} examples but the config keeps n_samples_kept = "
                              f"{run.eval.n_samples_kept} of {m}")
    if kind in ("likelihood", "gen"):
        if kind == "likelihood":
            v.underived.add("per-sequence likelihood bounds (recomputing them needs the model: `study eval`)")
        elif k:
            v.underived.add(f"{row['task']} per-example scores (no text re-scorer for this task)")
        v.add("scores_as_stored", m)
        return
    if not _rescore_file(v, spath, [s for s in textual if s["output"] is not None], scores, task):
        v.add("scores_as_stored", m)
        return
    v.add("scores_as_stored", m - k)
    if m - k:
        v.underived.add("per-example scores of examples whose outputs were not kept (taken as stored)")


def _rescore_file(v: Verdict, path: str, rows: list[dict], scores: list[dict], task) -> bool:
    """Re-score the kept outputs from their text (Task.rescore); each must match its stored per-metric
    scores. False when the task cannot re-score from text (named among what is not re-derived)."""
    for r in rows:
        where = f"{path} example {r['example']}"
        try:
            s = task.rescore(r["input"], r["output"], r["reference"])
        except NotRescorable as e:
            v.underived.add(str(e))
            return False
        except (ValueError, IndexError, TypeError) as e:
            v.problems.append(f"{where}: output does not re-score: {str(e).splitlines()[0][:160]}")
            continue
        v.add("samples")
        stored = scores[r["example"]]
        primary = s.get(task.primary_metric)
        if primary is not None and not _same(r["score"], primary):
            v.problems.append(f"{where}: stored score {r['score']} but its output re-scores to {primary} "
                              f"({task.primary_metric}; output {str(r['output'])[:60]!r})")
        for m, val in s.items():
            if m in stored and m != task.primary_metric and not _same(stored[m], val):
                v.problems.append(f"{where}: stored {m} {stored[m]} but re-scored {val}")
    return True


# ---- the read index ----------------------------------------------------------------------------------
def _check_index(store: Store, v: Verdict, files: dict, tables: dict) -> None:
    """Every entry of _index/<table>.parquet that a reader would trust (its file listed with the same size
    and mtime) must hold exactly that file's rows (or, for samples, its row count)."""
    for table, schema in SCHEMAS.items():
        idx = index.load_index(store, table, schema)
        if idx is None or not idx.num_rows:
            continue
        ipath = f"{store.dir}/{index.INDEX_DIR}/{table}.parquet"
        listing = {i.path[len(store.dir) + len(table) + 2:]: i for i in index.list_files(store, table)}
        names = idx["_file"].to_pylist()
        sizes, mtimes = idx["_size"].to_pylist(), idx["_mtime_ns"].to_pylist()
        crcs = idx["_crc"].to_pylist() if "_crc" in idx.column_names else [None] * len(names)
        starts: dict[str, list[int]] = {}
        for r, name in enumerate(names):
            starts.setdefault(name, []).append(r)
        for name, rs in sorted(starts.items()):
            info = listing.get(name)
            if info is None or (sizes[rs[0]], mtimes[rs[0]]) != index._ident(info):
                continue  # stale: readers read the file itself
            if store.local and crcs[rs[0]] is not None and hasattr(index, "_read_tail_crc") and \
                    index._read_tail_crc(info.path, int(info.size or 0)) != crcs[rs[0]]:
                continue  # changed in place: readers read the file itself (and so does this check)
            t = tables.get((table, tuple(name.split("/"))))
            if t is None:
                continue  # unreadable: reported with the file
            v.add("index_entries")
            if table not in index.ROWS_TABLES:
                n = idx["_rows"][rs[0]].as_py()
                if n != t.num_rows:
                    v.problems.append(f"{ipath}: entry {name}: field _rows is {n} but the file holds {t.num_rows}")
                continue
            if rs != list(range(rs[0], rs[0] + len(rs))):
                v.problems.append(f"{ipath}: entry {name}: rows not contiguous (an edited index)")
                continue
            body = idx.slice(rs[0], len(rs)).drop_columns([n for n, _ in index.META])
            if body.num_rows == t.num_rows and body.equals(t):
                continue
            if body.num_rows != t.num_rows:
                v.problems.append(f"{ipath}: entry {name} holds {body.num_rows} rows, the file {t.num_rows}")
                continue
            for col in schema.names:
                a, b = body.column(col).to_pylist(), t.column(col).to_pylist()
                if any(not _equal(x, y) for x, y in zip(a, b)):
                    i = next(i for i, (x, y) in enumerate(zip(a, b)) if not _equal(x, y))
                    v.problems.append(f"{ipath}: entry {name} row {i}: field {col} is {str(a[i])[:60]!r} but the "
                                      f"file says {str(b[i])[:60]!r} (readers of the index would see the former)")


# ---- histories -------------------------------------------------------------------------------------
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
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=TOL, abs_tol=TOL)


# ---- what interrupted writes and damage leave behind ------------------------------------------------
def _check_leftovers(store: Store, v: Verdict) -> None:
    """Temp files of writes that never finished, cached task data that does not load, files that exist but
    cannot be read (a directory or a dangling link in a file's place); files set aside in quarantine/ are
    noted (kept, never deleted)."""
    import time

    from store import QUARANTINE, TEMP_AGE_S
    from study.engine.trial import damaged_data

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
