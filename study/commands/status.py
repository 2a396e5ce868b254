"""Where a sweep stands: done / running / pending / failed, with an ETA.

Two sources, one summary. `study status GRID` reads the store only (runs rows, eval files,
per-run heartbeats in progress/, checkpoints), so it works at any time, from any machine
that sees the store, also while another process runs the sweep. `study run` draws the same
line live from Ray Tune's trial events.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from study.engine.errors import root_cause
from study.engine.progress import eta, pace_of, retried_since, summary_line
from study.spec.grid import Grid
from store import Store

STALE_S = 60.0  # a heartbeat older than this: the run is not running any more (heartbeats come every 5 s)
STATES = ("done", "running", "interrupted", "pending", "failed")


@dataclass
class RunStatus:
    run_id: str
    state: str  # one of STATES
    step: int  # training steps done (latest heartbeat or checkpoint)
    steps: int
    evals_done: int
    evals_total: int
    checkpoint: int | None = None  # step a restart resumes from
    node: str | None = None
    error: str | None = None
    rate: float | None = None  # training steps per second of this run
    beat_time: float | None = None  # when its latest heartbeat was written
    phase: str | None = None  # its heartbeat's phase (start, train, eval, done, error)
    trained: bool = False  # its final weights are there: what is left of it is evaluation
    eval: dict | None = None  # its heartbeat's eval points under way (the ETA's: study.engine.progress.eta)


def snapshot(grid: Grid, store: Store, now: float | None = None, stale_s: float = STALE_S) -> list[RunStatus]:
    """The status of every run of `grid`, from the store alone (reads whole files: consistent)."""
    now = time.time() if now is None else now
    beats = store.read_progress()
    seen = store.summary()  # one pass over the store, not a few reads per run and point
    out = []
    for run in grid.runs:
        rid = run.run_id
        row = seen.run_row(rid)
        keys = {p.key for p in run.eval_points()}
        n_eval = len(keys & seen.eval_keys(rid))
        hb = beats.get(rid, {})
        steps = run.train.steps
        step = int(hb.get("step") or 0)
        ckpt = hb.get("checkpoint")
        fresh = (bool(hb) and now - float(hb.get("time", 0)) < stale_s and hb.get("phase") not in ("error",)
                 and _maybe_alive(hb))
        rate = pace_of(hb)
        trained = store.exists(store.weights_path(rid))
        status = row["status"] if row else None
        error = root_cause(row.get("error")) if row else None  # one plain line, also of rows stored whole
        if status == "failed" and retried_since(store, rid, row):  # a later attempt (--retry-failed) started:
            status, error = None, None  # its state is its own (running, interrupted), not the old failure
        # an unreadable history is a run `study run` redoes (as classify does): not done
        if status == "done" and n_eval == len(keys) and seen.history_readable(rid):
            state, step = "done", steps
        elif status == "failed" and not fresh:
            state = "failed"
        elif fresh:
            state = "running"
        elif hb or trained or store.exists(store.checkpoint_path(rid)):
            state = "interrupted"  # started, then stopped: a rerun resumes it
            if trained:
                step = steps
        else:
            state = "pending"
        out.append(RunStatus(rid, state, step, steps, n_eval, len(keys), ckpt, hb.get("node_ip") or hb.get("node"),
                             error, rate, hb.get("time"), hb.get("phase"),
                             trained and state != "done", hb.get("eval")))
    return out


def _maybe_alive(hb: dict) -> bool:
    """False only when the heartbeat's process ran on this host and is gone (a killed trial; a killed process
    nobody reaped yet, a zombie, too)."""
    from store.lease import proc_start

    return hb.get("node") != socket.gethostname() or not hb.get("pid") or proc_start(int(hb["pid"])) is not None


def eta_seconds(statuses: list[RunStatus], now: float | None = None) -> float | None:
    """Seconds of training left at the measured pace: study.engine.progress.eta, as `study run` shows it
    live, over the runs not done nor failed; None if unknown (nothing running, or no pace measured yet)."""
    owed = {s.run_id: s.steps for s in statuses if s.state in ("running", "pending", "interrupted")}
    beats = {s.run_id: {"step": s.step, "time": s.beat_time, "phase": s.phase, "eval": s.eval,
                        **({"train_seconds": s.step / s.rate} if s.rate else {})} for s in statuses}
    running = {s.run_id for s in statuses if s.state == "running"}
    return eta(owed, beats, running, time.time() if now is None else now)


def counts(statuses: list[RunStatus]) -> dict[str, int]:
    return {k: sum(s.state == k for s in statuses) for k in STATES}


def render(grid: Grid, store: Store, statuses: list[RunStatus], now: float | None = None) -> str:
    """The `study status` text: one summary line, then one line per run not done (a trained one: "trained,
    evaluating" while it runs, "trained, to evaluate" when stopped; a rerun only evaluates it)."""
    lines = [f"study {grid.study} ({store.dir}): " + summary_line(counts(statuses), len(statuses),
                                                                    eta_seconds(statuses, now))]
    for path, why in sorted(store.unreadable.items()):
        lines.append(f"  unreadable, skipped: {path} ({why})")
    for s in statuses:
        if s.state == "done":
            continue
        pct = 100.0 * s.step / s.steps if s.steps else 0.0
        extra = f"  checkpoint@{s.checkpoint}" if s.checkpoint else ""
        extra += f"  on {s.node}" if s.node and s.state == "running" else ""
        extra += f"  error: {root_cause(s.error)}" if s.error and s.state == "failed" else ""
        where = (("trained, evaluating" if s.state == "running" else "trained, to evaluate")
                 if s.trained and s.state in ("running", "interrupted")
                 else f"step {s.step:>6}/{s.steps:<6} ({pct:5.1f}%)")
        lines.append(f"  {s.run_id}  {s.state:<11} {where}  evals {s.evals_done}/{s.evals_total}{extra}")
    return "\n".join(lines)
