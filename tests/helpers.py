"""Helpers the process-level tests share: a tiny grid, `study` subprocesses, ending what a test started.

Not a test module; imported as `from tests.helpers import ...` (the repository root is on sys.path).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from study.engine.raystart import descendants  # the tests end what they started by PID

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "tiny"  # the study of the stores tests/conftest.py trains once per session (tiny_run, tiny_study)


def tiny_grid(study: str, *, steps: int = 20, n_test: int = 16, T: str = "[1, 2]", eval_extra: str = "",
              retries: int | None = 1, axes: str | None = "L: [1, 2]", extra: str = "") -> str:
    """A 4x4 Sudoku grid of d_model 16 that trains in seconds; `axes` is the body of `axes:` (None: no axes,
    as where `extra` couples models instead)."""
    lines = [f"study: {study}",
             f"task: {{name: sudoku, n: 4, mask_rate: 0.4, n_train: 40, n_test: {n_test}}}",
             "model: {d_model: 16, n_heads: 2}",
             f"train: {{steps: {steps}, batch_size: 8, warmup: 2, checkpoint_every: 10, log_every: 5}}",
             f"eval: {{T: {T}, L_s: [train], n_examples: {n_test}{eval_extra}}}"]
    if retries is not None:
        lines.append(f"retries: {retries}")
    if extra:
        lines.append(extra)
    if axes is not None:
        lines += ["axes:", f"  {axes}"]
    return "\n".join(lines) + "\n"


def copy_store(src, dst) -> None:
    """A results directory copied to `dst` (which may exist), without the local Ray's session files."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".ray"), dirs_exist_ok=True)


def study_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "study.cli", *args]


def study(*args: str, timeout: int = 600, cwd: str = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """`study ARGS` in a child process, run to its end; `env` adds to this process's environment."""
    return subprocess.run(study_cmd(*args), cwd=cwd, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


FAULTS = os.path.join(ROOT, "tests", "faults")  # the fault injection, loaded where PYTHONPATH holds it


def faulty(nan: dict | None = None, holds: dict | None = None, release=None) -> dict:
    """Environment that injects faults (tests/faults/faultplug.py; run id -> step): weights turned to NaN
    before step `nan[run_id]`, first attempts held before step `holds[run_id]` (until `release` exists).
    The fault plugin is put on PYTHONPATH here and, through Ray's runtime environment, on every node's
    workers (a cluster's other nodes do not inherit the driver's environment)."""
    import json

    env = {k: ",".join(f"{rid}:{at}" for rid, at in v.items())
           for k, v in (("RMDM_FAULT_NAN_AT", nan), ("RMDM_FAULT_HOLD_AT", holds)) if v}
    if release is not None:
        env["RMDM_FAULT_RELEASE_FILE"] = str(release)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, FAULTS])
    return {**env, "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"env_vars": env}})}


def held(runs, at: int = 15, release=None) -> dict:
    """Environment that holds each of `runs`' first attempts before step `at` (faulty): a run is surely
    mid-training, past its checkpoint at step 10, when a test acts, however fast the machine trains. With
    `release` (a path), the held attempts go on once that file exists."""
    return faulty(holds={r.run_id: at for r in runs}, release=release)


def unheld(env: dict) -> dict:
    """`env` without the faults faulty() added (PYTHONPATH kept)."""
    return {k: v for k, v in env.items() if not k.startswith("RMDM_FAULT_") and k != "RAY_JOB_CONFIG_JSON_ENV_VAR"}


def start_driver(gpath, results, address, out, env: dict | None = None):
    """`study run GRID --address ADDR` in the background, in a session of its own, its output in `out`;
    `env` adds to this process's environment."""
    return subprocess.Popen(study_cmd("run", str(gpath), "--results", results, "--address", address), cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT, **(env or {})}, start_new_session=True,
                            stdout=open(out, "w"), stderr=subprocess.STDOUT)


def wait_training(drv, store, out, *, n: int, timeout: float = 400) -> dict:
    """Heartbeats once `n` runs train with a checkpoint at step 10 or later (the driver must live on)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert drv.poll() is None, open(out).read()
        beats = store.read_progress()
        training = [b for b in beats.values() if b.get("phase") == "train" and (b.get("checkpoint") or 0) >= 10]
        if len(training) >= n:
            return beats
        time.sleep(0.2)
    raise AssertionError(f"{n} runs did not checkpoint within {timeout:.0f} s: " + open(out).read())


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of `pids` (processes this test started) and wait until they are gone."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.time() + 30
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)


def kill_driver(drv, tree: list[int]) -> None:
    """The driver (if still alive) and `tree`, its descendants as recorded: Ray's processes outlive it."""
    if drv.poll() is None:
        tree = [*tree, *descendants(drv.pid)]
        os.kill(drv.pid, signal.SIGKILL)
        drv.wait()
    kill_all(tree)


def check_resumed(store, grid, killed: list[str], steps: int):
    """After a kill and a rerun: every run done once, its eval rows once, each training step logged once,
    and each killed run trained from step 0 once and resumed from a checkpoint. Returns (runs, evals, history)."""
    runs = store.read("runs")
    assert sorted(runs.run_id) == sorted(x.run_id for x in grid.runs) and (runs.status == "done").all()
    evals = store.read("evals")
    assert not evals.duplicated(["run_id", "eval_key", "metric"]).any()
    evals = evals[evals.sampler != "likelihood"]  # the sampled points (the continuous quantities: test_continuous.py)
    hist = store.read("history")
    expected = sorted({*range(0, steps, 5), steps - 1})
    for rid, h in hist.groupby("run_id"):
        assert sorted(h.step) == expected, (rid, sorted(h.step))  # each step trained and logged exactly once
    for rid in killed:
        log = store.read_bytes(store.path("logs", f"{rid}.log")).decode()
        assert log.count("training from step 0") == 1 and "resuming from checkpoint at step" in log, log
    return runs, evals, hist


def hooked_block_passes(store, run, pt, scratch: str) -> int:
    """Block passes per example when `run`'s stored weights sample eval point `pt` again in this process,
    counted by a hook on the block (not read from the sampler's own accounting); the rows that
    evaluation writes go to a scratch store under `scratch`, never to `store`."""
    from store import Store
    from study.commands.puzzles import load_run_model
    from study.engine.trial import evaluate_point
    from tasks import make_task

    _, _, model = load_run_model(store, run.run_id)
    rows: list[int] = []  # examples through the block's first layer, one entry per loop of a model call
    hook = model.block[0].register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    task = make_task(run.task)
    with store.task_data() as data_dir:
        task.prepare(data_dir)
    try:
        evaluate_point(run, pt, model, task, task.eval_set(pt.split), Store(scratch, store.study))
    finally:
        hook.remove()
    n = min(pt.n_examples, len(task.eval_set(pt.split).x0))
    assert set(rows) <= {n}, rows  # one batch: every call carries every example, so calls = passes
    return len(rows)


def check_rows_against_samples(evals, samples) -> None:
    """Each evals row derived again from its point's stored per-example scores (the samples table,
    every example kept): the value is their mean, the interval the one `stats` gives those scores
    (Wilson for 0/1 scores; test_stats checks both against hand-worked values)."""
    import json

    import pytest

    from stats import mean_ci, wilson

    for (rid, key), rows in evals.groupby(["run_id", "eval_key"]):
        per = [json.loads(x) for x in samples[(samples.run_id == rid) & (samples.eval_key == key)].scores]
        assert len(per) == rows.n_examples.iloc[0] > 0, (rid, key)
        for r in rows.itertuples():
            vals = [p[r.metric] for p in per]
            lo, hi = wilson(sum(vals), len(vals)) if set(vals) <= {0, 1} else mean_ci(vals)[1:]
            assert (r.value, r.ci_low, r.ci_high) == pytest.approx((sum(vals) / len(vals), lo, hi)), (key, r.metric)


def check_forward_passes(store, grid, evals, scratch: str) -> None:
    """Every stored forward_passes is at most T * L_s (fewer once a step finds nothing left to reveal)
    and exactly the block calls a hook counts when the stored weights sample that point again here."""
    assert (evals.forward_passes <= evals["T"] * evals.L_s).all()
    for run in grid.runs:
        for pt in run.eval_points():
            stored = evals[(evals.run_id == run.run_id) & (evals.eval_key == pt.key)].forward_passes
            assert set(stored) == {hooked_block_passes(store, run, pt, scratch)}, pt.key


def ctrl_c_when(cmd: list[str], cwd, env: dict, ready, timeout: float = 600, after: float = 90) -> tuple[int, str]:
    """Start `cmd`, send it SIGINT (a real Ctrl-C) once `ready()` is true, return (exit code, output).
    The process is killed (by its handle) if it outlives the test."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.time()
        while not ready():
            assert p.poll() is None and time.time() - t0 < timeout, p.stdout.read() if p.poll() is not None else "slow"
            time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=after)[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, out


def full_row(table: str, **values) -> dict:
    """A row of the store's `table` with `values` and every other column None: the store refuses a row
    with a missing column, and a synthetic store's test sets only the columns it reads."""
    from store import SCHEMAS

    unknown = set(values) - set(SCHEMAS[table].names)
    assert not unknown, f"not columns of {table}: {sorted(unknown)}"
    return {**dict.fromkeys(SCHEMAS[table].names), **values}


def edit(path: str, column: str, value, row: int | None = None) -> None:
    """Set `column` of every row (or of row `row`) of a Parquet file, keeping its schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    rows = t.to_pylist()
    for i, r in enumerate(rows):
        if row is None or i == row:
            r[column] = value(r[column]) if callable(value) else value
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), path)


def unwrapped(lines: list[str]) -> list[str]:
    """Terminal lines wrapped at 100 columns (analysis.summary.fit) joined back into one line each: a
    continuation is indented 6 columns deeper than the line it continues."""
    out: list[str] = []
    for line in lines:
        lead = len(line) - len(line.lstrip(" "))
        if out and line.strip() and lead == 6 + len(out[-1]) - len(out[-1].lstrip(" ")):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out
