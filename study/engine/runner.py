"""The one driver of `study run`, `study tune` and claims: the runs a grid still owes, or a search's samples,
dispatched to Ray Tune, one trial per run, under the study's lease.

`run_grid` hands `dispatch` a grid search over the runs still to do; `study tune` (study/engine/tune.py)
hands it a searcher and a scheduler, as Ray Tune runs grid and Optuna searches through one Tuner. Every
trial gets the same safeguards: the lease fence, node-loss retries (study/engine/placement.py), placement
and start-failure stops (study/engine/placement.py) and the live line (study/engine/progress.py).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time

from store import Store
from study.engine.errors import root_cause
from study.spec.grid import Grid, Run
from study.engine.health import classify, heal_and_plan, quarantined, todo_note
from study.engine.loggers import callbacks as logger_callbacks
from study.engine.options import RunOptions, TrialOptions
from study.engine.placement import SweepWatch, refuse_unplaceable, unwatch_all
from study.engine.raystart import ClusterError, init_ray, sigterm_as_ctrl_c
from study.engine.raytune import fit, make_tuner, record_unfinished, run_of
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


@contextlib.contextmanager
def leased(store: Store, command: str, options: RunOptions):
    """The study's lease (store/lease.py), the one lock of a driver, held throughout: while another driver
    holds it, raises store.lease.LeaseHeld naming that driver, or with `options.wait` waits until it is free.
    A driver whose lease a newer one took over says so and stops as Ctrl-C does; its trials stop on their
    own at their next report (the fence)."""
    import signal

    from store.lease import acquire

    def lost(newer) -> None:
        options.echo(f"error: this driver lost the study's lease to {newer.describe()}; stopping (its finished "
                     f"runs are kept)")
        os.kill(os.getpid(), signal.SIGINT)

    lease = acquire(store, command, wait=options.wait, echo=options.echo, on_lost=lost)
    try:
        yield lease
    finally:
        lease.release()


def run_grid(grid: Grid, results: str, options: RunOptions = RunOptions()) -> int:
    """Run or resume a grid. Returns the process exit code (1 if any run failed or is incomplete).
    `options`: the command line's (study/engine/options.py); `options.log`: the sinks of --log
    (study.engine.loggers.parse: MLflow, W&B, TensorBoard through Ray's logger callbacks)."""
    store = Store(results, grid.study)
    with leased(store, "run", options) as lease:
        return run_leased(grid, store, results, options, lease)


def run_leased(grid: Grid, store: Store, results: str, options: RunOptions, lease,
               hold: contextlib.ExitStack | None = None) -> int:
    """run_grid's work under a lease already held (claims hold one, and one Ray in `hold`, for all their rounds)."""
    echo = options.echo
    links = store.links_out()  # never write through a symlink out of the store
    for line in links:
        echo(f"error: {line}")
    if links:
        return 2
    plan = heal_and_plan(grid, store, options.retry_failed, echo)
    echo(f"study {grid.study}: {len(grid.runs)} runs: {len(plan.done)} done, {todo_note(store, plan)}, "
         f"{len(plan.failed)} failed earlier" + (" (use --retry-failed)" if plan.failed else ""))
    if not plan.todo:
        record_grid_file(store, grid, "run")
        return 1 if plan.failed else 0
    with ray_for(grid, store, plan.todo, options, hold) as ray:
        if ray is None:
            return 2  # refused before anything ran: the grid is not recorded (nothing of it was run)
        trial = trial_options(store, grid, results, options, "run", lease)
        from ray import tune

        by_id = {r.run_id: r for r in plan.todo}
        view = LiveView(len(plan.todo), {r.run_id: r.train.steps for r in plan.todo}, echo=echo,
                        every_s=options.progress_every_s,
                        beats=lambda: store.read_progress(set(by_id)))  # status's ETA
        code, result_grid = dispatch(
            f"{grid.study}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", store, ray, lease, view, options,
            "run", {"run": tune.grid_search([trial_payload(r) for r in longest_first(plan.todo, store)]),
                    **trial.config()}, max_failures=max(r.retries for r in plan.todo))
        if code not in (None, 130):
            return code
        for res in result_grid:
            rid = run_of(res.config).run_id if res.config else None  # no config: the trial never started
            if res.error is not None and rid in by_id:
                record_unfinished(store, by_id[rid], "failed", res.error, trial.code_version, trial.grid)
        outcome = _outcome(grid, store, echo)
        return 130 if code == 130 and outcome else outcome  # Ctrl-C: 130, unless every run finished


# ---- what a driver records of the code and the grid it runs: the code version of every runs row, and the
# grid file kept by hash in the study's store
def code_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("rmdm-study")
    except PackageNotFoundError:
        v = "0+unknown"
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", ""
    return f"{v}+g{sha}{'.dirty' if dirty else ''}" if sha else v


def record_grid_file(store: Store, grid: Grid, command: str) -> str:
    """Keep the grid a `command` (run, tune) runs, by hash and logged with the time (store/provenance.py), and
    as the study's grid.yaml (replaced after). Returns its hash."""
    from store.provenance import record_grid
    from study.spec.overrides import grid_text

    text = grid_text(grid)  # after any command-line overrides, which it names in a comment header
    grid_sha = record_grid(store, text, command, grid.path)
    store.write_text(store.path("grid.yaml"), text)
    return grid_sha


def trial_options(store: Store, grid: Grid, results: str, options: RunOptions, command: str, lease) -> TrialOptions:
    """What every trial of this driver is told (RunOptions.trial): the grid, recorded now that its runs start
    (a run refused before leaves nothing), the code version, the store's root as every node reaches it (an
    absolute path on a shared disk, or the URI as given) and the lease that fences it."""
    return options.trial(code_version=code_version(), results=results if "://" in results else
                         os.path.abspath(results), grid=record_grid_file(store, grid, command), lease=lease.fence)


@contextlib.contextmanager
def ray_for(grid: Grid, store: Store, runs: list[Run], options: RunOptions,
            hold: contextlib.ExitStack | None = None):
    """Ray started (embedded) or joined (`options.address`) for `runs`, shut down after if started here (when
    `hold` closes, with `hold`: claims keep one Ray for all their rounds); None when the cluster cannot be
    reached or can never place one of `runs` (said through echo)."""
    echo, address, t0 = options.echo, options.address, time.time()
    try:
        ray, started = init_ray(address, options.num_cpus, store=store, echo=echo)
    except ClusterError as e:
        echo(f"error: {e}")
        yield None
        return
    try:
        sigterm_as_ctrl_c()  # after ray.init, whose own handler (and its C-level stack dump) it replaces
        _quiet_trial_tracebacks()
        how = (("started a local Ray on 127.0.0.1" if address is None else f"joined {address}")
               + f" in {time.time() - t0:.1f}s") if started else "the Ray this driver holds for all its claims rounds"
        echo(f"ray: {how} ({ray.cluster_resources().get('CPU', 0):g} CPUs, "
             f"{ray.cluster_resources().get('GPU', 0):g} GPUs)")
        yield None if refuse_unplaceable(ray, runs, grid.path, echo) else ray
    finally:
        if started and hold is not None:
            hold.callback(ray.shutdown)
        elif started:
            ray.shutdown()


def _quiet_trial_tracebacks() -> None:
    """Tune logs each failed trial with Ray's whole traceback: the run's log keeps it, and the terminal
    gets one line per failed run (root_cause) once the sweep ends. Tune's failures to save its own
    experiment state (a full disk) are logged with a traceback too: the store, not that state, says what
    is done, and the error that ends the sweep is said in one line."""
    import logging

    for name in ("ray.tune.execution.tune_controller", "ray.tune.tune", "ray.tune.execution.experiment_state"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def dispatch(name: str, store: Store, ray, lease, view: LiveView, options: RunOptions, command: str,
             param_space: dict, max_failures: int, **search):
    """One Tune experiment `name` (a new one per invocation: the store, not Tune's state, says what is done)
    over `param_space`: a grid search over runs (`study run`), or a searcher's samples (`search`: make_tuner's
    objective, search_alg, scheduler, num_samples; `study tune`). Returns (an exit code when the sweep
    stopped for a reason of its own, said through echo, 130 after a Ctrl-C (the caller says what was left),
    else None; Tune's ResultGrid)."""
    import signal

    echo, sweep = options.echo, SweepWatch(ray, store, view)
    tuner = make_tuner(
        name, store, param_space,
        # a trial lost with its node is retried without spending `retries` (study/engine/placement.py)
        callbacks=[sweep.callback(), *logger_callbacks(list(options.log), store, command, echo)],  # --log
        max_failures=max_failures, stop=sweep.stopper(), **search)
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # Ctrl-C is the sweep's (and SIGTERM: sigterm_as_ctrl_c)
    before = signal.signal(signal.SIGINT, sweep.sigint)
    try:
        aside = quarantined(store)
        result_grid = fit(tuner, store)
        view.close()  # the terminal's live line ends before the lines that follow
        for path in sorted(quarantined(store) - aside):
            echo(f"set aside (damaged; kept, never deleted): {path}; its run went on without it (see its log)")
        if lease.lost is not None:  # a newer driver owns the study now: its rows are its own to write
            echo(f"study {store.study}: stopped: the lease was taken over by {lease.lost.describe()}")
            return 1, result_grid
        if sweep.never_started:
            echo(f"error: {sweep.never_started}; is the project installed alike where Ray runs its workers? "
                 f"(nothing of these runs was recorded: fix it, then run again)")
            return 2, result_grid
        if sweep.unplaceable:
            echo(f"error: {store.study}: {sweep.unplaceable}; the cluster changed during the run: add nodes or "
                 f"lower `resources`, then run again (finished runs are kept)")
            return 2, result_grid
        return (130 if sweep.interrupted else None), result_grid
    finally:
        signal.signal(signal.SIGINT, before)
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

