"""The one ETA of `study run` (the live view) and `study status`, on a fake clock: a sweep of a few runs
trains at a steady pace on fewer slots than runs; its runs' heartbeats are written to a real store as the
trials write them (progress/<run_id>.json, every 5 s), and at every report and between reports both
commands must show the same ETA, within 25% of the true time left from the first report on, counting
down (never frozen, never jumping up); the live bar counts training steps done, not finished runs.
No sleeps, no timing: the clock is a number the test moves.
"""
from __future__ import annotations

import os
import socket

import pytest

from store import Store
from study.commands.status import eta_seconds, snapshot
from study.engine.progress import LiveView
from study.spec.grid import load_grid
from tests.helpers import tiny_grid

RATE = 2.0  # training steps per second of every run
EVERY = 5.0  # seconds between heartbeats (the trials' own interval)


def schedule(n_runs: int, slots: int, steps: int) -> dict[int, tuple[float, float]]:
    """run index -> (start, end) seconds: the first `slots` runs start at 0, each next one when one ends."""
    free, out = [0.0] * slots, {}
    for i in range(n_runs):
        k = min(range(slots), key=free.__getitem__)
        out[i] = (free[k], free[k] + steps / RATE)
        free[k] = out[i][1]
    return out


@pytest.mark.parametrize("axes,slots", [("L: [1, 2, 3]", 2), ("L: [1, 2, 3, 4]", 2), ("L: [1, 2, 3]", 3)])
def test_run_and_status_show_one_eta_within_25_percent_counting_down(tmp_path, axes, slots):
    steps = 100
    g = tmp_path / "g.yaml"
    g.write_text(tiny_grid("etaclock", steps=steps, axes=axes))
    grid = load_grid(str(g))
    store = Store(str(tmp_path / "res"), grid.study)
    ids = [r.run_id for r in grid.runs]
    when = schedule(len(ids), slots, steps)
    end = max(e for _, e in when.values())
    clock = [0.0]
    view = LiveView(len(ids), {r: steps for r in ids}, echo=lambda _: None, tty=False,
                    beats=lambda: store.read_progress(set(ids)), clock=lambda: clock[0])
    me = {"pid": os.getpid(), "node": socket.gethostname(), "steps": steps, "attempt": 0}
    started, ended, etas, bars = set(), set(), [], []
    t = 0.0
    while t < end:
        clock[0] = t
        for i, rid in enumerate(ids):
            start, stop = when[i]
            if start <= t and rid not in started:
                started.add(rid)
                view.started(rid)
            if rid in started and rid not in ended:
                if t >= stop:
                    store.write_progress(rid, {**me, "phase": "done", "step": steps, "train_seconds": steps / RATE,
                                               "time": t})
                    ended.add(rid)
                    view.finished(rid, ok=True)
                elif (t - start) % EVERY == 0:  # the trial's heartbeat: steps done, training seconds spent
                    done = int(RATE * (t - start))
                    store.write_progress(rid, {**me, "phase": "train", "step": done, "train_seconds": t - start,
                                               "time": t})
                    view.result(rid, done - 1 if done else None)
        live = view.eta()
        view.read_at = None  # (the view rereads the store at most once a second: here at every look)
        status = eta_seconds(snapshot(grid, store, now=t), now=t)
        if t >= EVERY:  # from the first report on
            assert live is not None and status is not None, (t, live, status)
            assert live == pytest.approx(status, rel=1e-9), f"run says {live:.1f}s, status {status:.1f}s at t={t}"
            assert abs(live - (end - t)) <= 0.25 * (end - t), f"eta {live:.1f}s, truly {end - t:.1f}s left at t={t}"
            etas.append(live)
            bars.append(view.steps_done())
        t += EVERY / 2  # at every report and half-way between two
    assert all(b <= a + 1e-9 for a, b in zip(etas, etas[1:])), f"the ETA went up: {etas}"
    assert len(set(etas)) == len(etas), f"the ETA froze: {etas}"
    total = steps * len(ids)
    assert 0 < bars[0] < total and bars == sorted(bars), bars  # the bar fills as the runs train
    assert bars[len(bars) // 2] >= total // 4, bars


def test_eta_is_unknown_before_any_run_has_trained_a_measured_step():
    from study.engine.progress import eta

    beats = {"a": {"step": 0, "train_seconds": 0.0, "time": 0.0}}
    assert eta({"a": 10, "b": 10}, beats, {"a"}, 1.0) is None
    assert eta({"a": 10}, {"a": {"step": 5, "train_seconds": 5.0, "time": 0.0}}, set(), 1.0) is None  # none running
    # one slot: a's 5 steps left at 1 step/s (2 s since its heartbeat: 3 left), then b's 10
    assert eta({"a": 10, "b": 10}, {"a": {"step": 5, "train_seconds": 5.0, "time": 0.0}}, {"a"}, 2.0) == 13.0


def test_plan_and_status_say_what_is_resumed_and_what_is_trained(tmp_path):
    """`study run` says which runs resume and from which step, and which are trained and only evaluate;
    `study status` reads a trained run as "trained, evaluating" (or "to evaluate" once stopped), not as
    "interrupted step 40/40 (100%)"."""
    import time

    from study.commands.status import render
    from study.engine.health import Plan, todo_note

    g = tmp_path / "g.yaml"
    g.write_text(tiny_grid("resumenote", steps=40, axes="L: [1, 2, 3, 4]"))
    grid = load_grid(str(g))
    store = Store(str(tmp_path / "res"), grid.study)
    fresh, a, b, trained = (r.run_id for r in grid.runs)
    me = {"pid": os.getpid(), "node": socket.gethostname(), "steps": 40, "attempt": 1, "phase": "train"}
    import torch

    from study.engine.trial import STATE_KEYS

    for rid, step in ((a, 30), (b, 20)):  # interrupted after their checkpoints at 30 and 20 (of 40 steps)
        os.makedirs(os.path.dirname(store.checkpoint_path(rid)), exist_ok=True)
        torch.save({k: step for k in STATE_KEYS}, store.checkpoint_path(rid))
        store.write_progress(rid, {**me, "step": step + 3, "checkpoint": step, "time": 0.0})
    store.write_text(store.checkpoint_path(fresh), "a damaged checkpoint")  # set aside by its trial: step 0
    store.write_text(store.weights_path(trained), "final weights")
    store.write_progress(trained, {**me, "step": 40, "checkpoint": 40, "phase": "eval", "time": 0.0})
    plan = Plan(done=[], todo=list(grid.runs), failed=[])
    assert todo_note(store, plan) == "1 to run, 2 to resume (from steps 20 to 30), 1 trained, evaluating"
    assert todo_note(store, Plan([], [r for r in grid.runs if r.run_id == a], [])) == "1 to resume (from step 30)"
    assert todo_note(store, Plan([], [], [])) == "0 to run"

    text = render(grid, store, snapshot(grid, store))  # every heartbeat stale: stopped
    line = next(ln for ln in text.splitlines() if trained in ln)
    assert "trained, to evaluate" in line and "100" not in line, text
    store.write_progress(trained, {**me, "step": 40, "train_seconds": 4.0, "phase": "eval", "time": time.time()})
    line = next(ln for ln in render(grid, store, snapshot(grid, store)).splitlines() if trained in ln)
    assert "running" in line and "trained, evaluating" in line, line


def test_the_terminal_bar_fills_as_runs_train_before_any_ends(capsys):
    """On a terminal the bar is training steps done of the steps owed: a 3-run sweep's bar is a third
    full once every run is a third trained, while no run has ended (it counted finished runs before)."""
    clock, beats = [0.0], {}
    view = LiveView(3, {"a": 30, "b": 30, "c": 30}, echo=lambda _: None, tty=True, beats=lambda: dict(beats),
                    clock=lambda: clock[0])
    for rid in "abc":
        view.started(rid)
    clock[0] = 10.0
    for rid in "abc":
        beats[rid] = {"step": 10, "train_seconds": 10.0, "time": 10.0, "phase": "train"}
    view.read_at = None
    view.show()
    assert view.done == 0 and (view.bar.n, view.bar.total) == (30, 90), (view.bar.n, view.bar.total)
    assert "eta 0m20s" in str(view.bar.desc)
    view.close()
    assert "eta 0m20s" in capsys.readouterr().err


def test_the_bar_shows_on_a_terminal_of_zero_columns(monkeypatch):
    """A pseudo-terminal whose size was never set (`script`, `expect`, some containers) says 0 columns:
    tqdm drew nothing there for the whole run (only a newline); the line is drawn at a fixed width."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    term = os.fdopen(slave, "w")
    monkeypatch.setattr("sys.stderr", term)
    clock, beats = [0.0], {"a": {"step": 10, "train_seconds": 10.0, "time": 10.0, "phase": "train"}}
    view = LiveView(2, {"a": 30, "b": 30}, echo=lambda _: None, tty=True, beats=lambda: dict(beats),
                    clock=lambda: clock[0])
    view.started("a")
    clock[0] = 10.0
    view.read_at = None
    view.show()
    view.close()
    term.flush()
    shown = os.read(master, 65536).decode()
    term.close()
    os.close(master)
    assert "done 0/2" in shown and "eta" in shown, repr(shown)


def test_the_eta_does_not_jump_up_between_one_runs_end_and_the_next_ones_start():
    """Two slots, four runs of 100 steps at 1 step/s: when one run ends and the next has not started yet,
    the ETA still counts two slots (the sweep's, seen running at once), not one: it does not double."""
    from study.engine.progress import LiveView

    now = [0.0]
    beats = {}
    view = LiveView(4, {f"r{i}": 100 for i in range(4)}, echo=lambda s: None, tty=False, beats=lambda: beats,
                    clock=lambda: now[0])
    view.started("r0")
    view.started("r1")
    now[0] = 50.0
    beats.update({r: {"step": 50, "time": 50.0, "train_seconds": 50.0} for r in ("r0", "r1")})
    both = view.eta()
    assert both == pytest.approx(150.0, rel=0.01)  # 50 s each left, then r2 and r3 side by side
    now[0] = 100.0
    beats.update({"r0": {"step": 100, "time": 100.0, "train_seconds": 100.0, "phase": "done"},
                  "r1": {"step": 100, "time": 100.0, "train_seconds": 100.0}})
    view.read_at = None
    view.finished("r0", True)  # r2 not started yet: for a moment one run runs
    gap = view.eta()
    assert gap == pytest.approx(100.0, rel=0.01), gap  # not 200: r2 and r3 still train side by side


def test_the_eta_counts_the_evaluation_left_and_a_finished_study_shows_none():
    """Training done, evaluation under way (issue 44: the last minute showed 0m00s): the points left at the
    measured seconds per point; unknown ("?") before any point was timed; a finished study shows no ETA."""
    from study.engine.progress import eta, summary_line

    trained = {"step": 100, "train_seconds": 50.0, "time": 60.0, "phase": "eval"}
    a = {**trained, "eval": {"started": 50.0, "done": 2, "of": 4, "at": 70.0}}  # 10 s a point, 2 left
    b = {**trained, "eval": {"started": 70.0, "done": 0, "of": 4, "at": 70.0}}  # 5 s into its first point
    assert eta({"a": 100, "b": 100}, {"a": a, "b": b}, {"a", "b"}, 75.0) == pytest.approx(35.0)  # b: 40 s - 5
    assert eta({"a": 100}, {"a": a}, {"a"}, 75.0) == pytest.approx(15.0)  # 20 s of a's, 5 s of it spent
    assert eta({"b": 100}, {"b": b}, {"b"}, 75.0) is None  # no point timed yet: unknown, not 0m00s
    done = {"done": 3, "running": 0, "pending": 0, "failed": 0, "interrupted": 0}
    assert "eta" not in summary_line(done, 3, None)
    assert summary_line({**done, "done": 2, "pending": 1}, 3, None).endswith("eta ?")
