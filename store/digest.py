"""What a runs row records at write time so that a reader can tell the files it names are the ones written.

The runs row's weights_sha256, history_sha256 and row_sha256, and the evals row's point_sha256 and
weights_sha256: docs/guide/schema.md says what each covers (`Store.write_rows` sets the rows' own digests).

Digests are not signatures: whoever can rewrite a file can rewrite its digest too. They make an edit,
a deletion or a swap of two runs' files visible (to `study verify`, to `study run`'s "is this run done"
check and to `study eval`, which refuse weights that are not the ones recorded); a forgery that recomputes
every digest is left to `study verify --deep`, which re-derives the outputs from the weights. A null digest
means the file was not there when the row was written (a run not done); an empty point_sha256 is an edit.
`study migrate` fills them in stores of the formats before (store/format.py).
"""
from __future__ import annotations

import hashlib
import json


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rows_sha256(rows: list[dict]) -> str:
    """The digest of table rows as a reader reads them (`pyarrow.Table.to_pylist`): canonical JSON, so the
    same rows give the same digest whatever Parquet encoding held them."""
    return sha256(json.dumps(rows, sort_keys=True, default=str, allow_nan=True).encode())


def row_sha256(row: dict) -> str:
    """The digest of one runs row's fields, `row_sha256` itself left out."""
    return rows_sha256([{k: x for k, x in row.items() if k != "row_sha256"}])


def point_sha256(rows: list[dict]) -> str:
    """The digest of an eval point's rows (its evals file's, as read), `point_sha256` itself left out."""
    return rows_sha256([{k: x for k, x in r.items() if k != "point_sha256"} for r in rows])


def edited_rows(t) -> str | None:
    """Why a runs file's rows are not those written (a field edited, a status flipped: its row_sha256 fails;
    a row duplicated), or an evals file's (edited_point), or None. Readers leave such a run (point) out and
    name it; `study run` redoes it."""
    if "point_sha256" in t.column_names:
        return edited_point(t.to_pylist())
    if t.num_rows > 1:
        return f"{t.num_rows} rows: a run has one runs row (duplicated?)"
    for r in t.to_pylist():
        want = r.get("row_sha256")
        if want is not None and row_sha256(r) != want:
            return (f"edited: its fields hash to {row_sha256(r)[:16]}..., not to its field row_sha256 "
                    f"({want[:16]}...): changed after it was written")
    return None


def edited_point(rows: list[dict]) -> str | None:
    """Why an eval point's rows are not those written (their field point_sha256 fails, or is empty in some or
    all: a value edited, labels swapped, a row appended or removed, the digest deleted), or None."""
    want, got = {r["point_sha256"] for r in rows}, point_sha256(rows)
    if not rows or want == {got}:
        return None
    held = ", ".join(sorted(f"{w[:16]}..." if w else "null" for w in want))
    return (f"edited: its {len(rows)} rows hash to {got[:16]}..., not to their field point_sha256 ({held}): "
            f"changed after it was written (a value or a label edited, a row added or removed)")


def weights_sha256(store, run_id: str) -> str | None:
    """The digest of a run's final weights file as it is in the store now (None: absent)."""
    data = store.read_bytes(store.weights_path(run_id))
    return sha256(data) if data is not None else None


def run_digests(store, run_id: str) -> dict:
    """{weights_sha256, history_sha256} of a run's files as they are in the store now (None where absent)."""
    hist = store.read_file("history", f"{run_id}.parquet")
    return {"weights_sha256": weights_sha256(store, run_id),
            "history_sha256": rows_sha256(hist.to_pylist()) if hist is not None else None}


def weights_mismatch(path: str, data: bytes, row: dict | None) -> str | None:
    """Why the weights bytes `data` (read from `path`) are not those the runs row recorded, or None (the same,
    or no digest recorded: no row, or a run not done)."""
    want = (row or {}).get("weights_sha256")
    if want is None:
        return None
    got = sha256(data)
    if got == want:
        return None
    return (f"{path}: its bytes hash to {got[:16]}..., not the runs row's field weights_sha256 ({want[:16]}...): "
            f"not the weights this run wrote (another run's, or edited)")


def recorded_weights_problem(store, row: dict | None) -> str | None:
    """"retrain: ..." when a done run's final weights are not the bytes its runs row recorded (swapped with
    another run's of the same shape, or edited): `study run`'s "is this run done" check; None otherwise."""
    if not row or row.get("weights_sha256") is None:
        return None
    path = store.weights_path(row["run_id"])
    data = store.read_bytes(path)
    bad = weights_mismatch(path, data, row) if data is not None else None
    return f"retrain: {bad} (set aside)" if bad else None


def edited_histories(recorded: dict, hist) -> set[str]:
    """Runs whose rows in `hist` (the history table as read: each file's rows together) are not those their
    runs row recorded (`recorded`: run_id -> field history_sha256): what a reader leaves out, and `study
    run` redoes (the trial sets such a history aside and writes it again from the final weights)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not hist.num_rows:
        return set()
    ends = pc.run_end_encode(hist["run_id"].combine_chunks(), run_end_type=pa.int64())
    stops, rows = ends.run_ends.to_pylist(), hist.to_pylist()
    return {rid for rid, a, b in zip(ends.values.to_pylist(), [0, *stops[:-1]], stops)
            if isinstance(recorded.get(rid), str) and rows_sha256(rows[a:b]) != recorded[rid]}
