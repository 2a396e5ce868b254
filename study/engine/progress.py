"""The live view of a sweep or search (`study run`, `study tune`), fed by Ray Tune's trial events, and the
summary line and the one ETA (`eta`) it shares with `study status` (study/commands/status.py); whether a
failed run's trial started again since its row was written (a `--retry-failed` under way)."""
from __future__ import annotations

import datetime as dt
import math
import os
import sys
import time

from store import Store


def retried_since(store: Store, run_id: str, row: dict | None) -> bool:
    """Whether the run's trial started again (logs/<run_id>.attempts) after its failed row was written:
    a `--retry-failed` that is running or was interrupted. The row's error is then the previous attempt's."""
    import pandas as pd

    if not row or row.get("created_at") is None:
        return False
    raw = store.read_bytes(store.path("logs", f"{run_id}.attempts"))
    if not raw:
        return False
    try:
        last = float(raw.decode(errors="replace").strip().splitlines()[-1].split()[-1])
        at = pd.Timestamp(row["created_at"]).to_pydatetime()
        return last > (at if at.tzinfo else at.replace(tzinfo=dt.timezone.utc)).timestamp()
    except (ValueError, IndexError, TypeError, OverflowError):
        return False


def fmt_duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def summary_line(c: dict[str, int], total: int, eta: float | None, elapsed: float | None = None,
                 waiting: str = "") -> str:
    """`waiting`: why the pending runs wait (the live view's "waiting for cpu: 0 free of 2"). A study with
    nothing left to run (or resume) has no ETA to show."""
    head = f"[{fmt_duration(elapsed)}] " if elapsed is not None else ""
    interrupted = f"  interrupted {c['interrupted']}" if c.get("interrupted") else ""
    pending = f"{c['pending']} ({waiting})" if waiting else f"{c['pending']}"
    left = c["running"] + c["pending"] + c.get("interrupted", 0)
    return (f"{head}done {c['done']}/{total}  running {c['running']}  pending {pending}{interrupted}  "
            f"failed {c['failed']}" + (f"  eta {fmt_duration(eta)}" if left else ""))


def pace_of(hb: dict | None) -> float | None:
    """Training steps per second of one run from its heartbeat (progress/<run_id>.json): steps done over
    training seconds spent, both counted over all its attempts; None before it has trained a step."""
    if not hb:
        return None
    step, secs = hb.get("step"), hb.get("train_seconds")
    ok = isinstance(step, (int, float)) and isinstance(secs, (int, float)) and step > 0 and secs > 0
    return float(step) / float(secs) if ok and math.isfinite(step / secs) else None


def _eval_of(hb: dict) -> dict | None:
    """A heartbeat's `eval` (study/engine/trial.py): started, points done, of how many, at (the last one's end)."""
    ev = hb.get("eval")
    ok = isinstance(ev, dict) and all(isinstance(ev.get(k), (int, float)) for k in ("started", "done", "of", "at"))
    return ev if ok else None


def eval_pace(beats: dict[str, dict]) -> float | None:
    """Seconds per eval point, measured over the runs that evaluated one (their heartbeats' `eval`), None
    before any has."""
    paces = [(ev["at"] - ev["started"]) / ev["done"] for ev in map(_eval_of, beats.values()) if ev and ev["done"] > 0]
    return sum(paces) / len(paces) if paces else None


def eta(owed: dict[str, int], beats: dict[str, dict], running: set[str], now: float, slots_n: int = 0) -> float | None:
    """Seconds until the runs still owed (`owed`: run_id -> its training steps) have trained and a run
    that evaluates now has evaluated: the one ETA of `study run` and `study status`.

    Each run's steps left are its steps less those its latest heartbeat (`beats`) says are done, carried
    forward to `now` at its own pace for a running run (so the ETA counts down between heartbeats). A
    run evaluating (its heartbeat's `eval`) has its points left at the measured seconds per point
    (eval_pace). The runs `running` keep their slots (a heartbeat saying "done" frees its slot); the
    others wait and take the first slot that frees, longest first, as the runner orders them. A run not
    measured yet trains at the mean pace of the runs measured (any of `beats`, finished ones too). None
    while no pace is measured, nothing runs, or a run evaluates before any point was timed. `slots_n`:
    the sweep's slots when known (the most runs seen running at once): a slot that is free for a
    moment, between one run's end and the next one's start, still takes a waiting run, so the ETA does
    not jump up each time a run ends."""
    measured = [p for p in (pace_of(hb) for hb in beats.values()) if p]
    running = {r for r in running if r in owed and (beats.get(r) or {}).get("phase") != "done"}
    if not measured or not running:
        return None
    mean, per_point = sum(measured) / len(measured), eval_pace(beats)
    slots, waiting = [], []
    for rid, steps in owed.items():
        hb = beats.get(rid) or {}
        pace = pace_of(hb) or mean
        done = float(hb.get("step") or 0)
        if rid in running and isinstance(hb.get("time"), (int, float)):
            done += pace * max(0.0, now - float(hb["time"]))
        left = max(0.0, steps - min(done, steps)) / pace
        ev = _eval_of(hb) if rid in running and hb.get("phase") == "eval" else None
        if ev:  # its points left; the one under way counted from when the last one ended
            own = (ev["at"] - ev["started"]) / ev["done"] if ev["done"] else per_point
            if own is None:
                return None
            left += max(0.0, own * (ev["of"] - ev["done"]) - (now - ev["at"]))
        (slots if rid in running else waiting).append(left)
    slots += [0.0] * max(0, slots_n - len(slots))  # free for a moment: the next run starts there
    for left in sorted(waiting, reverse=True):  # each into the slot that frees first
        i = min(range(len(slots)), key=slots.__getitem__)
        slots[i] += left
    return max(slots)


class LiveView:
    """The live line of `study run` and `study tune`, fed by Tune trial events.

    On a terminal it is one tqdm line redrawn in place, with this line's own elapsed time and ETA only
    (tqdm's own rate and remaining time are left out: one ETA), and a bar of the training steps done of
    the steps the sweep owes; otherwise (logs, tests) one line per change of state, and at most one
    progress line every `every_s` seconds in between.

    `beats`: () -> the runs' heartbeats (store.read_progress), read at most once a second; the ETA is then
    `eta` over them, as `study status` computes it. The ETA is "?" until a run has trained a measured step.
    `clock`: for tests.
    """

    BAR_FORMAT = "{desc} |{bar:12}|"  # the line, then a bar of training steps done of steps owed

    def __init__(self, total: int, steps: dict[str, int], beats, echo=print, every_s: float = 30.0,
                 tty: bool | None = None, clock=time.time):
        self.total, self.steps, self.echo, self.every_s = total, steps, echo, every_s
        self.clock, self.read_beats = clock, beats
        self.t0 = self.last = clock()
        self.beats: dict[str, dict] = {}  # run_id -> its latest heartbeat
        self.read_at: float | None = None
        self.running: set[str] = set()
        self.peak = 0  # the most runs seen running at once: the sweep's slots
        self.since: dict[str, float] = {}  # when each run started here
        self.ended: set[str] = set()
        self.done = self.failed = 0
        self.waiting = None  # () -> why the pending runs wait ('' when they do not); set by the runner
        self.bar = None  # drawn at the first update (lines printed before it, as --log's, keep their own lines)
        self.tty = tty if tty is not None else sys.stderr.isatty()

    def _refresh(self) -> None:
        now = self.clock()
        if self.read_at is None or now - self.read_at >= 1.0:
            self.read_at = now
            try:
                self.beats = self.read_beats()
            except OSError:
                pass  # a missed read only makes the line less precise

    def current(self) -> dict[str, dict]:
        """The heartbeats as of now; a running run's heartbeat of an earlier attempt (older than its start
        here) counts as its checkpoint's step, unmeasured, until its new attempt writes one."""
        self._refresh()
        return {r: ({"step": hb.get("checkpoint") or 0} if r in self.since and isinstance(hb.get("time"), (int, float))
                    and hb["time"] < self.since[r] else hb) for r, hb in self.beats.items()}

    def eta(self, beats: dict[str, dict] | None = None) -> float | None:
        owed = {r: n for r, n in self.steps.items() if r not in self.ended}
        return eta(owed, self.current() if beats is None else beats, self.running, self.clock(), self.peak)

    def steps_done(self, beats: dict[str, dict] | None = None) -> int:
        """Training steps done of those the sweep owes (a finished run: all of its steps)."""
        beats = self.current() if beats is None else beats
        return sum(n if r in self.ended else min(n, int((beats.get(r) or {}).get("step") or 0))
                   for r, n in self.steps.items())

    def line(self) -> str:
        c = {"done": self.done, "running": len(self.running), "failed": self.failed,
             "pending": self.total - self.done - self.failed - len(self.running), "interrupted": 0}
        waiting = self.waiting() if self.waiting is not None and c["pending"] > 0 else ""
        return summary_line(c, self.total, self.eta(), self.clock() - self.t0, waiting)

    def show(self, force: bool = True) -> None:
        if self.tty and self.bar is None:
            from tqdm import tqdm

            fixed = not _columns(sys.stderr)  # a terminal of 0 columns and rows: tqdm would draw nothing there
            self.bar = tqdm(total=max(1, sum(self.steps.values())), unit="step", dynamic_ncols=not fixed,
                            ncols=100 if fixed else None, nrows=24 if fixed else None, file=sys.stderr,
                            bar_format=self.BAR_FORMAT, desc=self.line())  # never without the line
        if self.bar is not None:
            text = self.line()
            self.bar.total = max(1, sum(self.steps.values()))
            self.bar.n = self.steps_done()
            self.bar.set_description_str(text, refresh=True)
            return
        if force or self.clock() - self.last >= self.every_s:
            self.last = self.clock()
            self.echo(self.line())

    # ---- events ----------------------------------------------------------------------------
    def started(self, run_id: str) -> None:
        self.running.add(run_id)
        self.peak = max(self.peak, len(self.running))
        self.since[run_id] = self.clock()
        self.show()

    def result(self, run_id: str, step: int | None = None) -> None:
        """A result of `run_id`'s trial: the line redrawn (its steps are read from the heartbeats)."""
        self.show(force=False)

    def finished(self, run_id: str, ok: bool) -> None:
        self.running.discard(run_id)
        self.ended.add(run_id)
        if ok:
            self.done += 1
        else:
            self.failed += 1
            self.steps.pop(run_id, None)
        self.show()

    def close(self) -> None:
        """Ends the terminal line (before anything else is printed); again: nothing."""
        if self.bar is not None:
            self.bar.close()
        self.bar, self.tty = None, False


def _columns(f) -> int | None:
    """The columns of the terminal `f` is, 0 where it says it has none (a pseudo-terminal whose size was never
    set: `script`, `expect`, some containers), None where `f` is no terminal or cannot tell."""
    try:
        return os.get_terminal_size(f.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return None
