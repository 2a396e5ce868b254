"""`study plan` at scale: seconds per 1,000 runs of a 10,000-run grid.

Run: .venv/bin/python benchmarks/plan_scale.py [--runs 10000] [--reference-runs 300]
(a benchmark, not a test: run it on a quiet machine; figures go to benchmarks/RESULTS.md by hand)

Prints, from one process:
- plan: the real CLI (`study plan GRID --json`, typer's CliRunner, output captured) on a grid of
  `--runs` runs: 2 K x 2 L x 5 lr x (runs/20) seeds of 9x9 Sudoku, d_model 128;
- reference: what planning cost per run before costs were shared across runs of one model (a
  meta-device model built per run: Run.costs uncached), measured on `--reference-runs` runs of the
  same grid in the same process, scaled to 1,000 runs;
- their ratio (the machine's speed cancels out), and the CPU model and its vector/matrix flags.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def cpu() -> str:
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return f"{model}, {os.cpu_count()} CPUs, flags: {' '.join(f for f in wanted if f in flags) or 'none of ' + ','.join(wanted)}"


def grid_text(n_runs: int) -> str:
    seeds = max(1, n_runs // 20)
    return ("study: planscale\n"
            "task: {name: sudoku, n: 9, mask_rate: 0.3}\n"
            "model: {d_model: 128, n_heads: 4}\n"
            "train: {steps: 1000, batch_size: 64}\n"
            "eval: {T: [1, 2, 4, 8], L_s: [train, 1]}\n"
            "axes:\n  K: [1, 2]\n  L: [1, 4]\n  lr: [0.0003, 0.001, 0.002, 0.003, 0.01]\n"
            f"  seed: [{', '.join(str(s) for s in range(seeds))}]\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--reference-runs", type=int, default=300)
    args = ap.parse_args()

    from typer.testing import CliRunner

    import study.spec.grid as sg
    from study.cli import app

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "planscale.yaml")
        with open(path, "w") as f:
            f.write(grid_text(args.runs))
        sg._costs.cache_clear()
        t0 = time.perf_counter()
        r = CliRunner().invoke(app, ["plan", path, "--json"])
        plan_s = time.perf_counter() - t0
        if r.exit_code != 0:
            sys.exit(f"plan failed: {r.output[-2000:]}")
        n = r.output.count("\n")

        runs = sg.load_grid(path).runs[:args.reference_runs]
        t0 = time.perf_counter()
        for run in runs:  # the former Run.costs: one model per run
            sg._costs.__wrapped__(run.task.name, run.task.model_dump_json(), run.model.model_dump_json())
        ref_s = time.perf_counter() - t0

    plan_k, ref_k = plan_s / n * 1000, ref_s / len(runs) * 1000
    print(f"cpu: {cpu()}")
    print(f"plan: {n} runs in {plan_s:.2f} s = {plan_k:.3f} s per 1,000 runs (whole CLI: YAML, expansion, costs, JSON)")
    print(f"reference: one model built per run = {ref_k:.3f} s per 1,000 runs (measured on {len(runs)} runs)")
    print(f"ratio plan / reference: {plan_k / ref_k:.3f}")


if __name__ == "__main__":
    main()
