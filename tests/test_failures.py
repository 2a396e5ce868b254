"""Failures with real processes: a diverging run, a killed trial process, --retry-failed.

Run: pytest tests/test_failures.py  (one real local Ray for the module, real tiny models)
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pandas as pd
import pytest

from study.spec.grid import load_grid
from faultplug import FAULT_ENV, HOLD_ENV, injected_faults
from study.engine.raystart import init_ray
from study.engine.runner import run_grid
from study.commands.status import snapshot
from store import Store
from study.engine.options import RunOptions

TASK = "task: {name: sudoku, n: 4, mask_rate: 0.4, n_train: 40, n_test: 16}\nmodel: {d_model: 16, n_heads: 2}\n"


@pytest.fixture(scope="module")
def local_ray():
    ray, started = init_ray(None, num_cpus=2)  # retries a raylet that times out during startup
    yield ray
    if started:
        ray.shutdown()


def read_log(store: Store, run_id: str, kind: str = "log") -> str:
    return (store.read_bytes(store.path("logs", f"{run_id}.{kind}")) or b"").decode()


@pytest.mark.slow  # five trials on Ray; retry from a checkpoint also: test_killed_trial_process_is_retried_and_finishes
def test_diverging_run_is_retried_from_checkpoint_then_failed_others_finish(tmp_path, local_ray, faults):
    # the bad run's weights turn to NaN before step 2, after the checkpoint at step 2 (fault injection:
    # a huge lr overflows at a step that depends on the CPU's instruction set), so every retry fails
    gpath = tmp_path / "fail.yaml"
    gpath.write_text("study: fail\n" + TASK + "train: {steps: 30, batch_size: 8, warmup: 50, checkpoint_every: 2, "
                     "log_every: 5}\neval: {T: [1], L_s: [train], n_examples: 16}\nretries: 1\n"
                     "axes:\n  seed: [0, 1]\n")
    results = str(tmp_path / "results")
    grid = load_grid(str(gpath))
    good, bad = sorted(grid.runs, key=lambda r: r.train.seed)
    faults(**{FAULT_ENV: f"{bad.run_id}:2"})
    store = Store(results, "fail")
    lines: list[str] = []

    assert run_grid(grid, results, RunOptions(echo=lines.append)) == 1  # non-zero: a run failed
    runs = store.read("runs").set_index("run_id")
    assert runs.loc[good.run_id, "status"] == "done" and pd.isna(runs.loc[good.run_id, "error"])
    assert runs.loc[bad.run_id, "status"] == "failed" and runs.loc[bad.run_id, "attempts"] == 2
    assert "non-finite loss nan at step 2" in runs.loc[bad.run_id, "error"]
    assert runs.loc[bad.run_id, "node_id"]  # where it failed, from its last heartbeat
    assert set(store.read("evals").run_id) == {good.run_id}
    log = read_log(store, bad.run_id)
    # attempt 2 started from the checkpoint, not from step 0; the traceback is kept
    assert "training from step 0" in log and "resuming from checkpoint at step 2 (attempt 2)" in log
    assert log.count("FloatingPointError") >= 2 and "Traceback" in log and "FAILED after 2 attempts" in log
    assert any(f"failed {bad.run_id}" in line for line in lines)
    st = {s.run_id: s for s in snapshot(grid, store)}
    assert st[bad.run_id].state == "failed" and st[good.run_id].state == "done"

    # a rerun skips the failed run (still exit 1) ...
    assert run_grid(grid, results, RunOptions(echo=lines.append)) == 1
    assert read_log(store, bad.run_id, "attempts").count("start") == 2
    assert "failed earlier (use --retry-failed)" in lines[-1]
    # ... unless asked to retry it: two more attempts, recorded again as failed
    assert run_grid(grid, results, RunOptions(retry_failed=True, echo=lines.append)) == 1
    assert read_log(store, bad.run_id, "attempts").count("start") == 4
    runs = store.read("runs")
    assert len(runs) == 2 and runs.set_index("run_id").loc[bad.run_id, "attempts"] == 4


def test_fault_spec_is_parsed_strictly():
    assert injected_faults("abc:2, def:10") == {"abc": 2, "def": 10} and injected_faults("") == {}
    with pytest.raises(ValueError, match="RUN_ID:STEP"):
        injected_faults("abc")


def test_killed_trial_process_is_retried_and_finishes(tmp_path, local_ray, faults):
    gpath = tmp_path / "kill.yaml"
    gpath.write_text("study: kill\n" + TASK + "train: {steps: 100, batch_size: 8, warmup: 2, checkpoint_every: 10, "
                     "log_every: 5}\neval: {T: [1], L_s: [train], n_examples: 16}\nretries: 1\n")
    results = str(tmp_path / "results")
    grid = load_grid(str(gpath))
    (run,) = grid.runs
    store = Store(results, "kill")
    # attempt 1 waits before step 20 (after its checkpoint at 20) until killed: mid-training on any machine
    faults(**{HOLD_ENV: f"{run.run_id}:20"})
    killed: list[int] = []

    def killer():
        deadline = time.time() + 300
        while time.time() < deadline:
            hb = store.read_progress().get(run.run_id, {})
            if hb.get("phase") == "train" and (hb.get("checkpoint") or 0) >= 10 and hb.get("attempt") == 1:
                os.kill(hb["pid"], signal.SIGKILL)  # the trial's worker process, started by this test's Ray
                killed.append(hb["pid"])
                return
            time.sleep(0.1)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    assert run_grid(grid, results, RunOptions(echo=lambda *_: None)) == 0
    t.join()
    assert killed, "the trial finished before it could be killed"
    row = store.run_row(run.run_id)
    assert row["status"] == "done" and row["attempts"] == 2
    log = read_log(store, run.run_id)
    ckpt = int(log.split("resuming from checkpoint at step ")[1].split()[0])
    assert ckpt >= 10 and log.count("training from step 0") == 1
    hist = store.read("history").sort_values("step")
    assert sorted(hist.step) == sorted({*range(0, 100, 5), 99})
    assert (hist[hist.step < ckpt].attempt == 1).all() and (hist[hist.step >= ckpt].attempt == 2).all()

