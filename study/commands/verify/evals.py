"""The evals files: each by the rules of its stored kind (study/engine/kinds) against the evaluation point its
key names and its samples file, and every point a grid or a done run's config owes present."""
from __future__ import annotations

import json

from study.commands.verify.context import Context, same, stem
from study.commands.verify.cost import check_cost
from study.commands.verify.samples import check_texts, check_values, checked_samples, sample_scores
from study.engine.kinds import KINDS


def check_evals_and_samples(c: Context) -> None:
    """Every evals file against its point and samples; every point owed by a done run present. The files of a
    run a grid owes that has no row yet (interrupted while evaluating) are its next `study run`'s to finish."""
    store, v, tables, runs, owed = c.store, c.v, c.tables, c.runs, c.owed
    evals = {rel: t for (table, rel), t in tables.items() if table == "evals"}
    samples = {rel: t for (table, rel), t in tables.items() if table == "samples"}
    # every eval file, readable or not (an unreadable one is already a problem of its own)
    on_disk = {table: {rel for (tb, rel) in c.files if tb == table} for table in ("evals", "samples")}
    for rid in sorted({rel[0] for rels in on_disk.values() for rel in rels} - set(runs) - c.unrun):
        v.problems.append(f"orphan eval files under evals/{rid}/ or samples/{rid}/: no readable runs row for "
                          f"run {rid} (a run still evaluating, or left over)")
    present: dict[str, set[str]] = {}
    for rel, t in sorted(evals.items()):
        rid, key = rel[0], stem(rel[1])
        present.setdefault(rid, set()).add(key)
        path, kind = store.path("evals", *rel), kind_of(t)
        metrics = t.column("metric").to_pylist()
        for m in sorted({m for m in metrics if metrics.count(m) > 1}):
            v.problems.append(f"{path}: {metrics.count(m)} rows of metric {m}, one expected")
        for m in sorted(_metrics_owed(c, rid, key, samples.get(rel), kind) - set(metrics)):
            v.problems.append(f"{path}: no evals row of metric {m} (run {rid}, eval point {key})")
        if rel not in on_disk["samples"]:
            v.problems.append(f"{path}: no samples file {store.path('samples', *rel)}: its values cannot be "
                              f"derived again from per-example scores")
        v.add(kind.count if kind is not None else "eval_files")  # each kind's files counted as it says
        kinds = set(t.column("kind").to_pylist())
        if kind is None and kinds:
            v.problems.append(f"{path}: field kind is {', '.join(sorted(map(repr, kinds)))}: one evaluation kind "
                              f"this code knows expected ({', '.join(sorted(KINDS))})")
        row = runs.get(rid)
        if row is not None and kind is not None:
            _check_point(c, rel, t.to_pylist(), samples.get(rel), row, kind)
    v.add("eval_files", 0)
    for rel in sorted(r for r in on_disk["samples"] - on_disk["evals"] if r[0] not in c.unrun):
        v.problems.append(f"orphan file {store.path('samples', *rel)}: samples without an evals file")

    for rid, keys in sorted(owed.items()):
        row = runs.get(rid)
        if row is None or row["status"] != "done":
            continue
        for key in sorted(keys - present.get(rid, set())):
            v.problems.append(f"run {rid} is done but eval point {key} has no readable evals rows")


def kind_of(t):
    """The evaluation kind of an evals file's rows (their `kind` column), or None: no rows, or not one known kind."""
    kinds = set(t.column("kind").to_pylist())
    return KINDS.get(kinds.pop()) if len(kinds) == 1 else None


def _metrics_owed(c: Context, rid: str, key: str, samples, kind) -> set[str]:
    """Metrics an evals file must hold: those its samples were scored on, and for a point of the
    grid, those its kind owes (every metric of a sample-and-score task)."""
    out = set()
    for js in (samples.column("scores").to_pylist() if samples is not None else []):
        try:
            out |= set(json.loads(js or "{}"))
        except ValueError:
            pass  # reported with the samples
    row = c.runs.get(rid)
    if row is not None and kind is not None and key in c.owed.get(rid, ()):
        try:
            out |= kind.owed_metrics(c.task_of(row))
        except (ValueError, TypeError):
            return out  # reported with the samples
    return out


def _check_point(c: Context, rel: tuple, rows: list[dict], st, row: dict, kind) -> None:
    """One evals file against its evaluation point and its samples file, by its kind's rules."""
    store, v = c.store, c.v
    rid, key = rel[0], stem(rel[1])
    run = c.rebuilt.get(rid)
    path, spath = store.path("evals", *rel), store.path("samples", *rel)
    try:
        task = c.task_of(row)
    except (ValueError, TypeError) as e:
        v.problems.append(f"run {rid}: task not rebuilt from its runs row: {str(e).splitlines()[0][:160]}")
        return
    said = len(v.problems)
    pt = kind.point(v, path, key, rows, c.known.get(rid, {}), run, task)
    if pt is False and len(v.problems) == said:
        v.problems.append(f"{path}: eval_key {key} is not the key of any evaluation point that a grid of the "
                          f"study or run {rid}'s config owes, nor of its rows' own fields (T, L_s, sampler, "
                          f"split, n_examples)")
    if pt is False:
        return
    c.points[(rid, key)] = (kind, pt)
    declared = kind.metrics(task)
    for r in rows:
        if r["metric"] not in declared:
            v.problems.append(f"{path}: field metric is {r['metric']!r}, not a metric task {row['task']} declares "
                              f"for this point ({', '.join(sorted(declared))})")
    if pt is not None:
        kind.check_rows(v, path, key, rows, pt)
    if st is None:
        return  # no samples file: a problem of its own
    srows = checked_samples(v, spath, rows, st)
    scores = sample_scores(v, spath, srows) if srows is not None else None
    if scores is None:
        return
    primary = kind.primary(task)
    for s, sc in zip(srows, scores):
        if primary in sc and not same(s["score"], sc[primary]):
            v.problems.append(f"{spath} example {s['example']}: field score is {s['score']} but its scores say "
                              f"{primary} = {sc[primary]}")
    check_texts(v, spath, srows, scores, task, row, run, kind)
    check_values(v, path, spath, rows, scores, kind, task)
    if srows:
        check_cost(v, path, spath, rows, srows, kind, pt, run, task)
