"""The runs rows: one per id, and a done run's weights and final loss."""
from __future__ import annotations

import io

from model.train import CheckpointError, load_state
from study.commands.verify.context import Context, same, stem


def check_runs(c: Context) -> None:
    """One runs row per id, of its own id; a done run's weights present and this project's (loaded without
    running code)."""
    store, v, runs = c.store, c.v, c.runs
    for (table, rel), t in c.tables.items():
        if table != "runs":
            continue
        rid, rows = stem(rel[0]), t.to_pylist()
        path = store.path("runs", rel[0])
        if len(rows) != 1:
            v.problems.append(f"{path}: {len(rows)} rows, one runs row per id expected")
        bad = [r["run_id"] for r in rows if r["run_id"] != rid]
        if bad:
            v.problems.append(f"{path}: holds rows of run(s) {', '.join(map(str, bad))}, not of {rid}")
        if rows:
            runs[rid] = rows[-1]
    v.add("runs", len(runs))
    for rid, row in sorted(runs.items()):
        if row["status"] != "done":
            continue
        v.add("done")
        wpath = store.weights_path(rid)
        data = store.read_bytes(wpath)
        if data is None:
            v.problems.append(f"run {rid} is done but has no weights ({wpath})")
            continue
        try:
            sd = load_state(io.BytesIO(data), "cpu", wpath)
            from study.engine.trial import STATE_KEYS

            lacking = [k for k in STATE_KEYS if k not in sd]
            if lacking:
                raise CheckpointError(f"{wpath}: not this project's weights (no {', '.join(lacking)})")
            v.add("weights")
        except CheckpointError as e:
            v.problems.append(f"{e}; `study run` sets it aside and retrains the run")


def check_final_loss(c: Context) -> None:
    """A done run's final_loss is the loss of the last step of its history."""
    store, v, runs, tables = c.store, c.v, c.runs, c.tables
    for rid, row in sorted(runs.items()):
        t = tables.get(("history", (f"{rid}.parquet",)))
        if row["status"] != "done" or t is None or not t.num_rows:
            continue
        steps, losses = t.column("step").to_pylist(), t.column("loss").to_pylist()
        last = losses[max(range(len(steps)), key=lambda i: steps[i])]
        if not same(row["final_loss"], last):
            v.problems.append(f"{store.path('runs', rid + '.parquet')}: field final_loss is {row['final_loss']} but "
                              f"the last step of its history has loss {last}")
