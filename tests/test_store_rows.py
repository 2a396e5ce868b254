"""The store refuses a row with an unknown or a missing column (a misspelt column would otherwise be
stored as a null), writes nothing then, and takes the evaluation's typed rows. Run:
pytest tests/test_store_rows.py"""
from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from store import EVALS, SAMPLES, SCHEMAS, Store
from study.engine.evaluate import EvalRow, SampleRow


def _eval_row(**kw) -> dict:
    row = {name: None for name in EVALS.names}
    row.update(run_id="r1", eval_key="k1", T=1, L_s=1, sampler="confidence", split="test", n_examples=4,
               metric="vpr", value=0.5, created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    row.update(kw)
    return row


def test_unknown_column_is_refused_and_nothing_written(tmp_path):
    store = Store(str(tmp_path), "rows")
    row = _eval_row()
    row["vlaue"] = row.pop("value")  # misspelt
    with pytest.raises(ValueError) as e:
        store.write_rows("evals", [_eval_row(), row], "r1", "k1.parquet")
    msg = str(e.value)
    assert "evals" in msg and "'vlaue'" in msg and "unknown" in msg and "'value'" in msg  # the one missing too
    assert ", ".join(EVALS.names) in msg  # the allowed columns
    assert not store.exists(store.path("evals", "r1", "k1.parquet"))
    assert store.read("evals").empty


def test_missing_column_is_refused_and_nothing_written(tmp_path):
    store = Store(str(tmp_path), "rows")
    row = _eval_row()
    del row["forward_passes_mean"]  # a nullable column must still be given, as None
    with pytest.raises(ValueError, match=r"evals row: missing column\(s\) 'forward_passes_mean'"):
        store.write_rows("evals", [row], "r1", "k1.parquet")
    assert not store.exists(store.path("evals", "r1", "k1.parquet"))
    with pytest.raises(ValueError, match=r"runs row: .*missing column\(s\) .*'status'"):
        store.write_rows("runs", [{"run_id": "r1"}], "r1.parquet")
    assert not store.exists(store.path("runs", "r1.parquet")) and store.run_row("r1") is None


def test_complete_rows_and_typed_rows_are_written(tmp_path):
    store = Store(str(tmp_path), "rows")
    store.write_rows("evals", [_eval_row()], "r1", "k1.parquet")
    typed = EvalRow(**{**_eval_row(), "eval_key": "k2"})
    store.write_rows("evals", [typed], "r1", "k2.parquet")
    ev = store.read("evals").sort_values("eval_key")
    assert list(ev.eval_key) == ["k1", "k2"] and list(ev.value) == [0.5, 0.5] and ev.ci_low.isna().all()
    sample = SampleRow("r1", "k1", 1, 1, example=0, input=None, output="1234", reference=None, score=1.0,
                       scores='{"vpr": 1.0}', passes=1, steps=1)
    store.write_rows("samples", [sample], "r1", "k1.parquet")
    assert store.read("samples").output.tolist() == ["1234"]


def test_typed_rows_are_the_tables_columns():
    """EvalRow and SampleRow hold exactly the columns of evals and samples, in the schema's order."""
    assert [f.name for f in dataclasses.fields(EvalRow)] == EVALS.names
    assert [f.name for f in dataclasses.fields(SampleRow)] == SAMPLES.names
    assert SCHEMAS["evals"] is EVALS and SCHEMAS["samples"] is SAMPLES
