"""Compare two stores of one study, number by number: every Parquet file (runs, history, evals, samples) with
pandas.testing.assert_frame_equal(check_exact=True), timing and placement columns left out. Usage:
  python docs/compare_stores.py RESULTS_A RESULTS_B   (e.g. the demo run on two commits of this project)"""
import sys, pathlib, pandas as pd
a, b = map(pathlib.Path, sys.argv[1:3])
SKIP = {"train_seconds", "eval_seconds", "wall_seconds", "seconds", "started", "ended", "written_at", "time", "timestamp",
        "host", "node", "code_version", "created", "finished", "duration_s", "elapsed"}
bad = 0
for f in sorted(a.rglob("*.parquet")):
    rel = f.relative_to(a)
    if rel.parts[1] in {".ray", "checkpoints"}: continue
    g = b / rel
    if not g.exists(): print("missing in b:", rel); bad += 1; continue
    x, y = pd.read_parquet(f), pd.read_parquet(g)
    cols = [c for c in x.columns if c in y.columns and not any(s in c for s in SKIP)]
    extra = set(x.columns) ^ set(y.columns)
    try:
        pd.testing.assert_frame_equal(x[cols].reset_index(drop=True), y[cols].reset_index(drop=True), check_exact=True)
    except AssertionError as e:
        print("DIFF", rel, str(e)[:300]); bad += 1
    if extra: print("columns differ", rel, sorted(extra))
print("compared", len(list(a.rglob('*.parquet'))), "files;", bad, "differ")
