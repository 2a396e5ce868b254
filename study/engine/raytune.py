"""What `study run` and `study tune` share on Ray Tune: where Ray's state lives, the one trainable,
the Tuner set-up, and the row of a run whose trial ended without finishing.

A trial is one run: `study.engine.trial.execute` trains and evaluates it into the study's store, and the
trial reports its training loss and, at the end, its final metrics to Tune. A sweep's trial config
holds the run (`config["run"]`); a search's holds the search group's base run and the sampled
values (`config["base"]`, `config["param_keys"]`), and the search adds its objective (study/engine/tune.py);
both hold what the driver tells its trials, one TrialOptions (study/engine/options.py) in one key.

Ray is imported only inside the functions that run it: `study plan` and the loggers' checks stay cheap.
"""
from __future__ import annotations

import dataclasses
import math
import traceback

from store import Store
from study.engine.errors import error_line, root_cause
from study.engine.options import TrialOptions
from study.spec.grid import Run
from study.engine.trial import attempts_so_far, execute, format_error, run_from_resolved, run_row, start_attempt

EVAL_PREFIX = "eval/"  # final metrics: eval/<eval_key>/<primary metric>


def ray_dir(store: Store) -> str:
    """Where Tune keeps a study's experiments, on the store's filesystem: <results>/<study>/.ray (its
    TensorBoard event files and the default MLflow and W&B files are there too)."""
    return f"{store.dir}/.ray"


# ---- the run of a trial ----------------------------------------------------------------------
def with_values(run: Run, values: dict) -> Run:
    """The run of one search trial: the group's base run with the sampled values set."""
    model, train = run.model.model_dump(), run.train.model_dump()
    for k, v in values.items():
        sec, fld = k.split(".", 1)
        (model if sec == "model" else train)[fld] = v
    return dataclasses.replace(run, model=type(run.model).model_validate(model),
                               train=type(run.train).model_validate(train))


_runs: dict = {}  # a trial's Run by its config's run: Tune's callbacks ask at every step


def run_of(config: dict) -> Run:
    """The Run a trial's config stands for (built once): `study run`'s (config["run"]) or `study tune`'s (the
    search group's base run with the trial's sampled values)."""
    values = {k: config[k] for k in config.get("param_keys", ())}
    key = repr((config.get("run"), config.get("base"), values))
    if key not in _runs:
        _runs[key] = run_from_resolved(config["run"]) if "run" in config else \
            with_values(run_from_resolved(config["base"]), values)
    return _runs[key]


def trial_resources(config: dict):
    """A trial's placement group: one bundle with its run's CPUs and GPUs."""
    from ray.tune import PlacementGroupFactory

    res = run_of(config).resources
    bundle = {"CPU": res.cpu}
    if res.gpu:
        bundle["GPU"] = res.gpu  # fractional: several small trials share one GPU
    return PlacementGroupFactory([bundle])


def final_metrics(store: Store, run: Run, row: dict | None) -> dict:
    """The last result a trial reports: `final_loss` and each eval point's primary metric as it stands in the
    store (`eval/<eval_key>/<metric>`), evaluated now or by an earlier attempt. Reads the store only."""
    from tasks import TASKS

    out: dict = {"step": run.train.steps, "phase": "final"}
    loss = (row or {}).get("final_loss")
    if isinstance(loss, (int, float)) and math.isfinite(loss):
        out["final_loss"] = float(loss)
    primary = TASKS[run.task.name][1].primary_metric
    for r in run_evals(store, run.run_id, {pt.key for pt in run.eval_points()}):
        if r.metric == primary:
            out[f"{EVAL_PREFIX}{r.eval_key}/{r.metric}"] = float(r.value)
    return out


def run_evals(store: Store, run_id: str, keys: set[str]) -> list:
    """The evals rows (tuples) of a run at eval keys `keys`; [] when there are none or they do not read (the
    store's own checks name damage; what reports a run only reports)."""
    try:
        ev = store.read("evals", filter_run=run_id)
    except Exception:  # noqa: BLE001
        return []
    return [] if ev is None or not len(ev) else list(ev[ev.eval_key.isin(keys)].itertuples(index=False))


# ---- the trainable ---------------------------------------------------------------------------
def trainable(config: dict, objective=None) -> None:
    """The Ray Tune function trainable of both commands: one run. Every start (first try or a retry)
    resumes from the store. `objective` (a search's, study.engine.tune.Objective) turns the trial's results
    into what the searcher and the scheduler read; without it they go to Tune as `execute` gives them."""
    from ray import tune

    from store.lease import fence

    run, options = run_of(config), TrialOptions.of_config(config)
    store = Store(options.results, run.study)
    held = fence(store, options.lease)  # a trial whose driver lost the study's lease stops (store/lease.py)
    held()
    scored = objective.trial(run, store) if objective is not None else None
    if scored is not None:
        run = scored.run
    attempt = start_attempt(store, run.run_id, "run" if objective is None else "tune")

    def report(result: dict) -> None:
        held()
        out = result if scored is None else scored.progress(result)
        if out is not None:
            tune.report(out)

    try:
        row = execute(run, store, options, report=report, attempt=attempt)
        final = final_metrics(store, run, row)  # final_loss, each eval point's primary metric (for --log)
        held()
        tune.report(final if scored is None else scored.final(row, final))
    except BaseException:
        # the traceback stays in the run's log; Tune retries from the checkpoint or gives up
        store.append_log(run.run_id, f"attempt {attempt} raised:\n{traceback.format_exc().rstrip()}")
        raise


def make_tuner(name: str, store: Store, param_space: dict, callbacks: list, max_failures: int,
               objective=None, search_alg=None, scheduler=None, num_samples: int = 1, stop=None):
    """The Tuner of `study run` (a grid search over runs) and `study tune` (a searcher's samples):
    `trainable` with its run's resources (trial_resources), its experiment `name` under `ray_dir(store)`,
    Tune's own terminal output off (`callbacks` draw the study's), trial actors reused, `max_failures`
    retries a trial."""
    from ray import tune

    fn = trainable if objective is None else tune.with_parameters(trainable, objective=objective)
    return tune.Tuner(
        tune.with_resources(fn, trial_resources),
        param_space=param_space,
        # a trial process imports torch and the task once; later trials with the same resources reuse it
        tune_config=tune.TuneConfig(search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
                                    reuse_actors=True, trial_dirname_creator=trial_dirname),
        run_config=tune.RunConfig(name=name, storage_path=ray_dir(store), storage_filesystem=store.fs, verbose=0,
                                  callbacks=callbacks, stop=stop,
                                  failure_config=tune.FailureConfig(max_failures=max_failures)),
    )


def trial_dirname(trial) -> str:
    """A trial's folder under the experiment: `<run_id>_<Tune's trial id>` (Tune's own name strings the whole
    config together, 200 characters cut short)."""
    try:
        rid = run_of(trial.config).run_id
    except Exception:  # noqa: BLE001 -- a config without a run (never ours): Tune's id alone names it
        return str(trial.trial_id)
    return f"{rid}_{trial.trial_id}"


LOW_SPACE = 1 << 20  # bytes: a disk this close to full explains any error of Tune's writes


def fit(tuner, store: Store):
    """tuner.fit(); an error on a full disk (Tune reads back a state file it could not write: "EOFError:
    Ran out of input") becomes one line naming the disk (store.DiskFull) instead of Tune's own."""
    import shutil

    try:
        return tuner.fit()
    except Exception as e:
        if store.local:
            try:
                full = shutil.disk_usage(store.dir).free < LOW_SPACE
            except OSError:
                full = False
            if full:
                raise store.disk_full(ray_dir(store)) from e
        raise


# ---- a trial that ended without finishing ------------------------------------------------------
NO_COSTS = {"n_params": None, "n_params_non_embedding": None, "flops_per_forward": None}


def record_unfinished(store: Store, run: Run, status: str, error: BaseException | str, code_version: str,
                      grid: str | None, **fields) -> None:
    """Write the runs row of a run whose trial ended without finishing: `status` "failed" (`error`: the
    trial's exception, as Tune gives it) or "pruned" (`error`: why, one line). The run's log keeps the
    whole text (Ray's traceback); the row one plain line, the attempts so far and the node of the run's
    last heartbeat. `fields`: more of run_row's (final_loss)."""
    text = format_error(error) if isinstance(error, BaseException) else error
    attempts = attempts_so_far(store, run.run_id)
    store.append_log(run.run_id, f"{status.upper()} after {attempts} attempts: {text}")
    line = (error_line(error) or root_cause(text)) if isinstance(error, BaseException) else text
    try:
        costs = run.costs()
    except Exception:  # noqa: BLE001 -- a run that cannot even be built still gets its row
        costs = NO_COSTS
    row = run_row(run, costs, status=status, code_version=code_version, error=line, attempts=attempts, grid=grid,
                  **fields)
    hb = store.read_progress().get(run.run_id, {})  # the node and device of the run's last heartbeat
    row.update({k: hb[k] for k in ("node", "node_id", "node_ip", "device", "gpu_ids") if hb.get(k)})
    store.write_rows("runs", [row], f"{run.run_id}.parquet")
