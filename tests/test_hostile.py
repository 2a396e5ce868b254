"""A store that lies is caught, never obeyed: one table of hostile cases, each a forgery or a damage done to a
copy of a small study (run `a` done; run `b` stopped at step 25 with checkpoints at steps 10 and 20), and
what must then hold: the readers serve none of it (`Store.read`, `load_study`, `Store.summary`), and one
rerun brings the study to the state an undamaged store reaches (training is a pure function of the step,
so resuming from an earlier checkpoint, or from step 0, gives the same numbers), which `study verify` passes.

To add a case: one `Case` in CASES (a function that damages the copy, and optionally what a reader must not
serve before the rerun, and what the rerun's log or lines must say).

Run: pytest tests/test_hostile.py -q   (tiny real trainings in-process, no Ray; a `study` subprocess or two)
"""
from __future__ import annotations

import io
import os
import subprocess
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from analysis.load import MissingData, load_study
from store import Store, digest
from store import index as store_index
from study.commands.verify import verify_study
from study.engine.trial import DIGEST, previous_checkpoint_path
from tests.helpers import ROOT, edit, study_cmd
from tests.test_store_heal import (_aside, _copy, _final_state, _log, _rerun, _same_weights, _weights,  # noqa: F401
                                   healed_clean, interrupted)


def _save(path: str, sd: dict, record: bool) -> None:
    """Write the state `sd` at `path`; `record`: with the digest file a checkpoint's writer leaves beside it."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    open(path, "wb").write(buf.getvalue())
    if record:
        open(path + DIGEST, "w").write(digest.sha256(buf.getvalue()))


def _load(path: str) -> dict:
    return torch.load(path, weights_only=True)


def _other_runs_checkpoint(store: Store, a: str, b: str) -> str:
    """b's checkpoint and its digest file replaced by run a's (same shapes: another seed; a's state at its last
    step, naming a inside), as if copied from a's checkpoint and its record."""
    path = store.checkpoint_path(b)
    sd = _load(store.weights_path(a))
    sd["run_id"], sd["config_sha256"] = a, _load(path)["config_sha256"]
    _save(path, sd, record=True)
    return path


def _scaled_checkpoint(store: Store, a: str, b: str) -> str:
    path = store.checkpoint_path(b)
    sd = _load(path)
    sd["model"] = {k: v * 1.5 if v.is_floating_point() else v for k, v in sd["model"].items()}
    _save(path, sd, record=False)
    return path


def _flipped_bit(store: Store, a: str, b: str) -> str:
    """One bit flipped in the last byte of the largest tensor's storage (a weight), zip CRCs kept as they were."""
    path = store.checkpoint_path(b)
    data = bytearray(open(path, "rb").read())
    sd = _load(path)
    big = max(sd["model"].values(), key=lambda t: t.numel())
    raw = big.contiguous().view(torch.uint8).numpy().tobytes()
    at = bytes(data).find(raw[-64:])
    assert at > 0
    data[at + 63] ^= 1
    open(path, "wb").write(bytes(data))
    return path


def _deep_config(store: Store, a: str, b: str) -> str:
    path = store.path("configs", f"{a}.json")
    open(path, "w").write("[" * 100_000 + "]" * 100_000)
    return path


def _status_flipped(store: Store, a: str, b: str) -> str:
    """a (done) made to read failed: its row's digest no longer matches its fields."""
    path = store.path("runs", f"{a}.parquet")
    edit(path, "status", "failed")
    return path


def _loss_edited(store: Store, a: str, b: str) -> str:
    path = store.path("runs", f"{a}.parquet")
    edit(path, "final_loss", 0.001)
    return path


def _runs_row_duplicated(store: Store, a: str, b: str) -> str:
    path = store.path("runs", f"{a}.parquet")
    t = pq.read_table(path)
    pq.write_table(pa.concat_tables([t, t]), path)
    return path


def _history_edited(store: Store, a: str, b: str) -> str:
    path = store.path("history", f"{a}.parquet")
    edit(path, "loss", 0.001, row=0)
    return path


def _indexed(store: Store, table: str) -> str:
    """`table`'s read index written now over every file, whatever its age; its path."""
    old = store_index.MIN_NEW, store_index.RACY_S, store_index.FINE_RACY_S
    store_index.MIN_NEW, store_index.RACY_S, store_index.FINE_RACY_S = 0, -1, -1
    try:
        Store(store.root, store.study).read(table)
    finally:
        store_index.MIN_NEW, store_index.RACY_S, store_index.FINE_RACY_S = old
    return os.path.join(store.dir, store_index.INDEX_DIR, f"{table}.parquet")


def _index_row_edited(store: Store, a: str, b: str) -> str:
    """a's row in the runs index edited with its entry (size, mtime, crc) kept: what a reader trusts of the
    index without reading the file."""
    path = _indexed(store, "runs")
    t = pq.read_table(path)
    assert t["_file"].to_pylist() == [f"{a}.parquet"], t["_file"]
    t = t.set_column(t.schema.get_field_index("final_loss"), "final_loss", pa.array([0.001]))
    pq.write_table(t.replace_schema_metadata(t.schema.metadata), path)
    return path


def _history_index_edited(store: Store, a: str, b: str) -> str:
    path = _indexed(store, "history")
    t = pq.read_table(path)
    loss = [0.001 if f == f"{a}.parquet" else x for f, x in zip(t["_file"].to_pylist(), t["loss"].to_pylist())]
    t = t.set_column(t.schema.get_field_index("loss"), "loss", pa.array(loss))
    pq.write_table(t.replace_schema_metadata(t.schema.metadata), path)
    return path


def _a_point(store: Store, a: str) -> str:
    """a's first eval point's evals file."""
    d = store.path("evals", a)
    return os.path.join(d, min(os.listdir(d)))


def _rewrite(path: str, rows: list[dict]) -> None:
    """The point's rows written back as they are given: the store's digests kept as they were read."""
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)


def _vpr_edited(store: Store, a: str, b: str) -> str:
    """a's vpr edited in place: 0.99 in place of the scored value."""
    path = _a_point(store, a)
    rows = pq.read_table(path).to_pylist()
    next(r for r in rows if r["metric"] == "vpr")["value"] = 0.99
    _rewrite(path, rows)
    return path


def _vpr_edited_digest_nulled(store: Store, a: str, b: str) -> str:
    """a's vpr edited and its point's digest emptied: not a store of an older format (migrate fills those)."""
    path = _vpr_edited(store, a, b)
    _rewrite(path, [{**r, "point_sha256": None} for r in pq.read_table(path).to_pylist()])
    return path


def _a_column_dropped(store: Store, a: str, b: str) -> str:
    """a's point rewritten without its point_sha256 column: not the columns of this store format, unreadable."""
    path = _vpr_edited(store, a, b)
    pq.write_table(pq.read_table(path).drop_columns(["point_sha256"]), path)
    return path


def _a_point_unreadable(store: Store, a: str, b: str) -> None:
    data = load_study(store.root, store.study)
    path = _a_point(store, a)
    assert 0.99 not in data.evals["value"].tolist()
    assert "its columns are not those of this store format (point_sha256 differ)" in data.store.unreadable[path]


def _labels_swapped(store: Store, a: str, b: str) -> str:
    path = _a_point(store, a)
    rows = pq.read_table(path).to_pylist()
    i, j = (next(k for k, r in enumerate(rows) if r["metric"] == m) for m in ("vpr", "cell_acc"))
    assert rows[i]["value"] != rows[j]["value"]
    rows[i]["metric"], rows[j]["metric"] = rows[j]["metric"], rows[i]["metric"]
    _rewrite(path, rows)
    return path


def _metric_appended(store: Store, a: str, b: str) -> str:
    """A row of a metric the point never scored appended (its point_sha256 copied from the row before it)."""
    path = _a_point(store, a)
    rows = pq.read_table(path).to_pylist()
    _rewrite(path, rows + [{**rows[0], "metric": "vpr_best", "value": 0.99}])
    return path


def _a_point_left_out(store: Store, a: str, b: str) -> None:
    """load_study, the API and `study report` leave a's edited point out, each naming its file and why."""
    import warnings

    from typer.testing import CliRunner

    import rmdm_study
    from study.cli import app

    path = _a_point(store, a)
    key = os.path.basename(path)[: -len(".parquet")]
    data = load_study(store.root, store.study)
    assert key not in data.evals.loc[data.evals.run_id == a, "eval_key"].tolist()
    assert 0.99 not in data.evals["value"].tolist() and "vpr_best" not in data.evals["metric"].tolist()
    assert data.store.unreadable[path].startswith("edited: "), data.store.unreadable
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        study = rmdm_study.open(store.root).study(store.study)
    assert key not in study.evals.loc[study.evals.run_id == a, "eval_key"].tolist()
    assert [str(w.message) for w in said if path in str(w.message) and "edited" in str(w.message)], \
        [str(w.message) for w in said]
    r = CliRunner().invoke(app, ["report", "--results", store.root, "--study", store.study, "--out",
                                 os.path.join(os.path.dirname(store.root), "report")])
    assert f"unreadable, skipped: {path} (edited: " in r.output, r.output  # (exit 1: no figure this study draws)
    v = verify_study(Store(store.root, store.study))
    assert any(ln.startswith(f"{path}: edited: ") and "point_sha256" in ln for ln in v.problems), v.render()


def _history_served_from_the_file(store: Store, a: str, b: str) -> None:
    data = load_study(store.root, store.study)
    assert a in data.runs["run_id"].tolist() and 0.001 not in data.history["loss"].tolist()
    assert not data.store.unreadable


def _final_loss(store: Store, rid: str):
    runs = Store(store.root, store.study).read("runs")
    got = runs.loc[runs.run_id == rid, "final_loss"].tolist()
    return got[0] if got else None


@dataclass
class Case:
    name: str
    damage: Callable[[Store, str, str], str]  # (the copy, run a, run b) -> the path damaged
    said: str | None  # what the rerun's log of the run, or its planning lines, say of the path (None: nothing)
    # before the rerun, on the damaged copy: what a reader must (not) serve; raises AssertionError if it does
    readers: Callable[[Store, str, str], None] | None = None


def _not_served_loss(store: Store, a: str, b: str) -> None:
    assert _final_loss(store, a) != 0.001
    try:
        data = load_study(store.root, store.study)
    except MissingData:  # the edited row left out: the study has no other
        assert _final_loss(store, a) is None
    else:
        assert data.runs["final_loss"].tolist() == [_final_loss(store, a)]


def _a_left_out(store: Store, a: str, b: str) -> None:
    fresh = Store(store.root, store.study)
    assert fresh.summary().run_row(a) is None and "edited" in fresh.unreadable[fresh.path("runs", f"{a}.parquet")]
    with pytest.raises(Exception, match="has no runs"):  # a is the only run with a row: none shown, failed or not
        load_study(store.root, store.study)


def _a_history_left_out(store: Store, a: str, b: str) -> None:
    with pytest.raises(MissingData, match="no finished run"):  # a, the only done run, left out: nothing to draw
        load_study(store.root, store.study)


def _report_reads(store: Store, a: str, b: str) -> None:
    data = load_study(store.root, store.study)  # was: RecursionError
    assert "error" in data.configs[a]


CASES = [
    Case("checkpoint-of-another-run", _other_runs_checkpoint, "a checkpoint of another run or configuration"),
    Case("checkpoint-scaled-by-1.5", _scaled_checkpoint, "its bytes are not those recorded"),
    Case("checkpoint-bit-flipped", _flipped_bit, "set aside"),
    Case("config-nested-100000-deep", _deep_config, "nested too deeply", _report_reads),
    Case("runs-status-flipped", _status_flipped, "", _a_left_out),
    Case("runs-field-edited", _loss_edited, "", _not_served_loss),
    Case("runs-row-duplicated", _runs_row_duplicated, "", _not_served_loss),
    Case("history-edited", _history_edited, "edited", _a_history_left_out),
    Case("index-row-edited", _index_row_edited, None, _not_served_loss),  # a cache: rewritten without a word
    Case("history-index-row-edited", _history_index_edited, None, _history_served_from_the_file),
    Case("evals-value-edited", _vpr_edited, "edited", _a_point_left_out),
    Case("evals-value-edited-digest-nulled", _vpr_edited_digest_nulled, "edited", _a_point_left_out),
    Case("evals-digest-column-dropped", _a_column_dropped, "unreadable", _a_point_unreadable),
    Case("evals-labels-swapped", _labels_swapped, "edited", _a_point_left_out),
    Case("evals-metric-appended", _metric_appended, "edited", _a_point_left_out),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_forged_or_damaged_store_is_not_obeyed_and_one_rerun_heals_it(interrupted, healed_clean, tmp_path, case):
    _, grid, src = interrupted
    store = _copy(src, tmp_path / "results")
    a, b = (r.run_id for r in grid.runs)
    path = case.damage(store, a, b)
    if case.readers:
        case.readers(store, a, b)
    lines = _rerun(grid, store)
    said = "\n".join(lines) + _log(store, a) + _log(store, b)
    assert case.said is None or (path in said and case.said in said), said
    assert _final_state(store, grid) == _final_state(healed_clean, grid)
    for r in grid.runs:
        assert _same_weights(_weights(store, r.run_id), _weights(healed_clean, r.run_id))
    assert not os.path.exists(store.checkpoint_path(b) + DIGEST)
    assert not os.path.exists(previous_checkpoint_path(store, b) + DIGEST)
    v = verify_study(Store(store.root, store.study))
    assert v.ok, v.render()


def test_a_checkpoint_names_its_run_and_its_digest_is_recorded_beside_it(interrupted):
    _, grid, store = interrupted
    b = grid.runs[1]
    for path in (store.checkpoint_path(b.run_id), previous_checkpoint_path(store, b.run_id)):
        sd = _load(path)
        assert sd["run_id"] == b.run_id and sd["config_sha256"] == digest.rows_sha256([b.training_config])
        assert open(path + DIGEST).read() == digest.sha256(open(path, "rb").read())


def test_an_error_writing_stdout_names_stdout_not_the_store(tmp_path):
    with open("/dev/full", "w") as full:
        p = subprocess.run(study_cmd("status", "grids/first_study.yaml", "--results", str(tmp_path)), cwd=ROOT,
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: cannot write the output to stdout: No space left on device"], p.stderr
    assert "no space left on the disk" not in p.stderr


def test_a_store_of_a_task_not_registered_is_one_line_naming_the_task_and_the_variable(interrupted, tmp_path):
    _, grid, src = interrupted
    store = _copy(src, tmp_path / "results")
    a = grid.runs[0].run_id
    row = store.run_row(a)
    store.write_rows("runs", [{**row, "task": "sort_digits"}], f"{a}.parquet")  # a plugin's task, digest kept
    from tests.test_new_task import GRID

    out, gpath = tmp_path / "report", tmp_path / "sorting.yaml"
    gpath.write_text(GRID)
    for cmd in (["report", "--out", str(out)], ["verify"], ["status", str(gpath)]):
        p = subprocess.run(study_cmd(*cmd, "--results", store.root), cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": ROOT, "RMDM_STUDY_TASKS": ""})
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, (cmd, p.stdout, p.stderr)
        assert "unknown task 'sort_digits'" in lines[0] and "RMDM_STUDY_TASKS" in lines[0], lines
    assert not out.exists()  # nothing written


def test_a_run_whose_row_was_deleted_is_named_by_the_report(healed_clean, tmp_path):
    store = _copy(healed_clean, tmp_path / "results")
    runs = sorted(store.read("runs").run_id)
    os.remove(store.path("runs", f"{runs[1]}.parquet"))
    data = load_study(store.root, store.study)
    assert data.runs["run_id"].tolist() == runs[:1] and set(data.evals["run_id"]) == {runs[0]}
    assert "its row deleted" in data.store.unreadable[store.path("runs", f"{runs[1]}.parquet")]
