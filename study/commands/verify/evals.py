"""The evals files: each against the evaluation point its key names and its samples file, and every point
a grid or a done run's config owes present."""
from __future__ import annotations

import json

from study.commands.verify.context import Context, Verdict, same, stem
from study.commands.verify.cost import check_cost
from study.commands.verify.samples import check_texts, check_values, checked_samples, sample_scores
from study.spec.grid import EvalPoint, Run


def check_evals_and_samples(c: Context) -> None:
    """Every evals file against its point and samples; every point owed by a done run present."""
    store, v, tables, runs, owed = c.store, c.v, c.tables, c.runs, c.owed
    evals = {rel: t for (table, rel), t in tables.items() if table == "evals"}
    samples = {rel: t for (table, rel), t in tables.items() if table == "samples"}
    # every eval file, readable or not (an unreadable one is already a problem of its own)
    on_disk = {table: {rel for (tb, rel) in c.files if tb == table} for table in ("evals", "samples")}
    for rid in sorted({rel[0] for rels in on_disk.values() for rel in rels} - set(runs)):
        v.problems.append(f"orphan eval files under evals/{rid}/ or samples/{rid}/: no readable runs row for "
                          f"run {rid} (a run still evaluating, or left over)")
    present: dict[str, set[str]] = {}
    for rel, t in sorted(evals.items()):
        rid, key = rel[0], stem(rel[1])
        present.setdefault(rid, set()).add(key)
        path = store.path("evals", *rel)
        if any(r != rid for r in t.column("run_id").to_pylist()) or any(
                k != key for k in t.column("eval_key").to_pylist()):
            v.problems.append(f"{path}: rows of another run or eval point than its path says")
        metrics = t.column("metric").to_pylist()
        for m in sorted({m for m in metrics if metrics.count(m) > 1}):
            v.problems.append(f"{path}: {metrics.count(m)} rows of metric {m}, one expected")
        for m in sorted(_metrics_owed(c, rid, key, samples.get(rel)) - set(metrics)):
            v.problems.append(f"{path}: no evals row of metric {m} (run {rid}, eval point {key})")
        if rel not in on_disk["samples"]:
            v.problems.append(f"{path}: no samples file {store.path('samples', *rel)}: its values cannot be "
                              f"derived again from per-example scores")
        row = runs.get(rid)
        if row is not None:
            _check_point(c, rel, t.to_pylist(), samples.get(rel), row)
    nll = sum(1 for rel in evals if stem(rel[1]) in _nll_keys())  # counted apart: the sampled points' count stays
    v.add("eval_files", len(evals) - nll)
    v.add("nll_files", nll)
    for rel in sorted(on_disk["samples"] - on_disk["evals"]):
        v.problems.append(f"orphan file {store.path('samples', *rel)}: samples without an evals file")

    for rid, keys in sorted(owed.items()):
        row = runs.get(rid)
        if row is None or row["status"] != "done":
            continue
        for key in sorted(keys - present.get(rid, set())):
            v.problems.append(f"run {rid} is done but eval point {key} has no readable evals rows")


def _nll_keys() -> set[str]:
    from study.engine.nllrows import NLL_KEYS

    return set(NLL_KEYS.values())


def _metrics_owed(c: Context, rid: str, key: str, samples) -> set[str]:
    """Metrics an evals file must hold: those its samples were scored on, and for a point of the
    grid of a sample-and-score task, every metric of the task."""
    out = set()
    for js in (samples.column("scores").to_pylist() if samples is not None else []):
        try:
            out |= set(json.loads(js or "{}"))
        except ValueError:
            pass  # reported with the samples
    row = c.runs.get(rid)
    if row is not None and key in c.owed.get(rid, ()):
        try:
            task = c.task_of(row)
        except (ValueError, TypeError):
            return out  # reported with the samples
        if task.eval_mode == "sample":
            out |= set(task.metric_names)
    return out


def declared_metrics(task, kind: str) -> set[str]:
    """The metrics an evals row of a `kind` point (sample, likelihood, gen, ext) of `task` may name: the one
    place that says which (tasks declare their own metric names: tasks/base.py)."""
    if kind == "gen":
        return {"known_words"}
    if kind == "nll":  # the continuous quantities (study/engine/continuous.py)
        return {"elbo", "ref_nll"}
    if kind == "likelihood":  # a generations row inside the point: older stores
        return {x.name for x in task.likelihood_metrics()} | {"known_words"}
    return set(task.metric_names)


def _point_from_rows(run: Run, task, key: str, r: dict) -> EvalPoint | None:
    """The evaluation point whose key the rows' own fields (T, L_s, sampler, split, n_examples) and the
    run's eval settings give, if that is `key`: a point of a grid the study did not record."""
    sampler, _, rest = str(r["sampler"]).partition("+adaptive(")
    try:
        adaptive = float(rest.rstrip(")")) if rest else None
    except ValueError:
        return None
    for asked in ("test", "val"):
        try:
            if task.cfg.split_of(asked) != r["split"]:
                continue
            data = tuple(sorted(task.cfg.eval_fields(asked).items()))
        except (ValueError, AttributeError, KeyError):
            continue
        for n in {r["n_examples"], run.eval.n_examples}:
            pt = EvalPoint(T=r["T"], L_s=r["L_s"], sampler=sampler, temperature=run.eval.temperature,
                           remask=run.eval.remask, n_examples=n, split=r["split"], seed=run.eval.seed, data=data,
                           adaptive=adaptive)
            if pt.key == key:
                return pt
    return None


def _check_point(c: Context, rel: tuple, rows: list[dict], st, row: dict) -> None:
    """One evals file against its evaluation point and its samples file."""
    store, v = c.store, c.v
    rid, key = rel[0], stem(rel[1])
    run, known = c.rebuilt.get(rid), c.known.get(rid, {})
    path, spath = store.path("evals", *rel), store.path("samples", *rel)
    if not rows:
        return
    try:
        task = c.task_of(row)
    except (ValueError, TypeError) as e:
        v.problems.append(f"run {rid}: task not rebuilt from its runs row: {str(e).splitlines()[0][:160]}")
        return
    found = _point_of_key(v, path, rid, key, rows, run, task, known)
    if found is None:
        return
    pt, kind = found
    declared = declared_metrics(task, kind)
    for r in rows:
        if r["metric"] not in declared:
            v.problems.append(f"{path}: field metric is {r['metric']!r}, not a metric task {row['task']} declares "
                              f"for this point ({', '.join(sorted(declared))})")
    if pt is not None:
        _check_rows_at_point(v, path, key, rows, pt, kind)
    if st is None:
        return  # no samples file: a problem of its own
    checked = checked_samples(v, spath, rid, key, rows, row, st)
    if checked is None:
        return
    srows, legacy = checked
    scores = sample_scores(v, spath, srows)
    if scores is None:
        return
    primary = "known_words" if kind == "gen" else "elbo" if kind == "nll" else task.sample_score or task.primary_metric
    for s, sc in zip(srows, scores):
        if primary in sc and not same(s["score"], sc[primary]):
            v.problems.append(f"{spath} example {s['example']}: field score is {s['score']} but its scores say "
                              f"{primary} = {sc[primary]}")
    m = len(srows)
    check_texts(v, spath, srows, scores, task, row, run, kind, m, legacy)
    check_values(v, path, spath, rows, scores, kind, legacy, task)
    if not legacy and m:
        check_cost(v, path, spath, rows, srows, kind, pt, run, task)


def _point_of_key(v: Verdict, path: str, rid: str, key: str, rows: list[dict], run: Run | None, task,
                  known: dict) -> tuple[EvalPoint | None, str] | None:
    """(the evaluation point of eval key `key`, the kind of evaluation: sample, likelihood, gen or ext).

    The point is None for `ext` (an external puzzle file: only its digest is stored, so the key is checked
    against the rows instead). None in all (a problem) when no grid, config or row names the key."""
    from study.engine.nllrows import NLL_KEYS
    from study.engine.rows import GEN_SUFFIX

    if key in NLL_KEYS.values() and key not in known:
        _check_nll_rows(v, path, key, rows, run)
        return None, "nll"
    likelihood = task.eval_mode == "likelihood"
    kind = "sample"
    pt = known.get(key)
    if pt is None and likelihood and key.endswith(GEN_SUFFIX) and key[: -len(GEN_SUFFIX)] in known:
        pt, kind = known[key[: -len(GEN_SUFFIX)]], "gen"
    elif pt is not None and likelihood:
        kind = "likelihood"
    if pt is None and key.startswith("ext-"):
        kind = "ext"  # `study eval --puzzles`: the key names the file by its digest, and T, L_s, sampler
        v.underived.add("the puzzle file of an external evaluation (ext- keys: only its digest is stored)")
        for r in rows:
            for fld, want in (("T", f"-T{r['T']}-"), ("L_s", f"-Ls{r['L_s']}-"), ("sampler", f"-{r['sampler']}-")):
                if want not in key:
                    v.problems.append(f"{path}: field {fld} is {r[fld]!r} but the eval key {key} says otherwise")
    if pt is None and kind != "ext":
        pt = _point_from_rows(run, task, key, rows[0]) if run is not None else None
        if pt is None:
            v.problems.append(f"{path}: eval_key {key} is not the key of any evaluation point that a grid of the "
                              f"study or run {rid}'s config owes, nor of its rows' own fields (T, L_s, sampler, "
                              f"split, n_examples)")
            return None
    return pt, kind


def _check_rows_at_point(v: Verdict, path: str, key: str, rows: list[dict], pt: EvalPoint, kind: str) -> None:
    """Each evals row's T, L_s, sampler and split are its point's, and it evaluates no more examples."""
    label = pt.label if kind != "likelihood" and kind != "gen" else pt.sampler
    for r in rows:
        for fld, want in (("T", pt.T), ("L_s", pt.L_s), ("sampler", label), ("split", pt.split)):
            if r[fld] != want:
                v.problems.append(f"{path}: field {fld} is {r[fld]!r} but eval point {key} is {fld} = {want!r}")
        if kind != "gen" and r["n_examples"] is not None and r["n_examples"] > pt.n_examples:
            v.problems.append(f"{path}: field n_examples is {r['n_examples']} but eval point {key} evaluates at "
                              f"most {pt.n_examples} examples")


def _check_nll_rows(v: Verdict, path: str, key: str, rows: list[dict], run: Run | None) -> None:
    """A continuous-quantities point (nll-<split>): T 0, L_s the run's L_t, sampler 'likelihood', its split."""
    from study.engine.nllrows import NLL_KEYS, SAMPLER

    split = next(s for s, k in NLL_KEYS.items() if k == key)
    want = {"T": 0, "sampler": SAMPLER, "split": split, **({"L_s": run.model.L} if run is not None else {})}
    for r in rows:
        for fld, w in want.items():
            if r[fld] != w:
                v.problems.append(f"{path}: field {fld} is {r[fld]!r} but eval point {key} is {fld} = {w!r}")
