"""`study run`: dispatch the runs a grid still owes to Ray Tune, one trial per run."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from study.grid import Grid, Run
from study.store import Store
from study.trial import execute, format_error, run_from_resolved, run_row, trial_payload


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


@dataclass
class Plan:
    done: list[Run]
    todo: list[Run]  # to train and/or evaluate
    failed: list[Run]  # failed earlier; skipped unless --retry-failed


def classify(grid: Grid, store: Store, retry_failed: bool = False) -> Plan:
    done, todo, failed = [], [], []
    for run in grid.runs:
        row = store.run_row(run.run_id)
        status = row["status"] if row else None
        missing = {p.key for p in run.eval_points()} - store.eval_keys(run.run_id)
        if status == "done" and not missing:
            done.append(run)
        elif status == "failed" and not retry_failed:
            failed.append(run)
        else:
            todo.append(run)
    return Plan(done, todo, failed)


def _trainable(config: dict) -> None:
    """The Ray Tune function trainable: one run."""
    from ray import tune

    run = run_from_resolved(config["run"])
    store = Store(config["results"], run.study)
    # each start of this trial (first try or a retry after a crash) appends one line
    marker = store.path("logs", f"{run.run_id}.attempts")
    prev = store.read_bytes(marker) or b""
    attempt = prev.count(b"\n") + 1
    store.write_bytes(marker, prev + f"start {attempt}\n".encode())
    execute(run, store, config["code_version"], report=tune.report, attempt=attempt)


def init_ray(address: str | None, num_cpus: int | None = None):
    """Join `address`, or start an embedded Ray that listens on this machine only."""
    if address is None:
        # loopback only: an open Ray port runs anyone's code
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return ray, False
    kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR")
    if address is None:
        ray.init(num_cpus=num_cpus or os.cpu_count(), **kw)
    else:
        ray.init(address=address, **kw)
    return ray, True


def run_grid(grid: Grid, results: str, address: str | None = None, retry_failed: bool = False,
             num_cpus: int | None = None, echo=print) -> int:
    """Run or resume a grid. Returns the process exit code (1 if any run failed)."""
    store = Store(results, grid.study)
    store.write_text(store.path("grid.yaml"), _dump_yaml(grid.raw))
    plan = classify(grid, store, retry_failed)
    echo(f"study {grid.study}: {len(grid.runs)} runs: {len(plan.done)} done, {len(plan.todo)} to run, "
         f"{len(plan.failed)} failed earlier" + (" (use --retry-failed)" if plan.failed else ""))
    if not plan.todo:
        return 1 if plan.failed else 0

    ray, started = init_ray(address, num_cpus)
    from ray import tune
    from ray.tune import PlacementGroupFactory

    version = code_version()
    payloads = [trial_payload(r) for r in plan.todo]
    by_id = {r.run_id: r for r in plan.todo}
    abs_results = results if "://" in results else os.path.abspath(results)

    def resources(config: dict) -> PlacementGroupFactory:
        res = config["run"]["resources"]
        bundle = {"CPU": res["cpu"]}
        if res["gpu"]:
            bundle["GPU"] = res["gpu"]
        return PlacementGroupFactory([bundle])

    tuner = tune.Tuner(
        tune.with_resources(_trainable, resources),
        param_space={"run": tune.grid_search(payloads), "results": abs_results, "code_version": version},
        tune_config=tune.TuneConfig(reuse_actors=False),
        run_config=tune.RunConfig(
            name=f"{grid.study}-{int(time.time())}",
            storage_path=os.path.join(os.path.abspath(results), ".ray") if "://" not in results else None,
            failure_config=tune.FailureConfig(max_failures=max(r.retries for r in plan.todo)),
            verbose=0,
            callbacks=[_Progress(len(plan.todo), echo)],
        ),
    )
    try:
        result_grid = tuner.fit()
        failures = 0
        for res in result_grid:
            run_id = res.config["run"]["run_id"]
            if res.error is not None:
                failures += 1
                run = by_id[run_id]
                err = format_error(res.error)
                store.append_log(run_id, f"FAILED: {err}")
                try:
                    costs = run.costs()
                except Exception:
                    costs = {"n_params": None, "n_params_non_embedding": None, "flops_per_forward": None}
                store.write_rows("runs", [run_row(run, costs, status="failed", code_version=version, error=err,
                                                  attempts=run.retries + 1)], f"{run_id}.parquet")
        final = classify(grid, store)
        echo(f"study {grid.study}: {len(final.done)} done, {len(final.failed)} failed, "
             f"{len(final.todo)} incomplete; results in {store.dir}")
        return 1 if (final.failed or final.todo) else 0
    finally:
        if started:
            ray.shutdown()


class _Progress:
    """A live line: done / running / pending / failed, with an ETA from finished trials."""

    def __new__(cls, total: int, echo):
        from ray.tune import Callback

        class Progress(Callback):
            def __init__(self):
                self.total, self.t0 = total, time.time()
                self.running, self.done, self.failed = set(), 0, 0

            def _line(self):
                pending = self.total - self.done - self.failed - len(self.running)
                el = time.time() - self.t0
                finished = self.done + self.failed
                eta = (el / finished * (self.total - finished)) if finished else float("nan")
                echo(f"[{el:6.0f}s] done {self.done}  running {len(self.running)}  pending {pending}  "
                     f"failed {self.failed}  eta {eta:.0f}s" if finished else
                     f"[{el:6.0f}s] done 0  running {len(self.running)}  pending {pending}  failed 0")

            def on_trial_start(self, iteration, trials, trial, **info):
                self.running.add(trial.trial_id)
                self._line()

            def on_trial_complete(self, iteration, trials, trial, **info):
                self.running.discard(trial.trial_id)
                self.done += 1
                self._line()

            def on_trial_error(self, iteration, trials, trial, **info):
                self.running.discard(trial.trial_id)
                self.failed += 1
                self._line()

        return Progress()


def _dump_yaml(raw: dict) -> str:
    import yaml

    return yaml.safe_dump(raw, sort_keys=False)
