"""Placement: whether a cluster can ever hold a run's trial (before dispatch, and while trials wait),
each trial's placement group, and the live line's note on why runs wait."""
from __future__ import annotations

import time

from study.spec.grid import Run


def node_resources(ray) -> list[dict]:
    """Resources of each alive node of the cluster."""
    return [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]


def unplaceable(runs: list[Run], nodes: list[dict]) -> list[str]:
    """One message per distinct request that no node of the cluster can ever hold (a trial's CPUs and
    GPUs are one placement-group bundle: they must fit on a single node)."""
    msgs, seen = [], set()
    cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    gpus = max((n.get("GPU", 0) for n in nodes), default=0)
    for run in runs:
        ask = (run.resources.cpu, run.resources.gpu)
        if ask in seen:
            continue
        seen.add(ask)
        if any(n.get("CPU", 0) >= ask[0] and n.get("GPU", 0) >= ask[1] for n in nodes):
            continue
        short = [f"resources.{k} = {v:g} (the largest node has {have:g})"
                 for k, v, have in (("cpu", ask[0], cpus), ("gpu", ask[1], gpus)) if v > have]
        if not short:
            short = [f"resources.cpu = {ask[0]:g} and resources.gpu = {ask[1]:g} together (no single node has both)"]
        n_runs = sum((r.resources.cpu, r.resources.gpu) == ask for r in runs)
        msgs.append(f"{n_runs} run(s) ask {', '.join(short)}; the cluster has {len(nodes)} node(s) with "
                    f"{sum(n.get('CPU', 0) for n in nodes):g} CPUs and {sum(n.get('GPU', 0) for n in nodes):g} "
                    f"GPUs in all: they could never start")
    return msgs


def refuse_unplaceable(ray, runs: list[Run], where: str, echo) -> bool:
    """The check before dispatch (`study run`, `study tune`): says why each request no node can hold
    would never start (Tune would leave it pending forever, without a word); True when there is one."""
    never = unplaceable(runs, node_resources(ray))
    for msg in never:
        echo(f"error: {where}: {msg}; lower `resources` in the grid or add nodes (nothing was run)")
    return bool(never)


WAITING_EVERY_S = 1.0  # the live line asks Ray what is free at most this often


def waiting_note(asks: list[tuple[float, float]], free: dict, total: dict) -> str:
    """Why runs wait, for the live line: each resource that some pending run (`asks`: its (cpu, gpu))
    needs more of than the cluster has free now, e.g. "waiting for cpu: 0 free of 2"; '' when every
    pending run would fit (Tune is about to start it). `free`, `total`: Ray's available and cluster
    resources."""
    short = [f"{name}: {free.get(key, 0):g} free of {total.get(key, 0):g}"
             for i, (name, key) in enumerate((("cpu", "CPU"), ("gpu", "GPU")))
             if any(a[i] > free.get(key, 0) for a in asks)]
    return f"waiting for {', '.join(short)}" if short else ""


def waiting_note_of(ray, trials: list):
    """The live line's note on why runs wait (waiting_note), asked of Ray at most every WAITING_EVERY_S."""
    from study.engine.raytune import run_of

    note = {"at": 0.0, "text": ""}

    def waiting() -> str:
        if time.time() - note["at"] < WAITING_EVERY_S:  # the terminal bar redraws every Tune step
            return note["text"]
        note["at"], note["text"] = time.time(), ""
        if any(t.status == "RUNNING" for t in trials):  # Tune reserves the first trials' resources before they start
            asks = [(r.cpu, r.gpu) for r in (run_of(t.config).resources for t in trials if t.status == "PENDING")]
            if asks:
                note["text"] = waiting_note(asks, ray.available_resources(), ray.cluster_resources())
        return note["text"]

    return waiting


class PlacementWatch:
    """Checks, while trials wait, that each pending one still fits on some alive node (the cluster
    can shrink under a run); one that never can ends the experiment with a message instead of
    pending forever. Tune calls `callback()` every step and asks `stopper()` whether to stop all."""

    EVERY_S = 10.0

    def __init__(self, ray):
        self.ray, self.reason, self.last = ray, None, time.time()

    def check(self, trials) -> None:
        if self.reason or time.time() - self.last < self.EVERY_S:
            return
        self.last = time.time()
        from study.engine.raytune import run_of

        pending = [run_of(t.config) for t in trials if t.status == "PENDING"]
        if pending:
            never = unplaceable(pending, node_resources(self.ray))
            self.reason = "; ".join(never) or None

    def callback(self):
        from ray.tune import Callback

        watch = self

        class PlacementCheck(Callback):
            def on_step_end(self, iteration, trials, **info):
                watch.check(trials)

        return PlacementCheck()

    def stopper(self):
        return stop_on_reason(self)


def stop_on_reason(watch):
    """A Tune stopper that ends the whole experiment once `watch.reason` is set (a watch of the sweep that
    found why it cannot go on: a trial no node can hold, trials that cannot start)."""
    from ray.tune import Stopper

    class StopOnReason(Stopper):
        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            return watch.reason is not None

    return StopOnReason()


NEVER_STARTED_LIMIT = 3  # trials in a row that fail before their code runs: the sweep stops


class StartFailures:
    """Trials that fail before their code runs (a worker that cannot import the project, a broken worker
    environment): Tune takes them as any failed trial, retries them and starts the next, and every one
    fails alike. A trial failed before its code ran when its run's attempts file (logs/<run_id>.attempts,
    one line per start of the trainable) did not grow; after NEVER_STARTED_LIMIT such failures in a row
    (a trial reporting a result resets the count) the experiment stops, and `reason` says why in one line."""

    def __init__(self, store):
        from study.engine.trial import attempts_so_far

        self.store, self.attempts = store, attempts_so_far
        self.starts: dict[str, int] = {}  # run id -> its attempts when Tune first started a trial of it
        self.in_a_row, self.reason = 0, None

    def run_id(self, trial) -> str:
        from study.engine.raytune import run_of

        rid = run_of(trial.config).run_id
        if rid not in self.starts:
            self.starts[rid] = self.attempts(self.store, rid)
        return rid

    def failed(self, trial) -> None:
        rid = self.run_id(trial)
        now = self.attempts(self.store, rid)
        if now > self.starts[rid]:  # its code ran: the run's own failure, not the workers'
            self.starts[rid] = now
            self.in_a_row = 0
            return
        self.in_a_row += 1
        if self.in_a_row >= NEVER_STARTED_LIMIT and self.reason is None:
            self.reason = (f"{self.in_a_row} trials in a row failed before their code started (the last, run {rid}: "
                           f"{trial_error(trial)})")

    def callback(self):
        from ray.tune import Callback

        watch = self

        class StartCheck(Callback):
            def on_trial_start(self, iteration, trials, trial, **info):  # before its code runs
                watch.run_id(trial)

            def on_trial_result(self, iteration, trials, trial, result, **info):
                watch.in_a_row = 0

            def on_trial_recover(self, iteration, trials, trial, **info):
                watch.failed(trial)

            def on_trial_error(self, iteration, trials, trial, **info):
                watch.failed(trial)

        return StartCheck()

    def stopper(self):
        return stop_on_reason(self)


def trial_error(trial) -> str:
    """The root cause of a Tune trial's last error, one line, from the error text Tune keeps beside the trial
    on the driver (written before its callbacks are called): its last line that reads as an exception (an
    actor that died at start quotes the worker's traceback, whose last such line is the import's)."""
    from study.engine.errors import root_cause

    try:
        with open(trial.error_file, encoding="utf-8", errors="replace") as f:
            return root_cause(f.read()) or "no error recorded"
    except (OSError, TypeError):  # no error file (TypeError: its path is None)
        return "no error recorded"
