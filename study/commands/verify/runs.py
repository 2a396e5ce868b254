"""The runs: one row per id; each against its config (configs/<id>.json and the row's `config` hash to the id
and agree field by field; every column the config implies is what the trial that wrote the row makes of it;
the status agrees with the error); a done run's final weights (present, this project's, read without torch by
model/checkpoint_meta.py, the bytes its row recorded, of the shapes its config makes; `--deep` loads them with
torch); what each runs row and eval point recorded of itself when written (store/digest.py: row_sha256,
history_sha256, point_sha256, weights_sha256); the histories, monotone within an attempt, and a done run's
final loss that of its history."""
from __future__ import annotations

import json

from atomicio import loads_json
from model.checkpoint_meta import CheckpointError, read_state_meta
from model.config import ModelConfig, TrainConfig
from model.costs import param_shapes
from store.digest import edited_point, row_sha256, rows_sha256, weights_mismatch
from study.commands.verify.context import Context, Verdict, diff, equal, flat, same, stem
from study.spec.grid import EvalConfig, Resources, Run, config_hash
from tasks import TASKS, check_registered


def check_runs(c: Context) -> None:
    """One runs row per id, of its own id; every run's task registered (UnknownTask, exit 2, where not)."""
    store, v, runs = c.store, c.v, c.runs
    for (table, rel), t in c.tables.items():
        if table != "runs":
            continue
        rid, rows = stem(rel[0]), t.to_pylist()
        path = store.path("runs", rel[0])
        if len(rows) != 1:
            v.problems.append(f"{path}: {len(rows)} rows, one runs row per id expected")
        if rows:
            runs[rid] = rows[-1]
    v.add("runs", len(runs))
    check_registered(r["task"] for r in runs.values())  # a plugin's task not registered


CONFIG_COLUMNS = ("study", "group", "task", "task_params", "K", "L_t", "schedule", "loss", "d_model", "heads", "lr",
                  "batch", "steps", "seed", "n_params", "n_params_non_embedding", "flops_per_forward", "config")


STATUSES = ("done", "failed", "pruned")


def run_of_config(cfg: dict, study: str) -> Run:
    """The Run a resolved config (configs/<id>.json, runs.config) describes."""
    task_cls = TASKS[cfg["task"]["name"]][0]
    return Run(study=study, task=task_cls.model_validate({**cfg["task"], **cfg.get("task_eval", {})}),
               model=ModelConfig.model_validate(cfg["model"]), train=TrainConfig.model_validate(cfg["train"]),
               eval=EvalConfig.model_validate(cfg["eval"]), resources=Resources.model_validate(cfg["resources"]),
               retries=cfg.get("retries", 0), group=cfg.get("group"))


def check_run_configs(c: Context) -> None:
    """c.rebuilt: run_id -> the Run its config describes, for every run whose config agrees with its id and row."""
    store, v, runs, out = c.store, c.v, c.runs, c.rebuilt
    for rid, row in sorted(runs.items()):
        rpath = store.path("runs", f"{rid}.parquet")
        cpath = store.path("configs", f"{rid}.json")
        row_cfg = _config(v, json.loads, row["config"], f"{rpath}: field config is")
        raw = store.read_bytes(cpath)  # configs/<run_id>.json: absent is a problem for a done run
        file_cfg = _config(v, loads_json, raw, f"{cpath}:") if raw is not None else None
        if raw is None and row["status"] == "done":
            v.problems.append(f"{cpath}: missing: run {rid} is done, its config must be stored")
        sources = [(p, c) for p, c in ((cpath, file_cfg), (rpath + " field config", row_cfg)) if c is not None]
        good = _config_of_its_id(v, rid, sources)
        if file_cfg is not None and row_cfg is not None:
            _check_configs_agree(v, row, file_cfg, row_cfg, cpath, rpath)
        if good is None:
            continue
        v.add("configs")
        where, cfg = good
        try:
            run = run_of_config(cfg, store.study)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            v.problems.append(f"{where}: not a valid config ({' '.join(str(e).split())[:200]})")
            continue
        for k in diff(json.loads(json.dumps(run.resolved(), sort_keys=True, default=str)),
                       {k: x for k, x in cfg.items() if k not in ("code_version", "grid")}):
            v.problems.append(f"{where}: field {k} is not what the config classes make of it "
                              f"({flat(cfg).get(k)!r})")
        _check_row_columns(v, run, row, rpath)
        _check_status(c, rid, row, rpath)
        out[rid] = run


def _config(v: Verdict, load, text, where: str) -> dict | None:
    """The resolved config `load(text)` gives, or None (a problem, said of `where`) when it is none."""
    try:
        cfg = load(text)
        if not isinstance(cfg, dict):
            raise ValueError("not a JSON object")
        return cfg
    except (TypeError, ValueError) as e:
        v.problems.append(f"{where} not a resolved config ({str(e)[:80]})")
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
    for k in diff(own, row_cfg):
        v.problems.append(f"{cpath}: field {k} is {flat(own).get(k)!r} but the runs row's config "
                          f"({rpath}) says {flat(row_cfg).get(k)!r}")
    for k in ("code_version", "grid"):
        if k in file_cfg and file_cfg[k] != row.get(k):
            v.problems.append(f"{cpath}: field {k} is {file_cfg[k]!r} but {rpath} says {row.get(k)!r}")


def _check_row_columns(v: Verdict, run: Run, row: dict, rpath: str) -> None:
    """The runs row's config columns are those its config implies (as the trial that wrote it made them)."""
    from study.engine.rows import run_row  # the function that wrote the row

    want = run_row(run, run.costs(), status=row["status"], code_version=row["code_version"])
    for col in CONFIG_COLUMNS:
        got, exp = row.get(col), want[col]
        if col in ("config", "task_params"):
            try:
                same = json.loads(got) == json.loads(exp)
            except (TypeError, ValueError):
                same = False
        else:
            same = equal(got, exp)
        if not same:
            shown = f"{exp!r}" if col not in ("config", "task_params") else "another value"
            v.problems.append(f"{rpath}: field {col} is {str(got)[:80]!r} but its config implies {shown}")


def _check_status(c: Context, rid: str, row: dict, rpath: str) -> None:
    store, v = c.store, c.v
    st = row["status"]
    if st not in STATUSES:
        v.problems.append(f"{rpath}: field status is {st!r}; a run is {', '.join(STATUSES)}")
    elif st == "done" and row["error"] is not None:
        v.problems.append(f"{rpath}: field status is 'done' but field error says {str(row['error'])[:80]!r}")
    elif st != "done" and row.get("weights_sha256") is not None:
        v.problems.append(f"{rpath}: field status is {st!r} but field weights_sha256 records final weights: only "
                          f"the row of a run that finished (done) records them")
    elif st != "done" and row["error"] is None:
        has = store.exists(store.weights_path(rid))
        v.problems.append(f"{rpath}: field status is {st!r} without an error"
                          + (" although the run has final weights" if has else ""))


def check_weights(c: Context) -> None:
    """Each done run's weights, read without torch (read_state_meta)."""
    from study.engine.rows import STATE_KEYS

    store, v = c.store, c.v
    for rid, row in sorted(c.runs.items()):
        if row["status"] != "done":
            continue
        v.add("done")
        wpath = store.weights_path(rid)
        data = store.read_bytes(wpath)
        if data is None:
            v.problems.append(f"run {rid} is done but has no weights ({wpath})")
            continue
        try:
            sd = read_state_meta(data, wpath)
            lacking = [k for k in STATE_KEYS if k not in sd]
            if lacking:
                raise CheckpointError(f"{wpath}: not this project's weights (no {', '.join(lacking)})")
            v.add("weights")
        except CheckpointError as e:
            v.problems.append(f"{e}; `study run` sets it aside and retrains the run")
            continue
        if row.get("weights_sha256") is None:
            v.problems.append(f"{store.path('runs', f'{rid}.parquet')}: field weights_sha256 is empty: run {rid} "
                              f"is done and its weights are there")
        bad = weights_mismatch(wpath, data, row)
        if bad:
            v.problems.append(f"{bad}; `study run` sets it aside and retrains the run")
        _check_shapes(c, rid, wpath, sd["model"])


def _check_shapes(c: Context, rid: str, wpath: str, got) -> None:
    """The weights' tensors are the ones run `rid`'s config makes: the same names, each of the same shape."""
    run = c.rebuilt.get(rid)
    if run is None:
        c.v.underived.add("weights' shapes of runs whose config is unusable")
        return
    try:
        task = c.task_of(c.runs[rid])
        want = param_shapes(run.model, task.vocab_size, task.pos_sizes())  # name -> shape, without torch
    except (ValueError, TypeError) as e:
        c.v.problems.append(f"run {rid}: task not rebuilt from its runs row: {str(e).splitlines()[0][:160]}")
        return
    m = run.model
    shape = f"K {m.K}, L {m.L}, d_model {m.d_model}"
    if not isinstance(got, dict):
        c.v.problems.append(f"{wpath}: field model is not a state dict of tensors")
        return
    names = set(got)
    for k in sorted(names ^ set(want))[:1]:
        where = "holds" if k in names else "lacks"
        c.v.problems.append(f"{wpath}: field model {where} parameter {k}: not the model run {rid}'s config ({shape}) "
                            f"makes ({len(names)} tensors, the config makes {len(want)}): another run's weights?")
    for k in sorted(names & set(want)):
        s = tuple(getattr(got[k], "shape", ()))
        if s != want[k]:
            c.v.problems.append(f"{wpath}: field model.{k} has shape {s}, the model run {rid}'s config ({shape}) "
                                f"makes {want[k]}: another run's weights?")
            break


def check_digests(c: Context) -> None:
    store, v = c.store, c.v
    for rid, row in sorted(c.runs.items()):
        rpath = store.path("runs", f"{rid}.parquet")
        want = row.get("row_sha256")
        if want is None:
            v.problems.append(f"{rpath}: field row_sha256 is empty: every runs row of this store format records it")
        elif row_sha256(row) != want:
            v.problems.append(f"{rpath}: field row_sha256 is {want[:16]}... but the row's fields hash to "
                              f"{row_sha256(row)[:16]}...: the row was edited after it was written (status "
                              f"{row['status']!r}, final_loss {row['final_loss']})")
        if row["status"] == "done":
            _check_history(c, rid, row, rpath)
    for (table, rel), t in sorted(c.tables.items()):
        if table == "evals" and t.num_rows:
            _check_point(c, rel, t)


def _check_point(c: Context, rel: tuple[str, ...], t) -> None:
    path, rows, run = c.store.path("evals", *rel), t.to_pylist(), c.runs.get(rel[0]) or {}
    why = edited_point(rows)
    if why:
        c.v.problems.append(f"{path}: {why}")
    want = run.get("weights_sha256")
    other = sorted({r["weights_sha256"] for r in rows} - {None, want}) if want else []
    if other:
        c.v.problems.append(f"{path}: field weights_sha256 is {other[0][:16]}..., but run {rel[0]}'s final weights "
                            f"hash to {want[:16]}... (its runs row): scored from other weights (another run's "
                            f"evaluations, another seed's, copied under this run's id?)")


def _check_history(c: Context, rid: str, row: dict, rpath: str) -> None:
    """A done run's history is present and (where its row recorded it) holds exactly the rows written."""
    hpath = c.store.path("history", f"{rid}.parquet")
    t = c.tables.get(("history", (f"{rid}.parquet",)))
    want = row.get("history_sha256")
    if t is None:
        if ("history", (f"{rid}.parquet",)) not in c.files:  # unreadable files are problems of their own
            recorded = f" (its runs row's field history_sha256 records {want[:16]}...)" if want else ""
            c.v.problems.append(f"{hpath}: missing: run {rid} is done, its training history must be stored"
                                f"{recorded}; `study run` rewrites it from the final weights")
        return
    if want is None:
        c.v.problems.append(f"{rpath}: field history_sha256 is empty: run {rid} is done and its history is there")
        return
    got = rows_sha256(t.to_pylist())
    if got != want:
        c.v.problems.append(f"{hpath}: its rows hash to {got[:16]}..., not to {rpath} field history_sha256 "
                            f"({want[:16]}...): the history was edited after the run finished")


def check_histories(c: Context) -> None:
    """Each history file monotone in step and time within an attempt; a done run's final_loss the loss of the
    last step of its history."""
    v, tables = c.v, c.tables
    for (table, rel), t in sorted(tables.items()):
        if table != "history":
            continue
        v.add("histories")
        rows, row = t.to_pylist(), c.runs.get(stem(rel[0]))
        if row is not None and row["status"] == "done" and rows:
            last_loss = max(rows, key=lambda r: r["step"])["loss"]
            if not same(row["final_loss"], last_loss):
                v.problems.append(f"{c.store.path('runs', rel[0])}: field final_loss is {row['final_loss']} "
                                  f"but the last step of its history has loss {last_loss}")
        last: dict = {}
        for r in rows:
            a = r["attempt"]
            prev = last.get(a)
            if prev is not None and (r["step"] <= prev["step"] or (
                    r["seconds"] is not None and prev["seconds"] is not None and r["seconds"] < prev["seconds"])):
                v.problems.append(f"history/{rel[0]}: attempt {a}: step {r['step']} (at {r['seconds']} s) "
                                  f"after step {prev['step']} (at {prev['seconds']} s): not monotone")
                break
            last[a] = r
