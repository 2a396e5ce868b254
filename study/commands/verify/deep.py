"""`study verify --deep`: chosen eval points evaluated again from the stored weights, with the stored seed and
the run's precision, through the one evaluation path that wrote them (study.engine.evaluate); every samples
row (text, scores, cost) and every evals row must come out the same. A consistent forgery (an output replaced
and its scores and evals recomputed to match), swapped weights or a silently changed sampler cannot pass.

Exact where the run was evaluated (the same device kind and precision: the sampler's arithmetic is the same
sequence of operations on the same numbers); run on another device or precision, floats are compared to
`DEEP_TOL` and a differing text is a problem all the same (docs/DESIGN.md, "study verify --deep").
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import time

import torch

from model import RecursiveDenoiser, SeqSpec
from model.train import CheckpointError, load_state
from study.commands.verify.context import Context, stem

DEEP_TOL = 1e-4  # relative, for floats re-derived on another device or precision (see the module docstring)
EVAL_FIELDS = ("value", "ci_low", "ci_high", "forward_passes", "eval_flops", "forward_passes_mean")
SAMPLE_FIELDS = ("input", "output", "reference", "score", "passes", "steps")


def chosen_points(c: Context, fraction: float, points: list[str]) -> list[tuple[str, str]]:
    """(run_id, eval key) of the stored eval points to evaluate again: those `points` names (RUN_ID/KEY, or KEY
    for every run), else a `fraction` of them (at least one), picked by a hash of their names (the same
    choice at every call, spread over runs and points)."""
    stored = sorted((rel[0], stem(rel[1])) for (table, rel) in c.tables if table == "evals")
    if points:
        want = [p.split("/", 1) if "/" in p else [None, p] for p in points]
        return [(r, k) for r, k in stored if any((wr in (None, r)) and wk == k for wr, wk in want)]
    chosen = []
    for group in ([p for p in stored if not _is_nll(p[1])], [p for p in stored if _is_nll(p[1])]):  # each apart
        rank = sorted(group, key=lambda p: hashlib.sha256(f"{p[0]}/{p[1]}".encode()).hexdigest())
        chosen += rank[:max(1, math.ceil(fraction * len(rank)))] if rank else []
    return sorted(chosen)


def _is_nll(key: str) -> bool:
    from study.engine.nllrows import NLL_KEYS

    return key in NLL_KEYS.values()


def check_deep(c: Context, fraction: float = 1.0, points: list[str] | None = None) -> None:
    chosen = chosen_points(c, fraction, points or [])
    if points and not chosen:
        c.v.problems.append(f"--point {', '.join(points)}: no stored eval point of that name (RUN_ID/EVAL_KEY "
                            f"or EVAL_KEY, as in evals/<run_id>/<eval_key>.parquet)")
    t0, done, nll = time.perf_counter(), 0, 0
    models: dict = {}
    for rid, key in chosen:
        redone = _redo_point(c, rid, key, models)
        nll, done = (nll + redone, done) if _is_nll(key) else (nll, done + redone)
    total = sum(1 for (table, rel) in c.tables if table == "evals" and not _is_nll(stem(rel[1])))
    n_nll = sum(1 for (table, rel) in c.tables if table == "evals" and _is_nll(stem(rel[1])))
    c.v.notes.append(f"--deep: {done} of {total} eval points evaluated again from the stored weights "
                     f"({time.perf_counter() - t0:.1f} s on cpu)"
                     + (f"; {nll} of {n_nll} continuous-quantity points (nll-test, nll-val)" if n_nll else ""))


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


def _redo_point(c: Context, rid: str, key: str, models: dict) -> int:
    """Evaluate (rid, key) again and compare; 1 when it was, 0 when it could not be (said in a note)."""
    from study.engine.continuous import NLL_KEYS, evaluate_nll
    from study.engine.evaluate import GEN_SUFFIX, evaluate, evaluate_likelihood

    row, run = c.runs.get(rid), c.rebuilt.get(rid)
    base = key[: -len(GEN_SUFFIX)] if key.endswith(GEN_SUFFIX) else key
    pt = c.known.get(rid, {}).get(key) or c.known.get(rid, {}).get(base)
    nll_split = next((s for s, k in NLL_KEYS.items() if k == key), None) if pt is None else None
    if row is None or run is None or (pt is None and nll_split is None):
        c.v.notes.append(f"--deep: {rid}/{key} not evaluated again (no usable config, or not a point a grid or "
                         f"its config owes: an external `study eval` point)")
        return 0
    task = c.task_of(row)
    with c.store.task_data() as d:  # the data the run evaluated on (made again from the config if not cached)
        task.prepare(d)
    model = _model(c, rid, run, task, models)
    if model is None:
        return 0
    torch.set_num_threads(max(1, int(run.resources.cpu)))  # as the trial ran: the same reduction order
    precision = row.get("precision") or "float32"
    if nll_split is not None:  # the continuous quantities: as many examples as the point stored
        n = c.tables[("evals", (rid, f"{key}.parquet"))].column("n_examples")[0].as_py()
        ev = task.eval_set(nll_split).head(n)
        _compare(c, rid, key, evaluate_nll(model, rid, nll_split, ev, run.model.L, precision), _exact(row))
        return 1
    ev = task.eval_set(run.eval.split).head(pt.n_examples)
    keep = min(run.eval.n_samples_kept, len(ev))
    if task.eval_mode == "likelihood":
        got = {e.key: e for e in evaluate_likelihood(rid, pt, model, task, ev, keep, precision)}
    else:
        got = {pt.key: evaluate(model, task, pt, ev, rid, keep=keep, precision=precision)}
    if key not in got:
        c.v.problems.append(f"{c.store.path('evals', rid, key + '.parquet')}: --deep: evaluating point {base} "
                            f"again makes no eval key {key}")
        return 1
    _compare(c, rid, key, got[key], _exact(row))
    return 1


def _exact(row: dict) -> bool:
    """Whether the run was evaluated on the cpu, as --deep is: then every number must come out the same."""
    return (row.get("device") or "cpu").split(":")[0] == "cpu"


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
