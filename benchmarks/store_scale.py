"""The results store at scale: `study status`, `study report --figure all` and a resume's planning
step on synthetic stores of 100, 1,000 (and, with --big, 10,000) finished runs.

Run: .venv/bin/python benchmarks/store_scale.py [--sizes 100 1000] [--big] [--warm-only] [--s3] [--profile report]
     [--store-dir DIR]
(a benchmark, not a test: run it on a quiet machine; figures go to benchmarks/RESULTS.md by hand;
--big builds 10,000 runs, 420,000 files: about 15 minutes here with --build-procs 2)

Each store is built with the store's own writer (`Store.write_rows`, the real schemas) as `study run`
leaves it: per run a runs row (config included), 20 evaluation points (T 1..5 x L_s 1..4, one evals
file with VPR and cell accuracy, one samples file of 50 examples of 9x9 Sudoku), a 20-row history
and a config file. Timed in-process (typer's CliRunner, output captured):
- status: `study status GRID`;
- report: `study report --figure all` (every figure and table, report.html and .md; figures drawn
  in one worker per core, the default from 200 runs);
- plan:   `study.engine.health.classify`, what `study run` does before dispatching anything;
- incremental: after the warm report, one run added (a new seed of one model, the store's writer) and
  `study report --figure all` again into the same folder: both times and second / first (issue 34's
  target: <= 0.10 at 1,000 runs); then a second run added and, without drawing, the store read and every
  table of the report computed from it timed: the part of a second report that redrawing fewer panels cannot
  save. Each phase's first report draws into a folder of its own.
`--s3` builds and reads the stores on moto's S3 server on 127.0.0.1 (as tests/test_s3.py does;
needs the test extra). Each step runs twice: cold (the store's read index, store/index.py, absent:
every file parsed, in parallel, and the index written) and warm (only files new since the index).
`study run` leaves the index current (its last step, the final classify, reads the store through it),
so "warm" is what the first report after a sweep meets; "cold" is a store whose index was deleted.
`--store-dir DIR` keeps the stores in DIR/scale<n>/ and reuses one already built there (a 10,000-run store
takes about 10 minutes to build and 6 to index cold): its build time then reads 0, and the run the
incremental case adds is removed again afterwards, so the store is the same for the next use.
Targets (issue 17): 1,000 runs report in <= 10 s locally, <= 60 s over S3; growth 10,000/1,000 <= 10.
The last line is machine-readable (warm figures, as `study run` leaves the store):
    report_s_1000=<s> status_s_1000=<s> growth=<ratio report 10000/1000 measured with --big, else na>
A line before it gives the 100 -> 1,000 ratios (not extrapolated into `growth`).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import math
import os
import pstats
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.plan_scale import cpu  # noqa: E402

T_VALUES, L_S_VALUES = [1, 2, 3, 5, 10], [1, 2, 3, 4]  # 20 evaluation points per run
N_SAMPLES, HISTORY_ROWS = 50, 20
K_VALUES, L_VALUES = [1, 2, 3, 4, 6], [1, 2, 3, 4]  # 20 shapes: iso-param lines, iso-FLOP pairs (1x4 | 4x1...)
LR_VALUES = [0.0003, 0.0005, 0.001, 0.002, 0.003]


def shape(n_runs: int) -> tuple[list[float], int]:
    """(learning rates, seeds) of the n-run sweep: 20 shapes (K x L) x len(lrs) models x seeds.

    What a group runs at each size, not n distinct models on one figure: 100 runs = 20 models x 5 seeds
    (a pilot at one lr); 1,000 = 100 models (5 lr) x 10 seeds; 10,000 = 100 models x 100 seeds."""
    n_lr = min(len(LR_VALUES), max(1, n_runs // 200))
    return LR_VALUES[:n_lr], max(1, n_runs // (len(K_VALUES) * len(L_VALUES) * n_lr))


def grid_text(n_runs: int) -> str:
    lrs, seeds = shape(n_runs)
    return f"""
study: scale{n_runs}
task: {{name: sudoku, n: 9, mask_rate: 0.5}}
model: {{d_model: 128, n_heads: 4}}
train: {{steps: 2000, batch_size: 64}}
eval: {{T: {T_VALUES}, L_s: {L_S_VALUES}, n_examples: 200, n_samples_kept: {N_SAMPLES}}}
axes:
  K: {K_VALUES}
  L: {L_VALUES}
  lr: {lrs}
  seed: {list(range(seeds))}
"""


def build(root: str, gpath: str, workers: int, procs: int = 1) -> int:
    """Write every file of a finished study; returns the number of table files written. `procs` > 1
    splits the runs over that many processes (writing is Python-bound: threads alone use one core)."""
    if procs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(procs) as pool:
            return sum(pool.map(_build_part, [(root, gpath, workers, i, procs) for i in range(procs)]))
    return _build_part((root, gpath, workers, 0, 1))


def _build_part(args) -> int:
    root, gpath, workers, part, parts = args
    from store import Store
    from study.spec.grid import load_grid

    grid = load_grid(gpath)
    store = Store(root, grid.study)
    if part == 0:
        store.write_text(store.path("grid.yaml"), open(gpath).read())
    one = _run_writer(store, random.Random(part))
    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(one, grid.runs[part::parts]))


def _run_writer(store, rng):
    """one(run): write every file of a finished run into `store` (the store's own writer), the number of
    table files written."""
    from study.engine.trial import now, run_row

    cells = "123456789"
    import io

    import torch

    buf = io.BytesIO()  # a small state of the trainer's shape: what `study run`'s plan checks of a done run
    torch.save({"model": {"w": torch.zeros(4)}, "opt": {}, "step": 0, "seconds": 0.0,
                "history": [{"step": 0, "loss": 1.0}] * HISTORY_ROWS, "torch_rng": torch.get_rng_state()}, buf)
    weights = buf.getvalue()

    def one(run) -> int:
        rid = run.run_id
        row = run_row(run, run.costs(), status="done", code_version="bench", device="cpu",
                      train_seconds=100.0, final_loss=0.5)
        store.write_rows("runs", [row], f"{rid}.parquet")
        store.write_config(rid, {**run.resolved(), "code_version": "bench"})
        store.write_bytes(store.weights_path(rid), weights)  # a done run has weights (classify checks them)
        hist = [{"run_id": rid, "step": 100 * i, "loss": 2.0 / (i + 1), "loop_losses": [2.0 / (i + 1)] * run.model.L,
                 "L_t": run.model.L, "lr": run.train.lr, "seconds": 5.0 * i, "attempt": 1, "val": None}
                for i in range(HISTORY_ROWS)]
        store.write_rows("history", hist, f"{rid}.parquet")
        n = 2
        # a model's VPR rises with T x L_s towards a ceiling that grows with K x L (and varies by lr and
        # seed), so thresholds are crossed by some models and not others, as in a real sweep
        ceiling = min(0.99, 0.5 + 0.08 * run.model.K * run.model.L + 0.05 * rng.random())
        for pt in run.eval_points():
            vpr = min(1.0, max(0.0, ceiling * (1 - math.exp(-pt.T * pt.L_s / 4)) + 0.03 * (rng.random() - 0.5)))
            base = {"run_id": rid, "eval_key": pt.key, "T": pt.T, "L_s": pt.L_s, "sampler": pt.label,
                    "split": pt.split, "n_examples": 200, "forward_passes": pt.T * pt.L_s,
                    "eval_flops": 10**9 * pt.T * pt.L_s, "eval_seconds": 1.0, "created_at": now(),
                    "forward_passes_mean": None, "kind": "sample", "weights_sha256": None,
                    "point_sha256": None}
            store.write_rows("evals", [{**base, "metric": m, "value": v, "ci_low": max(0.0, v - 0.05),
                                        "ci_high": min(1.0, v + 0.05)}
                                       for m, v in (("vpr", vpr), ("cell_acc", (1 + vpr) / 2))],
                             rid, f"{pt.key}.parquet")
            samples = [{"run_id": rid, "eval_key": pt.key, "T": pt.T, "L_s": pt.L_s, "example": i,
                        "input": "".join(rng.choice(cells + "..") for _ in range(81)),
                        "output": "".join(rng.choice(cells) for _ in range(81)),
                        "reference": "".join(rng.choice(cells) for _ in range(81)), "score": float(rng.random() < vpr),
                        "scores": '{"vpr": 1.0, "cell_acc": 1.0}', "passes": None, "steps": None}
                       for i in range(N_SAMPLES)]
            store.write_rows("samples", samples, rid, f"{pt.key}.parquet")
            n += 2
        return n

    return one


def add_run(root: str, n_runs: int, tmp: str, seed_offset: int = 0) -> str:
    """Write one more finished run into the n-run study (a new seed of its first model: seed `seed_offset` past
    the grid's last), as `study run` would leave it: its run id."""
    from store import Store
    from study.spec.grid import load_grid

    lrs, seeds = shape(n_runs)
    # the grid of one more seed expands past the default bound at 10,000 runs (study/spec/bounds.py)
    os.environ.setdefault("RMDM_MAX_RUNS", str(2 * n_runs + 1000))
    gpath = os.path.join(tmp, f"scale{n_runs}_plus{seed_offset}.yaml")
    with open(gpath, "w") as f:
        f.write(grid_text(n_runs).replace(f"seed: {list(range(seeds))}",
                                          f"seed: {list(range(seeds + 1 + seed_offset))}"))
    grid = load_grid(gpath)
    run = next(r for r in grid.runs if r.train.seed == seeds + seed_offset)
    _run_writer(Store(root, grid.study), random.Random(-1))(run)
    return run.run_id


def remove_run(study_dir: str, rid: str) -> None:
    """Every file of run `rid` in a local study folder (its rows, evaluations, samples, history, config and
    weights): the store as it was before add_run; its read index drops the entries at its next read."""
    for table in ("runs", "history"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(study_dir, table, f"{rid}.parquet"))
    for table in ("evals", "samples"):
        shutil.rmtree(os.path.join(study_dir, table, rid), ignore_errors=True)
    for path in (os.path.join(study_dir, "configs", f"{rid}.json"), os.path.join(study_dir, "weights", f"{rid}.pt")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _upload(local_root: str, root: str, study: str) -> None:
    """Copy a study built on local disk to the store `root` (an s3:// URI), one request per file."""
    import pyarrow.fs as pafs

    from store import Store

    dest = Store(root, study)
    pafs.copy_files(os.path.join(local_root, study), dest.dir, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=dest.fs, use_threads=True)


def timed(fn, profile: bool):
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    out = fn()
    if prof:
        prof.disable()
    secs = time.perf_counter() - t0
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        print(s.getvalue())
    return secs, out


def measure(n_runs: int, root: str, tmp: str, args) -> dict:
    from typer.testing import CliRunner

    from store import Store
    from study.cli import app
    from study.spec.grid import load_grid
    from study.engine.health import classify

    gpath = os.path.join(tmp, f"scale{n_runs}.yaml")
    with open(gpath, "w") as f:
        f.write(grid_text(n_runs))
    grid = load_grid(gpath)
    t0 = time.perf_counter()
    reused = bool(args.store_dir) and os.path.isdir(os.path.join(root, grid.study, "runs"))
    if reused:
        files = sum(f.endswith(".parquet") for t in ("runs", "evals", "history", "samples")
                    for _, _, fs in os.walk(os.path.join(root, grid.study, t)) for f in fs)  # as build() counts
        print(f"  reusing the store built in {root}", flush=True)
    elif root.startswith("s3://"):
        # writing through the store costs ~6 requests a file on S3 (multipart upload, atomic rename,
        # directory markers): build on local disk, then upload each file with one request
        local = os.path.join(tmp, f"local{n_runs}")
        files = build(local, gpath, args.build_workers, args.build_procs)
        _upload(local, root, grid.study)
    else:
        files = build(root, gpath, args.build_workers, args.build_procs)
    built = 0.0 if reused else time.perf_counter() - t0
    runner = CliRunner()
    out = {"runs": len(grid.runs), "files": files, "build_s": built}

    def cli(*a):
        r = runner.invoke(app, list(a))
        if r.exit_code != 0:
            raise SystemExit(f"study {' '.join(a)} exited {r.exit_code}: {r.output[-2000:]}")
        return r

    steps = {
        "status": lambda: cli("status", gpath, "--results", root),
        # a folder per phase; the incremental case below reports into the warm one again
        "report": lambda: cli("report", "--study", grid.study, "--figure", "all", "--results", root,
                              "--out", os.path.join(tmp, f"fig{n_runs}-{phase}")),
        "plan": lambda: classify(grid, Store(root, grid.study)),
    }
    for phase in ("cold", "warm"):
        if phase == "cold" and reused and args.warm_only:
            steps["status"]()  # untimed: the index brought up to date (a run an earlier use added is dropped)
            continue
        if phase == "cold":  # no index: every file parsed
            Store(root, grid.study).fs.delete_dir_contents(f"{Store(root, grid.study).dir}/_index", missing_dir_ok=True)
        for name, fn in steps.items():
            if phase == "cold" and args.warm_only and name != "status":
                continue  # --warm-only: the cold status only builds the index
            if phase == "cold" and name != "status":  # the first step wrote the index: drop it again
                Store(root, grid.study).fs.delete_dir_contents(f"{Store(root, grid.study).dir}/_index",
                                                              missing_dir_ok=True)
            secs, got = timed(fn, args.profile == name and phase == "cold")
            out[f"{name}_s" if phase == "cold" else f"{name}_warm_s"] = secs
            if name == "plan":
                assert len(got.done) == len(grid.runs), f"classify: {len(got.done)} of {len(grid.runs)} runs done"
        sec = lambda k: f"{out[k]:.2f}s" if k in out else "na"
        sfx = "_s" if phase == "cold" else "_warm_s"
        print(f"  {out['runs']} runs, {files} table files (built in {built:.1f}s), {phase}: status {sec('status' + sfx)}"
              f"  report {sec('report' + sfx)}  plan {sec('plan' + sfx)}", flush=True)
    out.update(incremental(n_runs, root, tmp, grid.study, cli, out["report_warm_s"], keep=bool(args.store_dir)))
    return out


def incremental(n_runs: int, root: str, tmp: str, study: str, cli, first_s: float, keep: bool = False) -> dict:
    """The incremental case: after the warm report, one run added with the store's writer, and the report
    again into the same folder (every figure drawn again). Both times and their ratio.
    Then what is not drawing: a second run added, and the store read (`load_study`, the index brought up to
    date for one new run as in the report before it) and every table of the report computed from it (the
    aggregated rows, threshold crossings, pairs, comparisons, effective parameters: analysis.report.tables),
    timed alone and without drawing: the part of a second report that redrawing fewer panels cannot save.
    `keep` (a store reused from --store-dir): the added runs' files are removed afterwards."""
    from analysis.derived import Derived
    from analysis.load import load_study
    from analysis.options import Options
    from analysis.report import tables

    def not_drawing():
        data = load_study(root, study)
        read = time.perf_counter()
        tables(data, Options(), Derived(data))
        return read

    rid = add_run(root, n_runs, tmp)
    rids = [rid]
    try:
        secs, r = timed(lambda: cli("report", "--study", study, "--figure", "all", "--results", root,
                                    "--out", os.path.join(tmp, f"fig{n_runs}-warm")), False)
        rids.append(add_run(root, n_runs, tmp, seed_offset=1))
        t0 = time.perf_counter()
        rest_s, read_at = timed(not_drawing, False)
        read_s = read_at - t0
    finally:
        if keep:
            for one in rids:
                remove_run(os.path.join(root, study), one)
    drawn = next((ln for ln in r.output.splitlines() if " figures: " in ln), "no figure line")
    print(f"  incremental: report {first_s:.2f}s, one run added ({rid}), report again {secs:.2f}s ({drawn}); "
          f"second / first {secs / first_s:.2f}; after one more run, not drawing: the store read {read_s:.2f}s and "
          f"the report's tables from it, together {rest_s:.2f}s ({rest_s / first_s:.2f} of the first)", flush=True)
    return {"report_incremental_s": secs, "incremental_ratio": secs / first_s, "read_after_one_run_s": read_s,
            "tables_after_one_run_s": rest_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--big", action="store_true", help="also 10,000 runs (building it takes many minutes)")
    ap.add_argument("--s3", action="store_true", help="on moto's S3 server on 127.0.0.1 (the test extra)")
    ap.add_argument("--profile", choices=["status", "report", "plan"], help="print a cProfile of that step")
    ap.add_argument("--build-workers", type=int, default=8, help="threads per building process")
    ap.add_argument("--build-procs", type=int, default=os.cpu_count() or 1, help="processes building a store")
    ap.add_argument("--store-dir", help="keep the stores in DIR/scale<n>/ and reuse one built there (local disk)")
    ap.add_argument("--warm-only", action="store_true",
                    help="time only the warm steps (one status builds the index first): for --big")
    args = ap.parse_args()
    sizes = sorted(set(args.sizes + ([10000] if args.big else [])))
    print(f"CPU: {cpu()}", flush=True)
    tmp = tempfile.mkdtemp(prefix="store_scale_")
    server = None
    try:
        if args.s3:
            sys.path.insert(0, os.path.join(ROOT, "tests"))
            os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                               "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
            from test_s3 import BUCKET, _server

            server, endpoint = _server()
            root = f"s3://{BUCKET}/results?endpoint_override={endpoint}&scheme=http&region=us-east-1"
        else:
            root = os.path.join(tmp, "results")
        roots = {n: root for n in sizes}
        if args.store_dir and not args.s3:
            roots = {n: os.path.join(os.path.abspath(args.store_dir), f"scale{n}") for n in sizes}
        print(f"store: {'S3 (moto, 127.0.0.1)' if args.s3 else 'local disk'}, one file per run and point", flush=True)
        res = {n: measure(n, roots.get(n, root), tmp, args) for n in sizes}
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    r1000 = res.get(1000, {})
    fmt = lambda v: f"{v:.2f}" if v is not None else "na"
    if 100 in res and r1000:  # the shapes differ (20 -> 100 models): more than the reads grow
        print(f"growth 100 -> 1000 runs (x10 runs, x5 models): report x{r1000['report_warm_s'] / res[100]['report_warm_s']:.2f}"
              f", status x{r1000['status_warm_s'] / res[100]['status_warm_s']:.2f} (as `study run` leaves the store)")
    # growth: measured 10,000 / 1,000 with --big; na without (never extrapolated)
    growth = (f"{res[10000]['report_warm_s'] / r1000['report_warm_s']:.2f}" if 10000 in res and r1000 else "na")
    print(f"report_s_1000={fmt(r1000.get('report_warm_s'))} status_s_1000={fmt(r1000.get('status_warm_s'))} "
          f"growth={growth}")


if __name__ == "__main__":
    main()
