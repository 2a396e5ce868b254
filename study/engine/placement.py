"""What watches a sweep's trials on the cluster: whether a cluster can ever hold a run's trial (before
dispatch, and while trials wait), the live line's note on why runs wait, trials that fail before their code
starts, and trials lost with their node (retried without spending their run's `retries`)."""
from __future__ import annotations

import time

from store import Store
from study.engine.errors import root_cause
from study.engine.raytune import run_of
from study.engine.trial import attempts_so_far
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


NEVER_STARTED_LIMIT = 3  # trials in a row that fail before their code runs: the sweep stops


class SweepWatch:
    """What watches one sweep (`dispatch`), fed by Ray Tune's trial events through one callback (`callback`):

    - the live view (`view`: study/engine/progress.py), and Tune's trials as of its last step (`trials`);
    - placement: every EVERY_S while trials wait, that each pending one still fits on some alive node (the
      cluster can shrink under a run); one that never can ends the experiment (`unplaceable`) instead of
      pending forever;
    - start failures: trials that fail before their code runs (a worker that cannot import the project, a
      broken worker environment) are taken by Tune as any failed trial, retried, and every one fails alike.
      A trial failed before its code ran when its run's attempts file (logs/<run_id>.attempts, one line per
      start of the trainable) did not grow; after NEVER_STARTED_LIMIT such failures in a row (a trial
      reporting a result resets the count) the experiment stops (`never_started` says why in one line);
    - node losses (below: retried without spending the run's `retries`);
    - Ctrl-C: the SIGINT handler of the sweep (`sigint`): a first one stops every trial (they keep their
      checkpoints, the sweep's outcome is said, exit 130: `interrupted`); a second raises KeyboardInterrupt.
    `stopper()` ends the whole experiment once one of those reasons is set."""

    EVERY_S = 10.0

    def __init__(self, ray, store: Store, view):
        self.ray, self.store, self.view = ray, store, view
        self.trials: list = []
        self.unplaceable = self.never_started = self.interrupted = None
        self.last = time.time()
        self.starts: dict[str, int] = {}  # run id -> its attempts when Tune first started a trial of it
        self.in_a_row = 0
        self.note = {"at": 0.0, "text": ""}
        view.waiting = self.waiting

    def waiting(self) -> str:
        """The live line's note on why runs wait (waiting_note), asked of Ray at most every WAITING_EVERY_S."""
        note = self.note
        if time.time() - note["at"] < WAITING_EVERY_S:  # the terminal bar redraws every Tune step
            return note["text"]
        note["at"], note["text"] = time.time(), ""
        trials = self.trials
        if any(t.status == "RUNNING" for t in trials):  # Tune reserves the first trials' resources before they start
            asks = [(r.cpu, r.gpu) for r in (run_of(t.config).resources for t in trials if t.status == "PENDING")]
            if asks:
                note["text"] = waiting_note(asks, self.ray.available_resources(), self.ray.cluster_resources())
        return note["text"]

    def check_placement(self, trials) -> None:
        if self.unplaceable or time.time() - self.last < self.EVERY_S:
            return
        self.last = time.time()
        pending = [run_of(t.config) for t in trials if t.status == "PENDING"]
        if pending:
            never = unplaceable(pending, node_resources(self.ray))
            self.unplaceable = "; ".join(never) or None

    def run_id(self, trial) -> str:
        rid = run_of(trial.config).run_id
        if rid not in self.starts:
            self.starts[rid] = attempts_so_far(self.store, rid)
        return rid

    def failed(self, trial) -> None:
        rid = self.run_id(trial)
        now = attempts_so_far(self.store, rid)
        if now > self.starts[rid]:  # its code ran: the run's own failure, not the workers'
            self.starts[rid] = now
            self.in_a_row = 0
            return
        self.in_a_row += 1
        if self.in_a_row >= NEVER_STARTED_LIMIT and self.never_started is None:
            self.never_started = (f"{self.in_a_row} trials in a row failed before their code started (the last, run "
                                  f"{rid}: {trial_error(trial)})")

    def sigint(self, signum, frame) -> None:
        if self.interrupted is not None:
            raise KeyboardInterrupt
        self.interrupted = "interrupted"

    def stopper(self):
        """A Tune stopper that ends the whole experiment once a reason to stop is set."""
        from ray.tune import Stopper

        sweep = self

        class StopOnReason(Stopper):
            def __call__(self, trial_id, result):
                return False

            def stop_all(self):
                return any(r is not None for r in (sweep.unplaceable, sweep.never_started, sweep.interrupted))

        return StopOnReason()

    def callback(self):
        """The Ray Tune callback that feeds this watch; the live view keyed by run id (a search's trial owes
        its run's steps from its start)."""
        from ray.tune import Callback

        sweep, view = self, self.view

        class SweepEvents(Callback):
            def on_trial_start(self, iteration, trials, trial, **info):  # before its code runs
                run = run_of(trial.config)
                view.steps.setdefault(run.run_id, run.train.steps)
                view.started(run.run_id)
                _patch_tune()  # its node losses counted apart from its genuine failures (see below)
                _watched.setdefault(trial.trial_id, [sweep.store, run.run_id, 0])
                sweep.run_id(trial)

            def on_trial_result(self, iteration, trials, trial, result, **info):
                view.result(run_of(trial.config).run_id)
                sweep.in_a_row = 0

            def on_trial_complete(self, iteration, trials, trial, **info):
                view.finished(run_of(trial.config).run_id, ok=True)

            def on_trial_recover(self, iteration, trials, trial, **info):
                sweep.failed(trial)

            def on_trial_error(self, iteration, trials, trial, **info):
                view.finished(run_of(trial.config).run_id, ok=False)
                sweep.failed(trial)

            def on_step_end(self, iteration, trials, **info):
                sweep.trials[:] = trials
                view.show(force=False)
                sweep.check_placement(trials)

        return SweepEvents()


def trial_error(trial) -> str:
    """The root cause of a Tune trial's last error, one line, from the error text Tune keeps beside the trial
    on the driver (written before its callbacks are called): its last line that reads as an exception (an
    actor that died at start quotes the worker's traceback, whose last such line is the import's)."""
    try:
        with open(trial.error_file, encoding="utf-8", errors="replace") as f:
            return root_cause(f.read()) or "no error recorded"
    except (OSError, TypeError):  # no error file (TypeError: its path is None)
        return "no error recorded"


# ---- a trial whose Ray node died is retried elsewhere without spending its run's `retries` -------------
#
# What Ray (2.60) reports. When a node dies (its raylet killed, the instance gone) every trial
# actor on it dies with it. Tune's driver receives a `RayActorError`: often first
# `ActorUnavailableError` ("Connection reset by peer": the trial's connection broke, cause not yet
# known; this is what `tests/test_cluster_scale.py` sees), otherwise `ActorDiedError` whose message
# the GCS writes as "The actor died because its node has died. Node Id: ...". Within seconds
# (after its health checks fail) the GCS marks the node dead (`ray.nodes()`: `Alive` false). A
# node that the autoscaler drains before a spot preemption gives an error with `.preempted` true.
# A genuine failure looks different: an exception raised by the run's own code (a NaN loss, a
# bug, no CUDA) arrives as `RayTaskError`; a trial process killed on a live node (OOM killer,
# segfault) is an `ActorDiedError` whose node is still alive.
#
# How the project tells them apart. Tune's `FailureConfig(max_failures)` counts every failure
# except a preempted one (`Trial._handle_ray_actor_error`). `study run` extends that rule to a
# node death: an actor error whose message says its node died, or whose node (from the run's last
# heartbeat in the store) Ray lists as dead (after an `ActorUnavailableError`, waiting up to
# `VERDICT_WAIT_S` for the GCS to decide; Tune's loop waits with it), is not counted against `retries`, up to
# `NODE_LOSS_RETRIES` node losses per run and sweep (a run that loses that many nodes has a
# problem of its own: then the loss counts like any failure). Each loss is noted in the run's
# log; the retried trial resumes from the run's last checkpoint in the shared store, and the
# `attempt` column of `history` shows which start computed each step.

NODE_LOSS_RETRIES = 3  # node losses per run and sweep that do not count against the grid's `retries`
NODE_DIED = "its node has died"  # in the GCS's message for an actor lost with its node

# trial_id -> (store, run_id, node losses so far) for the trials of the sweep in progress
_watched: dict[str, list] = {}


def node_lost(exc: BaseException | None, node_id: str | None = None) -> bool:
    """Whether Ray reports this trial failure as its node's death (not the run's own failure)."""
    from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

    if isinstance(exc, RayTaskError):  # an actor error may arrive wrapped in a task error
        exc = exc.as_instanceof_cause()
    if not isinstance(exc, RayActorError):
        return False  # raised by the run's code: a genuine failure
    if exc.preempted or NODE_DIED in str(exc):
        return True
    if node_id is None:
        return False
    if isinstance(exc, ActorUnavailableError):
        # the connection to the trial broke before the GCS decided why: wait for its verdict on the node
        return node_dead(node_id, wait_s=VERDICT_WAIT_S)
    return node_dead(node_id)


VERDICT_WAIT_S = 60.0  # the GCS marks a silent node dead after its health checks fail (~15 s by default)


def node_dead(node_id: str, wait_s: float = 0.0) -> bool:
    """Whether Ray lists the node as dead, waiting up to `wait_s` for it to say so."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        if any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def unwatch_all() -> None:
    _watched.clear()


def _patch_tune() -> None:
    """Tune decides in `Trial._handle_ray_actor_error` whether an actor's death counts as a failure
    (a preempted node does not); a node death is added to that rule for the watched trials."""
    from ray.tune.experiment.trial import Trial

    tune_rule = getattr(Trial, "_handle_ray_actor_error", None)
    if getattr(Trial, "_rmdm_node_loss", False) or tune_rule is None:
        return  # patched already, or a Ray without that hook: a node loss then counts against retries

    def _handle_ray_actor_error(self, exc):
        w = _watched.get(self.trial_id)
        if w is not None and not getattr(exc, "preempted", False):
            store, run_id, losses = w
            hb = store.read_progress().get(run_id, {})
            if losses < NODE_LOSS_RETRIES and node_lost(exc, hb.get("node_id")):
                w[2] = losses + 1
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                store.append_log(run_id, f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} attempt {hb.get('attempt', '?')} lost its node {hb.get('node_id')} "
                                         f"({type(exc).__name__}: {first}): retried on another node, not counted "
                                         f"against retries (node loss {losses + 1}/{NODE_LOSS_RETRIES})")
                return
        tune_rule(self, exc)

    Trial._handle_ray_actor_error = _handle_ray_actor_error
    Trial._rmdm_node_loss = True

