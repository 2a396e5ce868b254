"""Each run against its config: configs/<id>.json and the row's `config` hash to the id and agree field
by field; every column the config implies is what the trial that wrote the row makes of it; the status
agrees with the error."""
from __future__ import annotations

import json

from atomicio import loads_json
from model.config import ModelConfig, TrainConfig
from study.commands.verify.context import Context, Verdict, diff, equal, flat
from study.spec.grid import EvalConfig, Resources, Run, config_hash
from tasks import TASKS


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
        row_cfg = _row_config(v, row, rpath)
        file_cfg = _stored_config(c, rid, row, cpath)
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


def _stored_config(c: Context, rid: str, row: dict, cpath: str) -> dict | None:
    """configs/<run_id>.json, or None: absent (a problem for a done run) or not a JSON object (a problem)."""
    store, v = c.store, c.v
    raw = store.read_bytes(cpath)
    if raw is None:
        if row["status"] == "done":
            v.problems.append(f"{cpath}: missing: run {rid} is done, its config must be stored")
        return None
    try:
        file_cfg = loads_json(raw)
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
