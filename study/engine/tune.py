"""`study tune GRID`: an Optuna search through Ray Tune, resumable, feeding the sweeps.

The grid's `search:` section (see study/spec/search.py) names distributions over model/train
fields; every expanded point of the grid is a search group with its own Optuna study. Each
trial is a run like a sweep run: the sampled values become part of its training config (so
of its run id), `study.engine.trial.execute` trains and evaluates it, and its rows land in the
Parquet store of the study.

Storage (read by optuna-dashboard and by `study report --figure tuning`):
    <results>/<study>/optuna.db     SQLite (`sqlite:///<results>/<study>/optuna.db`); one Optuna
                                    study per search group, named after the group (e.g.
                                    'K1_L3'; the grid's study name when it has a single group
                                    without axes). Parameters are named by their canonical keys
                                    ('train.lr'); the trial's value is the search metric.
                                    Study user attrs: rmdm_study, group_point, metric, mode,
                                    n_trials. Trial user attrs: run_id (the row in runs/),
                                    and 'interrupted' / 'resumes_trial' where a trial was cut
                                    off and run again.
    <results>/<study>/best.yaml     best values per group (kind: rmdm-study/best-values), the
                                    file sweep grids include with `defaults_from`.

Resuming: an interrupted `study tune` keeps every finished trial (complete, pruned or failed)
and runs only the rest of `n_trials`. A trial left RUNNING by the interruption is marked
failed+interrupted and its parameters are enqueued again, so it resumes from its run's
checkpoint. The TPE sampler is re-seeded with `seed + trials so far`: with the same seed it
would propose again the very values of the first session (measured in Optuna 5: three
trials, resumed, gave the same three learning rates), so finished trials would be repeated.
Pruning (ASHA) state does not survive a restart: rungs are rebuilt from the new trials.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import io
import math
import os
import time
from dataclasses import dataclass

import yaml

from model.train import load_state
from store import Store
from study.engine.options import RunOptions, TrialOptions
from study.engine.evaluate import evaluate
from study.spec.grid import Grid, Run, SearchGroup, sampling_depth
from study.engine.progress import LiveView
from study.engine.raytune import EVAL_PREFIX, record_unfinished, with_values
from study.engine.runner import dispatch, leased, ray_for, record_grid_file, trial_options
from study.spec.search import BEST_KIND, LOSS_METRICS, Search, SearchMetric
from study.engine.trial import trial_payload

DB_NAME = "optuna.db"
BEST_NAME = "best.yaml"


class TuneError(RuntimeError):
    """A search that cannot run (remote store, study already running, mismatched storage)."""


def storage_url(store: Store) -> str:
    return f"sqlite:///{store.path(DB_NAME)}"


def tuning_run(run: Run, search: Search) -> Run:
    """A search group's base run as its trials run it: evaluated on the search's split (val unless
    the grid says otherwise), with the search's per-trial resources. Neither changes the run id."""
    run = dataclasses.replace(run, eval=run.eval.model_copy(update={"split": search.split}))
    if search.resources is not None:
        run = dataclasses.replace(run, resources=search.resources)
    return run


# ---- scoring -------------------------------------------------------------------------------
def _metric_point(run: Run, metric: SearchMetric):
    ls = sampling_depth(metric.L_s, run.model.L)
    for p in run.eval_points():
        if (p.T, p.L_s, p.sampler, p.adaptive) == (metric.T, ls, metric.sampler, None):  # fixed depth only
            return p
    raise KeyError(f"eval point of {metric.label} not in the run's eval grid")


def objective_from_store(run: Run, metric: SearchMetric, store: Store, row: dict) -> float | None:
    """The search metric of a finished run, from what `execute` wrote (val_loss: computed here)."""
    if metric.name == "final_loss":
        return row.get("final_loss")
    if metric.name == "val_loss":
        sd = load_state(io.BytesIO(store.read_bytes(store.weights_path(run.run_id))), "cpu",
                        store.weights_path(run.run_id))
        return score_state(run, metric, sd["model"], store.data_dir())
    ev = store.read("evals", filter_run=run.run_id)
    key = _metric_point(run, metric).key
    hit = ev[(ev.eval_key == key) & (ev.metric == metric.name)]
    return float(hit.value.iloc[0]) if len(hit) else None


@functools.lru_cache(maxsize=4)
def _task(cfg, data_dir: str | None):
    from tasks import make_task

    task = make_task(cfg)
    task.prepare(data_dir)
    return task


def score_state(run: Run, metric: SearchMetric, model_state: dict, data_dir: str | None = None) -> float:
    """Score weights without writing anything: the search metric on the run's eval split (in a
    search, the validation split: see `tuning_run`).

    val_loss is the masked-diffusion ELBO of the final loop (what a sampler at L_s = L_t
    uses), on that split with noise fixed by the eval seed. Task metrics: `study.engine.evaluate.evaluate`,
    as the run's own evaluation of that point. Used for intermediate evaluations (pruning on the objective) and
    for val_loss at the end. The global torch RNG is left as it was: the training around an
    intermediate evaluation must not change because of it.
    """
    import torch

    from model import RecursiveDenoiser, SeqSpec
    from model.train import diffusion_loss

    with torch.random.fork_rng(devices=[]):
        task = _task(run.task, data_dir)
        spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
        model = RecursiveDenoiser(run.model, spec)
        model.load_state_dict(model_state)
        model.eval()
        ev_full = task.eval_set(run.eval.split)
        with torch.no_grad():
            if metric.name in LOSS_METRICS:
                ev = ev_full.head(run.eval.n_examples)
                gen = torch.Generator().manual_seed(run.eval.seed)
                weights = [0.0] * (run.model.L - 1) + [1.0]
                total, n = 0.0, 0
                for i in range(0, len(ev), 256):
                    x, c = ev.x0[i:i + 256], ev.cond[i:i + 256]
                    loss, _ = diffusion_loss(model, x, c, gen, run.model.L, weights)
                    total, n = total + float(loss) * len(x), n + len(x)
                return total / n
            pt = _metric_point(run, metric)
            e = evaluate(model, task, pt, ev_full.head(pt.n_examples), run.run_id, keep=0)
            return next(r.value for r in e.evals if r.metric == metric.name)


# ---- the trial -----------------------------------------------------------------------------
@dataclass
class Objective:
    """What a search adds to its trials (study.engine.raytune.trainable): the search metric, scored once the
    run is trained and evaluated, and with pruning on it, scored every `every` steps for ASHA. `trial` gives
    one trial's copy, which turns its results into what the searcher (`objective`) and ASHA (`loss`, or `step`
    and `score`) read; every result carries the run id, which the searcher stores with its Optuna trial."""

    metric: SearchMetric
    every: int | None  # steps between intermediate evaluations (ASHA on the objective), or None
    run: Run | None = None  # one trial's (`trial`)
    store: Store | None = None
    scored: int | None = None  # the modification time of the checkpoint scored last

    def trial(self, run: Run, store: Store) -> "Objective":
        if self.every:  # the trainer checkpoints every `every` steps and each checkpoint is scored;
            # checkpoint_every is bookkeeping: it leaves the run id as it is
            run = dataclasses.replace(run, train=run.train.model_copy(update={"checkpoint_every": self.every}))
        return dataclasses.replace(self, run=run, store=store)

    def progress(self, result: dict) -> dict | None:
        """A training result as Tune gets it; None for the others (evaluations)."""
        if result.get("phase") != "train":
            return None
        # Tune insists that every result carries the searcher's metric: NaN until the end
        out = {"step": result["step"], "loss": result["loss"], "run_id": self.run.run_id, "objective": math.nan}
        if self.every:
            # ASHA reads `step` and `score`: a result without a fresh score carries neither
            # (a NaN score at a rung's step would let the trial pass that rung unjudged)
            out.update(train_step=out.pop("step"), score=math.nan)
            path = self.store.checkpoint_path(self.run.run_id)
            info = self.store.fs.get_file_info(path)
            stamp = info.mtime_ns if info.type.name == "File" else None
            if stamp is not None and stamp != self.scored:
                self.scored = stamp
                sd = load_state(io.BytesIO(self.store.read_bytes(path)), "cpu", path)
                out.update(step=sd["step"], score=score_state(self.run, self.metric, sd["model"],
                                                              self.store.data_dir()))
        return out

    def final(self, row: dict, metrics: dict) -> dict:
        """The last result: the objective (NaN where the run gives none), with `metrics`' final loss and
        eval points (study.engine.raytune.final_metrics, for --log)."""
        value = objective_from_store(self.run, self.metric, self.store, row)
        out = {"step": self.run.train.steps, "loss": row.get("final_loss"), "run_id": self.run.run_id,
               "objective": math.nan}
        if value is not None and math.isfinite(value):
            out.update(objective=value, score=value)
        out.update({k: v for k, v in metrics.items() if k.startswith(EVAL_PREFIX) or k == "final_loss"})
        return out


# ---- the driver ----------------------------------------------------------------------------
def _distributions(search: Search) -> dict:
    import optuna.distributions as od

    out = {}
    for k, d in search.params.items():
        if d.dist == "choice":
            out[k] = od.CategoricalDistribution(list(d.values))
        elif d.dist == "int":
            out[k] = od.IntDistribution(int(d.low), int(d.high), log=d.log, step=int(d.step or 1))
        else:
            out[k] = od.FloatDistribution(d.low, d.high, log=d.dist == "loguniform", step=d.step)
    return out


def _open_study(search: Search, group: SearchGroup, storage, grid: Grid):
    import optuna

    direction = "maximize" if search.mode == "max" else "minimize"
    study = optuna.create_study(storage=storage, study_name=group.name, direction=direction, load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise TuneError(f"{DB_NAME}: study {group.name!r} was created to {study.direction.name.lower()}, the grid "
                        f"now asks to {direction}: use another study name or delete the study")
    attrs = {"rmdm_study": grid.study, "group_point": group.point, "metric": search.metric.label,
             "mode": search.mode, "n_trials": search.n_trials, "params": sorted(search.params), "split": search.split}
    # a study stored before searches recorded their split was scored on test: never mixed with val
    old = {**({"split": "test"} if study.user_attrs else {}), **study.user_attrs}
    for k in ("metric", "params", "split"):
        if k in old and old[k] != attrs[k]:
            raise TuneError(f"{DB_NAME}: study {group.name!r} searched {k} {old[k]!r}, the grid now says "
                            f"{attrs[k]!r}: use another study name or delete the study")
    for k, v in attrs.items():
        study.set_user_attr(k, v)
    return study


def _finished(study) -> list:
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False)
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            or (t.state == TrialState.FAIL and not t.user_attrs.get("interrupted"))]


def _recover(study, echo) -> None:
    """Trials left RUNNING by an interrupted session: fail them and enqueue their values again."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        study.tell(t.number, state=TrialState.FAIL)
        study.enqueue_trial(t.params, user_attrs={"resumes_trial": t.number}, skip_if_exists=False)
        echo(f"  trial {t.number} was interrupted: its values {t.params} run again")


def tune_grid(grid: Grid, results: str, options: RunOptions = RunOptions()) -> int:
    """Run or resume every search group of `grid`; write best.yaml. Returns an exit code.
    `options`: the command line's, as for `study run` (study/engine/options.py; retry_failed and
    progress_every_s do not apply). The trials go through `study run`'s one driver (study.engine.runner:
    the study's lease, its only lock, held throughout; LeaseHeld, or `options.wait`)."""
    import contextlib

    import optuna

    if grid.search is None:
        raise TuneError(f"{grid.path}: no `search:` section: use `study run` for a sweep")
    if "://" in results:
        raise TuneError(f"study tune needs a local results directory for {DB_NAME} (got {results})")
    store, echo, search = Store(results, grid.study), options.echo, grid.search
    os.makedirs(store.dir, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with leased(store, "tune", options) as lease, contextlib.ExitStack() as ray_held:
        storage = optuna.storages.RDBStorage(storage_url(store))
        echo(f"study {grid.study}: {len(grid.search_groups)} search group(s) x {search.n_trials} trials; "
             f"{search.mode}imize {search.metric.label}; storage {storage_url(store)}")
        ray, trial, summary, code = None, None, {}, 0
        for group in grid.search_groups:
            study = _open_study(search, group, storage, grid)
            _recover(study, echo)
            todo = search.n_trials - len(_finished(study))
            echo(f"group {group.name}: {len(_finished(study))} of {search.n_trials} trials finished")
            if todo > 0:
                if ray is None:  # started once, for the first group with trials to run
                    ray = ray_held.enter_context(
                        ray_for(grid, store, [tuning_run(g.run, search) for g in grid.search_groups], options))
                    if ray is None:
                        return 2
                    trial = trial_options(store, grid, results, options, "tune", lease)
                if not study.trials:
                    for p in search.points:
                        study.enqueue_trial(p)
                stopped = _fit_group(grid, store, ray, lease, options, trial, group, study, storage, todo)
                if stopped is not None:
                    return stopped
            finished = _finished(study)
            summary[group.name] = _group_summary(group, study, search)
            _write_best(store, grid, summary)
            if len(finished) < search.n_trials:
                echo(f"group {group.name}: interrupted after {len(finished)} of {search.n_trials} trials; "
                     f"run `study tune` again to resume")
                return 130
            if not summary[group.name]["best"]:
                code = 1
                echo(f"group {group.name}: no trial completed")
            else:
                s = summary[group.name]
                echo(f"group {group.name}: best {search.metric.label} = {s['value']:.4g} with {s['best']} "
                     f"(trial {s['trial']}, run {s['run_id']})")
        if trial is None:
            record_grid_file(store, grid, "tune")
        echo(f"best values: {store.path(BEST_NAME)}")
        return code


@functools.cache
def _search_classes():
    """Ray Tune's ASHA and OptunaSearch with the two changes a resumable, pruned `study tune` needs (they
    import Ray Tune and Optuna: made only when a search runs)."""
    from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler
    from ray.tune.search.optuna import OptunaSearch

    class RecordingAsha(AsyncHyperBandScheduler):
        """ASHA that records which trials it stopped (in `stopped`, shared with the searcher), so the
        searcher can tell pruned from interrupted."""

        def __init__(self, stopped: set, **kw):
            super().__init__(**kw)
            self.stopped = stopped

        def on_trial_result(self, tune_controller, trial, result):
            action = super().on_trial_result(tune_controller, trial, result)
            if action == TrialScheduler.STOP:
                self.stopped.add(trial.trial_id)
            return action

    class ResumableOptunaSearch(OptunaSearch):
        """OptunaSearch on a persisted study.

        - intermediate results carry no `objective` (only the last one does): skip them
          instead of failing on the missing key;
        - a trial that ends without an objective, without an error and without a stop by
          the scheduler (`stopped`, filled by RecordingAsha) was interrupted (Ctrl-C, driver lost):
          it stays RUNNING in the storage, and the next `study tune` runs it again instead of
          counting it as pruned.
        """

        def __init__(self, stopped: set, **kw):
            super().__init__(**kw)
            self.stopped, self.named = stopped, set()

        def on_trial_result(self, trial_id, result):
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is not None and result.get("run_id") and trial_id not in self.named:
                ot_trial.set_user_attr("run_id", result["run_id"])  # even if the trial never ends
                self.named.add(trial_id)
            if has_value(result, self.metric):
                super().on_trial_result(trial_id, result)

        def on_trial_complete(self, trial_id, result=None, error=False):
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is None:
                return
            if result and result.get("run_id"):
                ot_trial.set_user_attr("run_id", result["run_id"])
            value = has_value(result, self.metric)
            if not (error or value or trial_id in self.stopped):
                self._completed_trials.add(trial_id)
                return  # interrupted: left RUNNING on purpose
            if result and not value:  # pruned, or failed: no value to tell
                result = {k: v for k, v in result.items() if k != self.metric}
            super().on_trial_complete(trial_id, result, error)

    return RecordingAsha, ResumableOptunaSearch


def has_value(result: dict | None, key: str) -> bool:
    """Whether a Tune result carries a finite number under `key`."""
    v = (result or {}).get(key)
    return isinstance(v, (int, float)) and math.isfinite(v)


def _fit_group(grid: Grid, store: Store, ray, lease, options: RunOptions, trial: TrialOptions, group: SearchGroup,
               study, storage, todo: int) -> int | None:
    """`todo` more trials of one search group, through the one driver (study.engine.runner.dispatch); the rows
    of those that failed or were pruned. An exit code when the sweep stopped for a reason of its own."""
    import optuna
    from ray.tune.search import ConcurrencyLimiter

    RecordingAsha, ResumableOptunaSearch = _search_classes()
    search = grid.search
    base = tuning_run(group.run, search)
    stopped: set = set()  # trials ASHA stopped (pruned, not interrupted)
    # re-seeded per session: the same seed would propose the first session's values again
    sampler = optuna.samplers.TPESampler(seed=search.seed + len(study.trials))
    searcher = ResumableOptunaSearch(stopped, space=_distributions(search), metric="objective", mode=search.mode,
                                     sampler=sampler, study_name=group.name, storage=storage)
    scheduler, eval_every = None, None
    if search.pruning is not None:
        p = search.pruning
        eval_every = p.every if p.metric == "objective" else None
        scheduler = RecordingAsha(stopped, time_attr="step", metric="score" if eval_every else "loss",
                                  mode=search.mode if eval_every else "min", max_t=base.train.steps,
                                  grace_period=p.grace_period, reduction_factor=p.reduction_factor)
    # one line per trial started or ended, and every 30 s (a terminal: one line redrawn), as `study run`
    view = LiveView(todo, {}, echo=options.echo, beats=lambda: store.read_progress(set(view.steps)))
    code, result_grid = dispatch(
        f"{grid.study}-tune-{group.name}-{int(time.time())}", store, ray, lease, view,
        options, "tune", {"base": trial_payload(base), "param_keys": sorted(search.params), **trial.config()},
        max_failures=base.retries, objective=Objective(search.metric, eval_every),
        search_alg=ConcurrencyLimiter(searcher, max_concurrent=search.max_concurrent), scheduler=scheduler,
        num_samples=todo)
    if code not in (None, 130):  # a Ctrl-C: the group says how far it got
        return code
    row_of = {"code_version": trial.code_version, "grid": trial.grid}  # what a search's runs rows say of it
    for r in result_grid:
        cfg, metrics = r.config or {}, r.metrics or {}
        if "param_keys" not in cfg:
            continue
        run = with_values(base, {k: cfg[k] for k in cfg["param_keys"]})
        if r.error is not None:
            record_unfinished(store, run, "failed", r.error, **row_of, final_loss=metrics.get("loss"))
        elif not has_value(metrics, "objective") and metrics.get("run_id") and metrics.get("trial_id") in stopped:
            record_unfinished(store, run, "pruned", f"stopped by ASHA at step {metrics.get('step')}",
                              **row_of, final_loss=metrics.get("loss"))
    return None


def _group_summary(group: SearchGroup, study, search: Search) -> dict:
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    states = dict(collections.Counter(t.state.name.lower() for t in study.get_trials(deepcopy=False)))
    out = {"point": dict(group.point), "best": {}, "value": None, "trial": None, "run_id": None,
           "n_trials": search.n_trials, "trials": states, "optuna_study": group.name}
    if done:
        best = max(done, key=lambda t: t.value) if search.mode == "max" else min(done, key=lambda t: t.value)
        out.update(best={k: v.item() if hasattr(v, "item") else v for k, v in best.params.items()},  # numpy: plain
                   value=float(best.value), trial=best.number, run_id=best.user_attrs.get("run_id"))
    return out


def _write_best(store: Store, grid: Grid, summary: dict) -> None:
    doc = {"kind": BEST_KIND, "study": grid.study, "grid": grid.path, "metric": grid.search.metric.label,
           "mode": grid.search.mode, "split": grid.search.split, "storage": DB_NAME, "groups": summary}
    text = ("# Best values per search group, written by `study tune`. Include them in a sweep grid with\n"
            "#   defaults_from: {file: <this file>, group: auto}   (or group: <name>)\n"
            + yaml.safe_dump(doc, sort_keys=False))
    store.write_text(store.path(BEST_NAME), text)


def describe_search(grid: Grid) -> list[str]:
    """Lines for `study plan`: the search space and its groups."""
    s = grid.search
    lines = [f"search: {len(grid.search_groups)} group(s) x {s.n_trials} trials, {s.mode}imize {s.metric.label}"
             + (f", ASHA on {s.pruning.metric} (grace {s.pruning.grace_period} steps, "
                f"reduction {s.pruning.reduction_factor:g})" if s.pruning else "")
             + f", {s.max_concurrent} at a time, scored on the {s.split} split"]
    for k, d in s.params.items():
        lines.append(f"  {k} ~ {d.describe()}")
    for g in grid.search_groups:
        lines.append(f"  group {g.name}: base run {g.run.run_id} {g.point or ''}")
    return lines
