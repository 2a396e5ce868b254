"""The live view of a sweep or search (`study run`, `study tune`), fed by Ray Tune's trial events, and the
summary line it shares with `study status` (study/commands/status.py); whether a failed run's trial
started again since its row was written (a `--retry-failed` under way)."""
from __future__ import annotations

import math
import sys
import time

from store import Store


def retried_since(store: Store, run_id: str, row: dict | None) -> bool:
    """Whether the run's trial started again (logs/<run_id>.attempts) after its failed row was written:
    a `--retry-failed` that is running or was interrupted. The row's error is then the previous attempt's."""
    import datetime as dt

    if not row or row.get("created_at") is None:
        return False
    raw = store.read_bytes(store.path("logs", f"{run_id}.attempts"))
    if not raw:
        return False
    try:
        last = float(raw.decode(errors="replace").strip().splitlines()[-1].split()[-1])
        at = row["created_at"]
        if not isinstance(at, dt.datetime):
            import pandas as pd

            at = pd.Timestamp(at).to_pydatetime()
        if at.tzinfo is None:
            at = at.replace(tzinfo=dt.timezone.utc)
        return last > at.timestamp()
    except (ValueError, IndexError, TypeError, OverflowError):
        return False


def fmt_duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def summary_line(c: dict[str, int], total: int, eta: float | None, elapsed: float | None = None,
                 waiting: str = "") -> str:
    """`waiting`: why the pending runs wait (the live view's "waiting for cpu: 0 free of 2")."""
    head = f"[{fmt_duration(elapsed)}] " if elapsed is not None else ""
    interrupted = f"  interrupted {c['interrupted']}" if c.get("interrupted") else ""
    pending = f"{c['pending']} ({waiting})" if waiting else f"{c['pending']}"
    return (f"{head}done {c['done']}/{total}  running {c['running']}  pending {pending}{interrupted}  "
            f"failed {c['failed']}  eta {fmt_duration(eta)}")


class LiveView:
    """The live line of `study run` and `study tune`, fed by Tune trial events.

    On a terminal it is one tqdm line over finished runs, redrawn in place, with this line's own elapsed
    time and ETA only (tqdm's own rate and remaining time are left out: one ETA); otherwise (logs, tests)
    one line per change of state, and at most one progress line every `every_s` seconds in between.
    The ETA is "?" until a pace is measured: a run's steps between two of its own reports, never the
    time the trials took to start.
    """

    BAR_FORMAT = "{desc} |{bar:12}|"  # the line, then a bar of finished runs

    def __init__(self, total: int, steps: dict[str, int], echo=print, every_s: float = 30.0, tty: bool | None = None):
        self.total, self.steps, self.echo, self.every_s = total, steps, echo, every_s
        self.t0 = self.last = time.time()
        self.step: dict[str, int] = {}
        self.step0: dict[str, int] = {}  # first reported step of each run here (resumed runs start > 0)
        self.seen0: dict[str, float] = {}  # when each run first reported a step here
        self.seen: dict[str, float] = {}  # when each run last reported a step
        self.pace: float | None = None  # steps per second of the runs last measured (kept between runs)
        self.running: set[str] = set()
        self.done = self.failed = 0
        self.waiting = None  # () -> why the pending runs wait ('' when they do not); set by the runner
        self.bar = None  # drawn at the first update (lines printed before it, as --log's, keep their own lines)
        self.tty = tty if tty is not None else sys.stderr.isatty()

    def rate(self, run_id: str) -> float | None:
        """Training steps per second of one run, between its first and its latest report here."""
        dt = self.seen.get(run_id, 0.0) - self.seen0.get(run_id, 0.0)
        trained = self.step.get(run_id, 0) - self.step0.get(run_id, 0)
        return trained / dt if dt > 0 and trained > 0 else None

    def eta(self) -> float | None:
        # the pace of the runs training now (their rates add up: they train side by side), over the
        # steps every run still owes; None until some run has reported twice
        rates = [r for r in (self.rate(rid) for rid in self.running) if r]
        if rates:
            self.pace = sum(rates)
        if not self.pace:
            return None
        left = sum(max(0, n - self.step.get(r, 0)) for r, n in self.steps.items())
        return left / self.pace

    def line(self) -> str:
        c = {"done": self.done, "running": len(self.running), "failed": self.failed,
             "pending": self.total - self.done - self.failed - len(self.running), "interrupted": 0}
        waiting = self.waiting() if self.waiting is not None and c["pending"] > 0 else ""
        return summary_line(c, self.total, self.eta(), time.time() - self.t0, waiting)

    def show(self, force: bool = True) -> None:
        if self.tty and self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="run", dynamic_ncols=True, file=sys.stderr,
                            bar_format=self.BAR_FORMAT, desc=self.line())  # never drawn without the line
        if self.bar is not None:
            self.bar.n = self.done + self.failed
            self.bar.set_description_str(self.line(), refresh=True)
            return
        if force or time.time() - self.last >= self.every_s:
            self.last = time.time()
            self.echo(self.line())

    # ---- events ----------------------------------------------------------------------------
    def started(self, run_id: str) -> None:
        self.running.add(run_id)
        self.show()

    def result(self, run_id: str, step: int | None) -> None:
        if step is not None:
            now = time.time()
            self.step0.setdefault(run_id, step + 1)
            self.seen0.setdefault(run_id, now)
            self.step[run_id], self.seen[run_id] = step + 1, now
        self.show(force=False)

    def finished(self, run_id: str, ok: bool) -> None:
        self.running.discard(run_id)
        if ok:
            self.done += 1
            if run_id in self.step0:
                self.step[run_id] = self.steps.get(run_id, 0)
            else:  # evaluated only, or finished before reporting: no pace to learn from it
                self.steps.pop(run_id, None)
        else:
            self.failed += 1
            self.steps.pop(run_id, None)
        self.show()

    def close(self) -> None:
        """Ends the terminal line (before anything else is printed); again: nothing."""
        if self.bar is not None:
            self.bar.close()
        self.bar, self.tty = None, False


def trial_progress(view: LiveView, steps: int):
    """A Ray Tune callback feeding `view` with the trials of a search (`study tune`): keyed by trial, each
    owing `steps` training steps (a trial's step is its result's `train_step`, else its `step`)."""
    from ray.tune import Callback

    def step_of(result: dict) -> int | None:
        s = result.get("train_step", result.get("step"))
        return int(s) if isinstance(s, (int, float)) and math.isfinite(s) else None

    class TrialProgress(Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            view.steps[trial.trial_id] = steps
            view.started(trial.trial_id)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            view.result(trial.trial_id, step_of(result))

        def on_trial_complete(self, iteration, trials, trial, **info):
            view.finished(trial.trial_id, ok=True)

        def on_trial_error(self, iteration, trials, trial, **info):
            view.finished(trial.trial_id, ok=False)

        def on_step_end(self, iteration, trials, **info):
            view.show(force=False)

    return TrialProgress()
