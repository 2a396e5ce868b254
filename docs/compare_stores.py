"""Compare two stores of one study, number by number: every Parquet file (runs, history, evals, samples) with
pandas.testing.assert_frame_equal(check_exact=True), timing and placement columns left out. Usage:
  python docs/compare_stores.py RESULTS_A RESULTS_B   (e.g. the demo run on two commits of this project)"""
import sys, pathlib, pandas as pd
a, b = map(pathlib.Path, sys.argv[1:3])
SKIP = {"train_seconds", "eval_seconds", "wall_seconds", "seconds", "started", "ended", "written_at", "time", "timestamp",
        "host", "node", "code_version", "created", "finished", "duration_s", "elapsed",
        "sha256", "_size", "_crc"}  # the digests of a run's weights, history and row cover its wall-clock seconds too: the
# weights' tensors are compared below, the history rows and the row's other fields above; the read index's
# `_size` and `_crc` describe a file's bytes, which hold those seconds and digests
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
import torch  # the final weights, tensor by tensor (model and optimizer state; timings left out)
for f in sorted(a.glob("*/weights/*.pt")):
    x, y = (torch.load(p, weights_only=True) for p in (f, b / f.relative_to(a)))
    same = all(torch.equal(x[k][n], y[k][n]) for k in ("model",) for n in x[k]) and str(x["opt"]) == str(y["opt"])
    if not same: print("DIFF weights", f.relative_to(a)); bad += 1
print("compared", len(list(a.rglob('*.parquet'))), "files;", bad, "differ")
