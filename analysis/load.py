"""Read a study's tables from the results store (the only thing `analysis` reads)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd
import pyarrow.fs as pafs

import tasks
from atomicio import loads_json
from store import Store, index, list_studies

# columns of a run that the figures and tables read, the registered tasks' own run columns (tasks.run_column_names,
# None in the runs of other tasks) after task_variant; model_key (below) is what tells models apart
GENERIC_RUN_COLS = ("K", "L_t", "schedule", "loss", "d_model", "heads", "lr", "batch", "steps", "seed", "n_params",
                    "n_params_non_embedding", "flops_per_forward", "status", "model_key")


def run_cols() -> list[str]:
    return ["run_id", "task", "task_variant", *tasks.run_column_names(), *GENERIC_RUN_COLS]


# What identifies a model: model_key, the run's whole resolved training configuration (task, model and
# train sections) minus the seed, so two runs are seeds of one model only when everything else is equal.
# The readable columns before it are functions of it, kept for grouping and labels.
MODEL_KEYS = ["task", "task_variant", "K", "L_t", "schedule", "loss", "d_model", "heads", "lr", "batch", "steps",
              "model_key"]
TRAINING_SECTIONS = ("task", "model", "train")
SEED_FIELD = "train.seed"
# train fields that cannot change the weights (checkpoint and log cadence); older configs may hold them
BOOKKEEPING_FIELDS = {"train.checkpoint_every", "train.log_every"}
# a run without a stored config (or a partial one) is identified by its columns, under the config's names
COLUMN_FIELDS = {"task": "task.name", "K": "model.K", "L_t": "model.L", "d_model": "model.d_model",
                 "heads": "model.n_heads", "lr": "train.lr", "batch": "train.batch_size", "steps": "train.steps",
                 "schedule": "train.schedule", "loss": "train.loss", "seed": SEED_FIELD}


# one evaluation point of one run: the analysis holds one evals row per point (dedupe_evals)
EVAL_POINT = ["run_id", "T", "L_s", "sampler", "split", "metric"]
CONTINUOUS_SAMPLER = "likelihood"  # the sampler column of the continuous quantities' rows (nll-test, nll-val)


class MissingData(ValueError):
    """The store lacks what a figure needs; the message says what."""


@dataclass
class StudyData:
    """Everything a report needs, read once from one study's directory."""

    name: str
    dir: str
    runs: pd.DataFrame  # one row per run, with task_variant and the tasks' run columns derived from task_params
    evals: pd.DataFrame  # evals joined with run_cols() of their run
    history: pd.DataFrame  # the history table (store names: loss, L_t, lr of each step) and the run columns it lacks
    grid_text: str | None = None  # results/<study>/grid.yaml as last run
    configs: dict[str, dict] = field(default_factory=dict)  # run_id -> configs/<run_id>.json
    config_texts: dict[str, str] = field(default_factory=dict)  # run_id -> that file's text, as read
    store: Store | None = None
    # runs left out: a newer run has the same whole training configuration, seed included (a retraining
    # under another id); columns run_id, kept (the run analysed instead), reason
    superseded: pd.DataFrame | None = None
    # evaluation rows left out (dedupe_evals): an older or smaller evaluation of a point another row holds;
    # columns EVAL_POINT, eval_key, n_examples, created_at, kept (the eval_key analysed instead), reason
    left_out_evals: pd.DataFrame | None = None
    # runs left out because they did not finish (status failed, pruned, running...): only done runs are
    # analysed; columns run_id, task_variant, model, seed, status, error
    not_done: pd.DataFrame | None = None
    # the continuous quantities (study.engine.evaluate.evaluate_nll: metrics elbo and ref_nll, sampler 'likelihood',
    # T = 0), kept out of `evals`, whose figures and tables are of sampled metrics; the ladder law reads them
    continuous: pd.DataFrame | None = None


def latest_study(results: str) -> str:
    studies = list_studies(results)
    if not studies:
        raise MissingData(f"no study with results under {results!r}")
    return studies[-1][0]


def load_study(results: str, study: str | None = None) -> StudyData:
    """Read runs, evals, history, the grid and the per-run configs of a study (default: the newest)."""
    if study is None:
        study = latest_study(results)
    store = Store(results, study)
    store.refuse_links_out()  # nothing is read through a symlink out of the store (OutsideStore)
    runs = store.read("runs")
    if runs.empty:
        known = ", ".join(s for s, _ in list_studies(results)) or "none"
        bad = "".join(f"; unreadable, skipped: {p} ({why})" for p, why in sorted(store.unreadable.items()))
        raise MissingData(f"study {study!r} has no runs in {store.dir} (studies with runs: {known}){bad}")
    tasks.check_registered(runs["task"].dropna())  # a plugin's task not registered: UnknownTask, nothing drawn
    *_, hist, edited = store.read_history(dict(zip(runs.run_id, runs.history_sha256)))
    rows = set(runs["run_id"])
    runs = runs[~runs["run_id"].isin(edited)]  # named in store.unreadable
    configs, config_texts = _configs(store)
    runs, superseded = drop_superseded(_identify(enrich_runs(runs), configs))
    runs, not_done = drop_not_done(runs)
    if runs.empty:
        raise MissingData(f"study {study!r} has no finished run in {store.dir}: only done runs are analysed "
                          f"({not_done_summary(not_done)})")
    cols = run_cols()
    evals = store.read("evals")
    for rid in sorted(set(evals["run_id"]) - rows):  # evaluations of a run without a readable row: named, not drawn
        store.unreadable.setdefault(store.path("runs", f"{rid}.parquet"), "missing, but its evaluations are "
                                    "there: a run still evaluating, or its row deleted")
    evals = evals.merge(runs[cols], on="run_id", how="inner")
    likelihoods = evals["sampler"] == CONTINUOUS_SAMPLER
    sampled = evals[~likelihoods] if likelihoods.any() else evals  # (no copy of 40,000 rows when none is)
    continuous, (evals, left_evals) = evals[likelihoods], dedupe_evals(sampled)
    history = with_run_columns(hist.to_pandas(), runs)
    grid = store.read_bytes(store.path("grid.yaml"))
    return StudyData(name=study, dir=store.dir, runs=runs, evals=evals, history=history,
                     grid_text=grid.decode("utf-8", "replace") if grid is not None else None,
                     configs=configs, config_texts=config_texts, store=store, superseded=superseded, left_out_evals=left_evals,
                     continuous=continuous,
                     not_done=not_done)


def not_done_summary(not_done: pd.DataFrame | None) -> str:
    """'2 failed: a, b; 1 pruned: c' (empty when every run is done)."""
    if not_done is None or not_done.empty:
        return ""
    return "; ".join(f"{len(g)} {status}: {', '.join(g['run_id'])}" for status, g in not_done.groupby("status"))


NOT_DONE_COLUMNS = ["run_id", "task_variant", "model", "seed", "status", "error"]


def drop_not_done(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs whose status is done, the others: NOT_DONE_COLUMNS). A failed or pruned run's rows (its
    evaluations at a checkpoint, its partial curve) are never averaged in; the report lists the run."""
    done = runs["status"].eq("done")
    left = runs.loc[~done]
    out = pd.DataFrame({"run_id": left["run_id"], "task_variant": left["task_variant"],
                        "model": [f"({k} x {l})" for k, l in zip(left["K"], left["L_t"])], "seed": left["seed"],
                        "status": left["status"].fillna("unknown"),
                        "error": left["error"]}, columns=NOT_DONE_COLUMNS)
    return runs.loc[done].reset_index(drop=True), out.sort_values("run_id").reset_index(drop=True)


def with_run_columns(rows: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """A table's rows (the store's names, kept) with the columns of their run that the table lacks: no
    name means two things and a join leaves no _x/_y. In history, `loss` is the training loss, `L_t` the
    depth of that step and `lr` the step's learning rate; the run's loss variant, training depth and
    configured lr are in the runs table under the same names (docs/guide/schema.md)."""
    if rows.empty:
        return rows
    extra = [c for c in run_cols() if c == "run_id" or c not in rows.columns]
    return rows.merge(runs[extra], on="run_id", how="inner")


def training_curves(data: "StudyData") -> pd.DataFrame:
    """History rows as the training-curves figure reads them: the step's values as train_loss, depth and
    lr_x beside every column of the run (the run's loss variant, L_t and configured lr as loss, L_t, lr_y)."""
    h = data.history
    if h is None or h.empty:
        return h
    cols = run_cols()
    own = [c for c in h.columns if c == "run_id" or c not in cols or c in ("loss", "L_t", "lr")]
    return (h[own].rename(columns={"L_t": "depth", "loss": "train_loss"})
            .merge(data.runs[cols], on="run_id", how="inner"))


def dedupe_evals(evals: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one evals row per EVAL_POINT, the rows left out with the eval_key kept instead and why).

    A store can hold one point of one run under several eval keys: the key names every field that
    changes an evaluation, so a key scheme that grew (or a grid that changed n_examples, temperature...)
    evaluates the point again under a new key, and the old file stays. Those rows are never averaged
    (that would count one model's evaluation twice, or mix two evaluations of different sizes):
    - rows with equal n_examples: the newest (created_at) is kept, the older listed as
      "an older evaluation of the same point";
    - rows with different n_examples are distinct evaluations: the one with the most examples is kept
      (the tightest interval; the newest of those), the others listed as "fewer examples".
    Fields the evals table does not hold (temperature, sampler seed) cannot tell rows apart: the rule
    above applies to them too.
    """
    cols = ["run_id", "eval_key", "T", "L_s", "sampler", "split", "metric", "n_examples", "created_at", "kept",
            "reason"]
    if evals.empty:
        return evals, pd.DataFrame(columns=cols)
    # only the columns that decide are sorted (not the 35 of the table: each costs a take at 40,000 rows)
    order = evals[[*EVAL_POINT, "n_examples", "created_at"]].sort_values(["n_examples", "created_at"], kind="stable",
                                                                         na_position="first")
    last = order.groupby(EVAL_POINT, sort=False, dropna=False).tail(1).index
    # the usual case: one row per point (no record-by-record pass, no copy of the whole table)
    if len(last) == len(evals) and evals.index.is_unique:
        return evals.reset_index(drop=True), pd.DataFrame(columns=cols)
    kept = evals.loc[evals.index.isin(last)]
    left = evals.loc[~evals.index.isin(last)]

    def point(r: dict) -> tuple:
        return tuple(None if pd.isna(r[k]) else r[k] for k in EVAL_POINT)

    winner = {point(r): r for r in kept.to_dict("records")}
    rows = []
    for r in left.to_dict("records"):
        w = winner[point(r)]
        if r["n_examples"] == w["n_examples"]:
            why = (f"an older evaluation of the same point (T, L_s, sampler, split, metric, {r['n_examples']} "
                   f"examples): {w['eval_key']} of {w['created_at']} is newer, analysed instead")
        else:
            why = (f"fewer examples ({r['n_examples']}) than {w['eval_key']} ({w['n_examples']}) at the same point "
                   "(T, L_s, sampler, split, metric): two evaluations of different sizes are never averaged; "
                   "the larger is analysed")
        rows.append({**{c: r.get(c) for c in cols[:-2]}, "kept": w["eval_key"], "reason": why})
    return kept.reset_index(drop=True), pd.DataFrame(rows, columns=cols)


def drop_superseded(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs to analyse, runs left out with the run kept instead and why).

    Only runs whose whole training configurations are equal, seed included, supersede each other (a
    retraining under another id, e.g. after the id's hash changed); of those the newest finished one is
    kept (the newest of all if none finished): averaging them as seeds would count one seed twice.
    Runs that differ in any training field are different models or seeds and are all kept.
    """
    order = runs.assign(_done=runs["status"].eq("done")).sort_values(["_done", "created_at"], kind="stable")
    kept_id = order.groupby("run_key", sort=False)["run_id"].transform("last").reindex(runs.index)
    dropped = kept_id != runs["run_id"]
    status = dict(zip(runs["run_id"], runs["status"]))
    left = runs.loc[dropped, ["run_id", "status", "created_at"]].assign(kept=kept_id[dropped])
    left["reason"] = [f"same training configuration and seed as {k} ({'finished' if status[k] == 'done' else 'newer'}"
                      "), analysed instead: a retraining under another id" for k in left["kept"]]
    return (runs.loc[~dropped].drop(columns="run_key").reset_index(drop=True),
            left[["run_id", "kept", "status", "created_at", "reason"]].reset_index(drop=True))


def training_fields(run: dict, config: dict | None) -> dict:
    """The run's training configuration as flat dotted fields ("train.truncate_k": 2), seed included.

    From the stored resolved config when it has every training section; else from the run's columns.
    """
    if config and all(isinstance(config.get(s), dict) for s in TRAINING_SECTIONS):
        flat: dict = {}
        for section in TRAINING_SECTIONS:
            _flatten(config[section], section, flat)
        return {k: v for k, v in flat.items() if k not in BOOKKEEPING_FIELDS}
    flat = {f: _plain(run.get(c)) for c, f in COLUMN_FIELDS.items()}
    params = run.get("task_params")
    if isinstance(params, str) and params:
        _flatten(json.loads(params), "task", flat)
    return flat


def _flatten(d: dict, prefix: str, out: dict) -> None:
    for k, v in d.items():
        if isinstance(v, dict):
            _flatten(v, f"{prefix}.{k}", out)
        else:
            out[f"{prefix}.{k}"] = _plain(v)


def _plain(v):
    """JSON-stable value: numpy numbers as Python ones, tuples as lists."""
    if hasattr(v, "item") and not isinstance(v, (list, tuple, str)):
        v = v.item()
    return list(v) if isinstance(v, tuple) else v


def model_key(fields: dict) -> str:
    """Canonical text of a model's identity: its training fields minus the seed (seeds are aggregated)."""
    return json.dumps({k: v for k, v in fields.items() if k != SEED_FIELD}, sort_keys=True, default=str)


def _identify(runs: pd.DataFrame, configs: dict[str, dict]) -> pd.DataFrame:
    """Add model_key (identity minus the seed) and run_key (identity with the seed) to each run."""
    model_keys, run_keys = [], []
    for run in runs.to_dict("records"):
        text = run.get("config")
        try:
            config = json.loads(text) if isinstance(text, str) and text else None
        except json.JSONDecodeError:
            config = None
        if not (isinstance(config, dict) and all(isinstance(config.get(s), dict) for s in TRAINING_SECTIONS)):
            config = configs.get(run["run_id"])
        fields = training_fields(run, config)
        model_keys.append(model_key(fields))
        run_keys.append(json.dumps(fields, sort_keys=True, default=str))
    return runs.assign(model_key=model_keys, run_key=run_keys)


def enrich_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Add the columns derived from task_params, as each run's task names them: task_variant (a readable
    name, Task.variant_name) and every registered task's run columns (Task.run_columns)."""
    params = runs["task_params"].map(lambda s: json.loads(s) if isinstance(s, str) and s else {})
    filled = [task_columns(t, p) for t, p in zip(runs["task"], params)]
    return runs.assign(task_variant=[task_variant(t, p) for t, p in zip(runs["task"], params)],
                       **{c: [f.get(c) for f in filled] for c in tasks.run_column_names()})


def task_variant(task: str, p: dict) -> str:
    """The task's name of the variant parameters `p` make; a task unknown here is its name alone."""
    return tasks.task_class(task).variant_name(p) if task in tasks.TASKS else task


def task_columns(task: str, p: dict) -> dict:
    if task not in tasks.TASKS:
        return {}
    cls = tasks.task_class(task)
    got = cls.run_columns(p)
    unknown = set(got) - set(cls.run_column_names)
    if unknown:
        raise ValueError(f"task {task!r}: run_columns gives {sorted(unknown)}, not among the run columns it declares "
                         f"(run_column_names = {list(cls.run_column_names)})")
    return got


def _configs(store: Store) -> tuple[dict[str, dict], dict[str, str]]:
    """({run_id: parsed config}, {run_id: the file's text}) of configs/*.json; a file that does not
    parse is {"error": ...} with no text."""
    sel = pafs.FileSelector(f"{store.dir}/configs", allow_not_found=True)
    infos = [i for i in store.fs.get_file_info(sel)
             if i.base_name.endswith(".json") and not i.base_name.startswith(".")]
    # one round trip per file on an object store: read them in parallel (store.index.read_map)
    datas = index.read_map(store, lambda i: store.read_bytes(i.path), infos, threads=16 if not store.local else 4)
    out, texts = {}, {}
    for info, data in zip(infos, datas):
        run_id = info.base_name[: -len(".json")]
        try:
            out[run_id] = loads_json(data) if data else {}
        except ValueError as e:
            out[run_id] = {"error": f"unreadable config: {e}"}
        else:
            if data:
                texts[run_id] = data.decode("utf-8")
    return out, texts
