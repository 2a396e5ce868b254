"""The runs rows: one per id, of its own id, and a done run's final loss that of its history."""
from __future__ import annotations

from study.commands.verify.context import Context, same, stem


def check_runs(c: Context) -> None:
    """One runs row per id, of its own id."""
    store, v, runs = c.store, c.v, c.runs
    for (table, rel), t in c.tables.items():
        if table != "runs":
            continue
        rid, rows = stem(rel[0]), t.to_pylist()
        path = store.path("runs", rel[0])
        if len(rows) != 1:
            v.problems.append(f"{path}: {len(rows)} rows, one runs row per id expected")
        if rows:
            runs[rid] = rows[-1]
    v.add("runs", len(runs))


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
