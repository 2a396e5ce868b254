"""What each runs row recorded of itself and of its history when written (store/digest.py): the row's own
digest (field row_sha256: any field edited after the write, a status flipped, shows), and a done run's
history, present and holding the rows it recorded (field history_sha256); and what each eval point's rows
recorded: their own digest (field point_sha256) and the weights they were scored from (weights_sha256, the
run's row's: another seed's evaluations copied under this run's id show without evaluating anything)."""
from __future__ import annotations

from store.digest import edited_point, row_sha256, rows_sha256
from study.commands.verify.context import Context


def check_digests(c: Context) -> None:
    store, v = c.store, c.v
    for rid, row in sorted(c.runs.items()):
        rpath = store.path("runs", f"{rid}.parquet")
        want = row.get("row_sha256")
        if want is None:
            v.problems.append(f"{rpath}: field row_sha256 is empty: every runs row of this store format records it")
        elif row_sha256(row) != want:
            v.problems.append(f"{rpath}: field row_sha256 is {want[:16]}... but the row's fields hash to "
                              f"{row_sha256(row)[:16]}...: the row was edited after it was written (status "
                              f"{row['status']!r}, final_loss {row['final_loss']})")
        if row["status"] == "done":
            _check_history(c, rid, row, rpath)
    for (table, rel), t in sorted(c.tables.items()):
        if table == "evals" and t.num_rows:
            _check_point(c, rel, t)


def _check_point(c: Context, rel: tuple[str, ...], t) -> None:
    path, rows, run = c.store.path("evals", *rel), t.to_pylist(), c.runs.get(rel[0]) or {}
    why = edited_point(rows)
    if why:
        c.v.problems.append(f"{path}: {why}")
    want = run.get("weights_sha256")
    other = sorted({r["weights_sha256"] for r in rows} - {None, want}) if want else []
    if other:
        c.v.problems.append(f"{path}: field weights_sha256 is {other[0][:16]}..., but run {rel[0]}'s final weights "
                            f"hash to {want[:16]}... (its runs row): scored from other weights (another run's "
                            f"evaluations, another seed's, copied under this run's id?)")


def _check_history(c: Context, rid: str, row: dict, rpath: str) -> None:
    """A done run's history is present and (where its row recorded it) holds exactly the rows written."""
    hpath = c.store.path("history", f"{rid}.parquet")
    t = c.tables.get(("history", (f"{rid}.parquet",)))
    want = row.get("history_sha256")
    if t is None:
        if ("history", (f"{rid}.parquet",)) not in c.files:  # unreadable files are problems of their own
            recorded = f" (its runs row's field history_sha256 records {want[:16]}...)" if want else ""
            c.v.problems.append(f"{hpath}: missing: run {rid} is done, its training history must be stored"
                                f"{recorded}; `study run` rewrites it from the final weights")
        return
    if want is None:
        c.v.problems.append(f"{rpath}: field history_sha256 is empty: run {rid} is done and its history is there")
        return
    got = rows_sha256(t.to_pylist())
    if got != want:
        c.v.problems.append(f"{hpath}: its rows hash to {got[:16]}..., not to {rpath} field history_sha256 "
                            f"({want[:16]}...): the history was edited after the run finished")
