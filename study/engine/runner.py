"""`study run`: dispatch the runs a grid still owes to Ray Tune, one trial per run."""
from __future__ import annotations

import os
import time

from store import Store
from study.engine.errors import root_cause
from study.engine.faults import fault_config
from study.spec.grid import Grid, Run
from study.engine.health import Plan, classify, heal_and_plan, quarantined, todo_note
from study.engine.loggers import callbacks as logger_callbacks
from study.engine.nodeloss import unwatch_all, watcher
from study.engine.options import RunOptions, TrialOptions
from study.engine.placement import PlacementWatch, StartFailures, refuse_unplaceable, trial_resources, waiting_note_of
from study.engine.raystart import ClusterError, init_ray, sigterm_as_ctrl_c
from study.engine.raytune import fit, make_tuner, record_unfinished
from study.engine.version import code_version, record_grid_file
from study.engine.progress import LiveView
from study.engine.trial import trial_payload


def longest_first(runs: list[Run], store: Store) -> list[Run]:
    """Runs in decreasing order of the training left to them (trained runs only evaluate).

    Tune starts trials in the order given; starting the longest first keeps the last one to
    finish from being a long run started late (on 2 CPUs the demo's makespan drops ~20%).
    """
    def left(run: Run) -> int:
        return 0 if store.exists(store.weights_path(run.run_id)) else run.train_flops()

    return sorted(runs, key=left, reverse=True)  # stable: equal costs keep the grid's order


def run_grid(grid: Grid, results: str, options: RunOptions = RunOptions()) -> int:
    """Run or resume a grid. Returns the process exit code (1 if any run failed or is incomplete).
    `options`: the command line's (study/engine/options.py); `options.log`: the sinks of --log
    (study.engine.loggers.parse: MLflow, W&B, TensorBoard through Ray's logger callbacks).

    Holds the study's lease throughout (store/lease.py): while another driver holds it, raises
    store.lease.LeaseHeld naming that driver, or with `options.wait` waits until it is free."""
    from store.lease import acquire

    echo = options.echo
    lease = acquire(Store(results, grid.study), "run", wait=options.wait, echo=echo, on_lost=_lease_lost(echo))
    try:
        return _run_grid(grid, results, options, lease)
    finally:
        lease.release()


def _quiet_trial_tracebacks() -> None:
    """Tune logs each failed trial with Ray's whole traceback: the run's log keeps it, and the terminal
    gets one line per failed run (root_cause) once the sweep ends. Tune's failures to save its own
    experiment state (a full disk) are logged with a traceback too: the store, not that state, says what
    is done, and the error that ends the sweep is said in one line."""
    import logging

    for name in ("ray.tune.execution.tune_controller", "ray.tune.tune", "ray.tune.execution.experiment_state"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _lease_lost(echo):
    """What a driver does when a newer driver took its lease over (it sent no heartbeat in time): say so
    and stop its trials as Ctrl-C does; its trials stop on their own at their next report (the fence)."""
    import signal

    def lost(newer) -> None:
        echo(f"error: this driver lost the study's lease to {newer.describe()}; stopping (its finished runs are kept)")
        os.kill(os.getpid(), signal.SIGINT)

    return lost


def _run_grid(grid: Grid, results: str, options: RunOptions, lease) -> int:
    store, echo, address = Store(results, grid.study), options.echo, options.address
    links = store.links_out()  # never write through a symlink out of the store
    for line in links:
        echo(f"error: {line}")
    if links:
        return 2
    grid_sha = record_grid_file(store, grid, "run")
    plan = heal_and_plan(grid, store, options.retry_failed, echo)
    echo(f"study {grid.study}: {len(grid.runs)} runs: {len(plan.done)} done, {todo_note(store, plan)}, "
         f"{len(plan.failed)} failed earlier" + (" (use --retry-failed)" if plan.failed else ""))
    if not plan.todo:
        return 1 if plan.failed else 0

    faults = fault_config()  # a malformed spec fails here, before Ray starts
    t0 = time.time()
    try:
        ray, started = init_ray(address, options.num_cpus, store=store, echo=echo)
    except ClusterError as e:
        echo(f"error: {e}")
        return 2
    try:
        sigterm_as_ctrl_c()  # after ray.init, whose own handler (and its C-level stack dump) it replaces
        _quiet_trial_tracebacks()
        how = ("started a local Ray on 127.0.0.1" if address is None else f"joined {address}") if started else \
            "the Ray already running (this study's earlier claims rounds)"
        echo(f"ray: {how} "
             f"in {time.time() - t0:.1f}s ({ray.cluster_resources().get('CPU', 0):g} CPUs, "
             f"{ray.cluster_resources().get('GPU', 0):g} GPUs)")
        if refuse_unplaceable(ray, plan.todo, grid.path, echo):
            return 2
        # a root every node reaches: an absolute path (shared disk) or the URI as given
        abs_results = results if "://" in results else os.path.abspath(results)
        trial = TrialOptions(code_version(), results=abs_results, grid=grid_sha, lease=lease.fence, faults=faults)
        return _dispatch(grid, store, plan, ray, trial, lease, options)
    finally:
        if started:
            ray.shutdown()


def _dispatch(grid: Grid, store: Store, plan: Plan, ray, trial: TrialOptions, lease, options: RunOptions) -> int:
    """One Tune experiment over the runs still to do; their outcome, as `study run` says it."""
    from ray import tune
    from ray.tune.stopper import CombinedStopper

    by_id, echo = {r.run_id: r for r in plan.todo}, options.echo
    placement, starts = PlacementWatch(ray, by_id), StartFailures(store, list(by_id))
    view = LiveView(len(plan.todo), {r.run_id: r.train.steps for r in plan.todo}, echo=echo,
                    every_s=options.progress_every_s, beats=lambda: store.read_progress(set(by_id)))  # status's ETA
    trials: list = []  # Tune's trials as of its last step (their status is live)
    view.waiting = waiting_note_of(ray, trials, by_id)
    payloads = [trial_payload(r) for r in longest_first(plan.todo, store)]
    tuner = make_tuner(
        # a new Tune experiment per invocation: the store, not Tune's state, says what is done
        f"{grid.study}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", store, trial_resources,
        param_space={"run": tune.grid_search(payloads), **trial.config()},
        # a trial lost with its node is retried without spending `retries` (study/engine/nodeloss.py)
        callbacks=[run_events(view, trials), watcher(store), placement.callback(), starts.callback(),
                   *logger_callbacks(list(options.log), store, "run", echo)],  # --log (study/engine/loggers.py)
        max_failures=max(r.retries for r in plan.todo),
        stop=CombinedStopper(placement.stopper(), starts.stopper()))
    try:
        aside = quarantined(store)
        result_grid = fit(tuner, store)
        view.close()  # the terminal's live line ends before the lines that follow
        for path in sorted(quarantined(store) - aside):
            echo(f"set aside (damaged; kept, never deleted): {path}; its run went on without it (see its log)")
        if lease.lost is not None:  # a newer driver owns the study now: its rows are its own to write
            echo(f"study {grid.study}: stopped: the lease was taken over by {lease.lost.describe()}")
            return 1
        if starts.reason:
            echo(f"error: {starts.reason}; is the project installed alike where Ray runs its workers? "
                 f"(nothing of these runs was recorded: fix it, then run again)")
            return 2
        if placement.reason:
            echo(f"error: {grid.path}: {placement.reason}; the cluster changed during the run: add nodes or lower "
                 f"`resources`, then run again (finished runs are kept)")
            return 2
        for res in result_grid:
            rid = ((res.config or {}).get("run") or {}).get("run_id")  # no config: the trial never started
            if res.error is not None and rid in by_id:
                record_unfinished(store, by_id[rid], "failed", res.error, trial.code_version, trial.grid)
        return _outcome(grid, store, echo)
    finally:
        view.close()
        unwatch_all()


def _outcome(grid: Grid, store: Store, echo) -> int:
    """What the store says once the experiment ended: done, failed (each with its root cause), interrupted."""
    final = classify(grid, store)
    echo(f"study {grid.study}: {len(final.done)} done, {len(final.failed)} failed, "
         f"{len(final.todo)} incomplete; results in {store.dir}")
    for run in final.failed:
        echo(f"  failed {run.run_id}: {root_cause((store.run_row(run.run_id) or {}).get('error'))}  "
             f"(log: {store.path('logs', run.run_id + '.log')})")
    if final.todo:  # no error and not done: Tune stopped them (Ctrl-C)
        echo(f"interrupted: {len(final.todo)} run(s) not finished; `study run` again resumes them "
             f"(from their last checkpoint; finished runs are kept)")
    if final.done and grid.claims is None:  # the result, as a trainer prints its final metrics (a claims grid
        # prints its claims table once its rounds end: study/engine/claims.py)
        from analysis.summary import print_result

        print_result(store, echo)
    return 1 if (final.failed or final.todo) else 0


def run_events(view: LiveView, trials: list):
    """A Ray Tune callback feeding `view` with the trials of a sweep (`study run`), keyed by run id, and
    keeping Tune's list of trials in `trials`."""
    from ray.tune import Callback

    seen = trials

    class RunEvents(Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            view.started(trial.config["run"]["run_id"])

        def on_trial_result(self, iteration, trials, trial, result, **info):
            view.result(trial.config["run"]["run_id"], result.get("step") if result.get("phase") == "train"
                        else None)

        def on_trial_complete(self, iteration, trials, trial, **info):
            view.finished(trial.config["run"]["run_id"], ok=True)

        def on_trial_error(self, iteration, trials, trial, **info):
            view.finished(trial.config["run"]["run_id"], ok=False)

        def on_step_end(self, iteration, trials, **info):
            seen[:] = trials
            view.show(force=False)

    return RunEvents()
