"""How long a researcher waits for each read command: `study status`, `plan`, `verify`, `report --figure
iso-param` and `prune` (a dry run) on a demo-like 3-run store, each a cold process (a new interpreter, as
a shell starts it), median of 5, beside the floor measured in the same run: `python -c pass` and
`python -c "import pandas, pyarrow"` (what reading three Parquet files cannot avoid), and the draw floor
(DRAW_FLOOR: that import, matplotlib's Agg and SVG backends, and one line on one axes written as a PNG and
an SVG: what any command that draws a figure cannot avoid, however little it does besides).
`report` writes into one folder each time and `report-redraw` (--redraw, which changes nothing now) into its
own: both draw the figure every time.

Run: .venv/bin/python benchmarks/cli_latency.py [--reps 5] [--quick]
(a benchmark, not a test: run it on an idle machine; a figure taken under load is a note, not a result;
--quick: one repetition, to see that it works). Figures go to benchmarks/RESULTS.md by hand.

The store is synthetic, built with the store's own writer as benchmarks/store_scale.py builds its
stores (no training): the demo's three models ((1 x 1), (1 x 2), (2 x 1), grids/demo_sudoku.yaml's
task and evaluation points), each done, with runs, evals, samples, history, config and weights files.
Its samples and weights are made up: `study verify` reports them (exit 1) after running every check, as
on a real store; the status's, plan's, report's and prune's exit codes are 0.
Targets (issue 34): status, plan, verify < 1.0 s; a one-figure report < 1.5 s; each within 2x the
pandas + pyarrow floor. The last line is machine-readable: <command>_s=<median> ... floor_s=<median>.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

STUDY = "latency"
GRID = f"""study: {STUDY}
task: {{name: sudoku, n: 9, mask_rate: 0.3, n_train: 2000, n_test: 500, structural_pos: true}}
model: {{d_model: 128, n_heads: 4, mlp_ratio: 2}}
train: {{steps: 800, batch_size: 128, lr: 1.0e-3, warmup: 40, checkpoint_every: 200}}
eval: {{T: [1, 2, 4, 8], L_s: [train, 1], n_examples: 500, n_samples_kept: 50}}
couple:
  - [{{K: 1, L: 2}}, {{K: 1, L: 1}}, {{K: 2, L: 1}}]
"""
DRAW_FLOOR = """import pandas, pyarrow
from matplotlib.figure import Figure
from matplotlib.backends.backend_agg import FigureCanvasAgg
import matplotlib.backends.backend_svg, os, tempfile
fig = Figure(figsize=(4, 3)); FigureCanvasAgg(fig); ax = fig.subplots(); ax.plot([1, 2], [1, 2]); ax.set_title("t")
with tempfile.TemporaryDirectory() as d:
    fig.savefig(os.path.join(d, "f.png"), dpi=100); fig.savefig(os.path.join(d, "f.svg"))
"""
TARGETS = {"status": 1.0, "plan": 1.0, "verify": 1.0, "report": 1.5, "report-redraw": 1.5}


def make_store(tmp: str) -> tuple[str, str]:
    """A done 3-run study under tmp: returns (grid path, results root)."""
    from benchmarks.store_scale import build

    gpath, root = os.path.join(tmp, f"{STUDY}.yaml"), os.path.join(tmp, "results")
    with open(gpath, "w") as f:
        f.write(GRID)
    build(root, gpath, workers=1)
    return gpath, root


def commands(gpath: str, root: str, out: str) -> dict[str, list[str]]:
    """Each read command's argv (after `study`); the reports write into `out` and `out`-redraw."""
    res = ["--results", root]
    report = ["report", "--study", STUDY, "--figure", "iso-param"]
    return {"status": ["status", gpath, *res],
            "plan": ["plan", gpath],
            "verify": ["verify", "--study", STUDY, *res],
            "report": [*report, "--out", out, *res],
            "report-redraw": [*report, "--redraw", "--out", f"{out}-redraw", *res],
            "prune": ["prune", gpath, *res]}


def study_code(argv: list[str]) -> str:
    """The program a cold `study ARGV` runs: the CLI's entry point, in-process (what the console script does)."""
    return f"import sys; from study.cli import main; sys.argv = ['study', *{argv!r}]; main()"


def cold(code: str, reps: int, cwd: str) -> float:
    """Median wall seconds of `python -c code` in a new interpreter, `reps` times."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    from benchmarks.plan_scale import cpu

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="cold processes per command (the median is reported)")
    ap.add_argument("--quick", action="store_true", help="one repetition: proves it works, measures nothing")
    args = ap.parse_args()
    reps = 1 if args.quick else args.reps
    print(f"CPU: {cpu()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    tmp = tempfile.mkdtemp(prefix="cli_latency_")
    try:
        gpath, root = make_store(tmp)
        res = {"python": cold("pass", reps, ROOT), "floor": cold("import pandas, pyarrow", reps, ROOT),
               "draw-floor": cold(DRAW_FLOOR, reps, ROOT)}
        for name, argv in commands(gpath, root, os.path.join(tmp, "fig")).items():
            res[name] = cold(study_code(argv), reps, ROOT)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"median of {reps} cold process(es), seconds; floor = python -c 'import pandas, pyarrow'")
    for name, secs in res.items():
        target = TARGETS.get(name)
        note = "" if name in ("python", "floor") else f"  {secs / res['floor']:.2f}x floor" + \
            ("" if name == "draw-floor" else " (target <= 2x)")
        if name == "report-redraw":
            note += f"; {secs / res['draw-floor']:.2f}x the draw floor"
        note += f"  target < {target} s: {'met' if secs < target else 'MISSED'}" if target else ""
        print(f"  {name:13s} {secs:6.2f}{note}")
    print(" ".join(f"{k}_s={v:.2f}" for k, v in res.items()) + (" (quick: 1 repetition)" if args.quick else ""))


if __name__ == "__main__":
    main()
