"""A trial whose Ray node died is retried elsewhere without spending its run's `retries`.

What Ray (2.60) reports. When a node dies (its raylet killed, the instance gone) every trial
actor on it dies with it. Tune's driver receives a `RayActorError`: often first
`ActorUnavailableError` ("Connection reset by peer": the trial's connection broke, cause not yet
known; this is what `tests/test_cluster_scale.py` sees), otherwise `ActorDiedError` whose message
the GCS writes as "The actor died because its node has died. Node Id: ...". Within seconds
(after its health checks fail) the GCS marks the node dead (`ray.nodes()`: `Alive` false). A
node that the autoscaler drains before a spot preemption gives an error with `.preempted` true.
A genuine failure looks different: an exception raised by the run's own code (a NaN loss, a
bug, no CUDA) arrives as `RayTaskError`; a trial process killed on a live node (OOM killer,
segfault) is an `ActorDiedError` whose node is still alive.

How the project tells them apart. Tune's `FailureConfig(max_failures)` counts every failure
except a preempted one (`Trial._handle_ray_actor_error`). `study run` extends that rule to a
node death: an actor error whose message says its node died, or whose node (from the run's last
heartbeat in the store) Ray lists as dead (after an `ActorUnavailableError`, waiting up to
`VERDICT_WAIT_S` for the GCS to decide; Tune's loop waits with it), is not counted against `retries`, up to
`NODE_LOSS_RETRIES` node losses per run and sweep (a run that loses that many nodes has a
problem of its own: then the loss counts like any failure). Each loss is noted in the run's
log; the retried trial resumes from the run's last checkpoint in the shared store, and the
`attempt` column of `history` shows which start computed each step.
"""
from __future__ import annotations

import time

from store import Store

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


def watch(trial_id: str, store: Store, run_id: str) -> None:
    """Count this trial's node losses apart from its genuine failures (see the module docstring)."""
    _patch_tune()
    _watched.setdefault(trial_id, [store, run_id, 0])


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


def watcher(store: Store):
    """A Tune callback that watches every trial of a sweep (`study run`, `study tune`) as it starts."""
    from ray.tune import Callback

    from study.engine.raytune import run_of

    class NodeLossWatch(Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            watch(trial.trial_id, store, run_of(trial.config).run_id)

    return NodeLossWatch()
