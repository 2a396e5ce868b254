"""`study verify --deep`: chosen eval points evaluated again from the stored weights, with the stored seed and
the run's precision, through the one evaluation path that wrote them (study.engine.evaluate); every samples
row and evals row must come out the same: exactly when the run was evaluated on the cpu, else floats to
`DEEP_TOL` (docs/DESIGN.md, "study verify --deep")."""
from __future__ import annotations

import io
import json
import math
import time

import torch

from model import RecursiveDenoiser, SeqSpec
from model.train import CheckpointError, load_state
from study.commands.verify.context import Context

DEEP_TOL = 1e-4  # relative, for floats re-derived on another device or precision (see the module docstring)
EVAL_FIELDS = ("value", "ci_low", "ci_high", "forward_passes", "eval_flops", "forward_passes_mean")
SAMPLE_FIELDS = ("input", "output", "reference", "score", "passes", "steps")


def check_deep(c: Context, chosen: list[tuple[str, str]]) -> None:
    """The `chosen` points (verify_study's chosen_points) evaluated again, each by its kind; counted by kind."""
    t0, done, models = time.perf_counter(), {}, {}
    for rid, key in chosen:
        count = _redo_point(c, rid, key, models)
        done[count] = done.get(count, 0) + 1
    total = c.v.counts
    c.v.notes.append(f"--deep: {done.get('eval_files', 0)} of {total.get('eval_files', 0)} eval points evaluated "
                     f"again from the stored weights ({time.perf_counter() - t0:.1f} s on cpu)"
                     + (f"; {done.get('nll_files', 0)} of {total['nll_files']} continuous-quantity points (nll-test, "
                        f"nll-val)" if total.get("nll_files") else ""))


def _model(c: Context, rid: str, run, task, models: dict):
    """The run's model with its stored weights (once per run), or None (a problem, or said elsewhere)."""
    if rid not in models:
        wpath = c.store.weights_path(rid)
        data = c.store.read_bytes(wpath)
        models[rid] = None
        if data is None:
            return None  # a done run without weights: a problem of check_weights
        try:
            sd = load_state(io.BytesIO(data), "cpu", wpath)
            model = RecursiveDenoiser(run.model, SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes()))
            model.load_state_dict(sd["model"])
        except (CheckpointError, KeyError, RuntimeError, TypeError) as e:
            c.v.problems.append(f"{wpath}: --deep cannot load it into run {rid}'s model "
                                f"({str(e).splitlines()[0][:160]})")
            return None
        models[rid] = model
    return models[rid]


def _redo_point(c: Context, rid: str, key: str, models: dict) -> str | None:
    """Evaluate (rid, key) again by its kind and compare; the verdict count of its kind when it was, else None
    (said in a note)."""
    row, run = c.runs.get(rid), c.rebuilt.get(rid)
    kind, pt = c.points.get((rid, key), (None, None))
    if row is None or run is None or kind is None or not kind.redone:
        c.v.notes.append(f"--deep: {rid}/{key} not evaluated again (no usable config, or not a point a grid or "
                         f"its config owes: an external `study eval` point)")
        return None
    task = c.task_of(row)
    with c.store.task_data() as d:  # the data the run evaluated on (made again from the config if not cached)
        task.prepare(d)
    model = _model(c, rid, run, task, models)
    if model is None:
        return None
    torch.set_num_threads(max(1, int(run.resources.cpu)))  # as the trial ran: the same reduction order
    got = kind.redo(c, rid, key, pt, run, task, model, row.get("precision") or "float32")
    if got is not None:  # exact when the run was evaluated on the cpu, as --deep is
        _compare(c, rid, key, got, (row.get("device") or "cpu").split(":")[0] == "cpu")
    return kind.count


def _same(a, b, exact: bool) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is None and b is None
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b if exact else math.isclose(a, b, rel_tol=DEEP_TOL, abs_tol=DEEP_TOL)
    return a == b


def _compare(c: Context, rid: str, key: str, e, exact: bool) -> None:
    """The stored rows of (rid, key) against those the evaluation made again: the first difference of each file."""
    rel = (rid, f"{key}.parquet")
    path, spath = c.store.path("evals", *rel), c.store.path("samples", *rel)
    how = "the stored weights, evaluated again with the stored seed, give"
    stored = {r["metric"]: r for r in c.tables[("evals", rel)].to_pylist()}
    for r in e.evals:
        s = stored.get(r.metric)
        bad = [f for f in EVAL_FIELDS if s is not None and not _same(s[f], getattr(r, f), exact)]
        if s is None or bad:
            f = bad[0] if bad else "metric"
            c.v.problems.append(f"{path}: field {f} of {r.metric} is {None if s is None else s[f]} but {how} "
                                f"{getattr(r, f, r.metric)}")
    st = c.tables.get(("samples", rel))
    srows = {s["example"]: s for s in st.to_pylist()} if st is not None else {}
    for r in e.samples:
        s = srows.get(r.example)
        if s is None:
            c.v.problems.append(f"{spath} example {r.example}: missing, but {how} one")
            break
        bad = [f for f in SAMPLE_FIELDS if not _same(s[f], getattr(r, f), exact)]
        mine, theirs = json.loads(r.scores), json.loads(s["scores"] or "{}")
        if not bad and (set(mine) != set(theirs) or any(not _same(theirs[m], mine[m], exact) for m in mine)):
            bad = ["scores"]
        if bad:
            f = bad[0]
            c.v.problems.append(f"{spath} example {r.example}: field {f} is {str(s[f])[:60]!r} but {how} "
                                f"{str(getattr(r, f))[:60]!r}")
            break
