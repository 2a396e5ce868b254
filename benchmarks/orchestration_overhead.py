"""Orchestration overhead of `study run` (Ray Tune) against a plain Python loop, same runs, same machine.

1. overhead_ratio: wall time of `study run GRID` (a fresh process: Ray start, Tune, one trial per
   run, Parquet writes) over the wall time of one plain Python process that executes the same
   runs one after another with `study.engine.trial.execute` (same training, evaluation and writes; no Ray).
   Each run gets every CPU (`resources.cpu` = --cpus, torch threads = --cpus) in both, so the
   ratio is the cost of orchestration, not of different parallelism.
2. resume_to_training_s: a `study run` is SIGKILLed after its first checkpoint; the time from
   starting `study run` again to the interrupted run training again (its attempt-2 heartbeat).

Run: nice -n 15 .venv/bin/python benchmarks/orchestration_overhead.py [--runs 8 --steps 400 --cpus 2]
The last line is machine-readable: overhead_ratio=<r> resume_to_training_s=<s>
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.helpers import descendants  # noqa: E402

GRID = """
study: {study}
task: {{name: sudoku, n: 9, mask_rate: 0.25, n_train: 2000, n_test: 100}}
model: {{d_model: {d}, n_heads: 4}}
train: {{steps: {steps}, batch_size: 64, lr: 3.0e-3, warmup: 20, checkpoint_every: {ckpt}, log_every: 25}}
eval: {{T: [2], L_s: [train], n_examples: 100}}
resources: {{cpu: {cpus}}}
axes:
  seed: {seeds}
"""
LOOP = """
import sys, time
t0 = time.perf_counter()
from study.spec.grid import load_grid
from store import Store
from study.engine.trial import execute
from study.engine.options import TrialOptions
grid = load_grid(sys.argv[1])
store = Store(sys.argv[2], grid.study)
for run in grid.runs:
    t = time.perf_counter()
    row = execute(run, store, TrialOptions("bench"))
    print(f"run {run.run_id}: {time.perf_counter() - t:.1f}s (train {row['train_seconds']:.1f}s)", flush=True)
print(f"loop_total={time.perf_counter() - t0:.2f}")
"""


def write_grid(d: str, study: str, args, steps: int | None = None) -> str:
    path = os.path.join(d, f"{study}.yaml")
    with open(path, "w") as f:
        f.write(GRID.format(study=study, d=args.d_model, steps=steps or args.steps, ckpt=args.ckpt, cpus=args.cpus,
                            seeds=list(range(args.runs))))
    return path


def study(*a: str) -> list[str]:
    return [sys.executable, "-m", "study.cli", *a]


def heartbeats(results: str, name: str) -> list[dict]:
    d = os.path.join(results, name, "progress")
    out = []
    for f in os.listdir(d) if os.path.isdir(d) else []:
        if f.endswith(".json") and not f.startswith("."):
            try:
                with open(os.path.join(d, f)) as fh:
                    out.append(json.load(fh))
            except (OSError, ValueError):
                pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--ckpt", type=int, default=50)
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": ROOT}
    tmp = tempfile.mkdtemp(prefix="orch-bench-")
    results = os.path.join(tmp, "results")
    print(f"{args.runs} runs: 9x9 Sudoku, d_model {args.d_model}, {args.steps} steps of batch 64, "
          f"{args.cpus} CPUs per run; load average before: {os.getloadavg()[0]:.1f}", flush=True)

    # reference: the same runs in one plain Python loop (no Ray), same code path for training and writes
    gloop = write_grid(tmp, "bench_loop", args)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", LOOP, gloop, results], cwd=ROOT, env=env, capture_output=True,
                       text=True)
    loop_s = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"plain loop failed:\n{r.stderr}")
    print(r.stdout.strip(), flush=True)
    print(f"plain loop: {loop_s:.1f}s wall", flush=True)

    # the same runs through `study run` (a different study name: nothing is skipped)
    grun = write_grid(tmp, "bench_run", args)
    t = time.perf_counter()
    r = subprocess.run(study("run", grun, "--results", results, "--num-cpus", str(args.cpus)), cwd=ROOT, env=env,
                       capture_output=True, text=True)
    run_s = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"study run failed:\n{r.stdout}\n{r.stderr}")
    print("\n".join(r.stdout.strip().splitlines()[:2]), flush=True)
    print(f"study run: {run_s:.1f}s wall", flush=True)
    ratio = run_s / loop_s

    # resume: kill a `study run` after its first checkpoint, time the rerun until training resumes
    gres = write_grid(tmp, "bench_resume", argparse.Namespace(**{**vars(args), "runs": 1}), steps=args.steps * 4)
    drv = subprocess.Popen(study("run", gres, "--results", results, "--num-cpus", str(args.cpus)), cwd=ROOT,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 900
    while not any(b.get("checkpoint") for b in heartbeats(results, "bench_resume")):
        if time.time() > deadline or drv.poll() is not None:
            sys.exit("no checkpoint from the first `study run`")
        time.sleep(0.1)
    tree = descendants(drv.pid)
    os.kill(drv.pid, signal.SIGKILL)
    drv.wait()
    for p in tree:  # processes this benchmark started (the killed driver's Ray)
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(2)
    t = time.perf_counter()
    drv = subprocess.Popen(study("run", gres, "--results", results, "--num-cpus", str(args.cpus)), cwd=ROOT,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while not any(b.get("attempt") == 2 and b.get("phase") == "train" for b in heartbeats(results, "bench_resume")):
        if drv.poll() is not None:
            sys.exit("the resumed `study run` ended before training")
        time.sleep(0.05)
    resume_s = time.perf_counter() - t
    print(f"resumed study run: training again after {resume_s:.1f}s", flush=True)
    tree = descendants(drv.pid)
    drv.send_signal(signal.SIGINT)  # Tune stops gracefully; the run is left resumable
    try:
        drv.wait(timeout=120)
    except subprocess.TimeoutExpired:
        drv.kill()
        drv.wait()
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"load average after: {os.getloadavg()[0]:.1f}; scratch dir {tmp}")
    print(f"overhead_ratio={ratio:.3f} resume_to_training_s={resume_s:.1f}")


if __name__ == "__main__":
    main()
