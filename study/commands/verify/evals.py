"""The evals files: each by the rules of its stored kind (study/engine/kinds) against the evaluation point its
key names and its samples file (one row per example, its kept outputs re-scored from their text, each evals
value and the evaluation cost derived again from the per-example scores, passes and steps), and every point
a grid or a done run's config owes present."""
from __future__ import annotations

import json
from functools import partial
from types import SimpleNamespace

from model.costs import flops_per_forward
from study.commands.verify.context import Context, Verdict, same, stem
from study.engine.kinds import KINDS
from study.spec.grid import Run
from tasks import NotRescorable


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
    srows, scores = _samples(v, spath, rows, st)
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


def _samples(v: Verdict, spath: str, rows: list[dict], st) -> tuple[list[dict], list[dict] | None]:
    """The samples rows by example and each one's per-metric scores; scores None (a problem) when the examples
    are not 0..m-1 once each, or at the first example whose scores are not a JSON object."""
    srows = sorted(st.to_pylist(), key=lambda s: (s["example"] is None, s["example"] or 0))
    m = len(srows)
    if [s["example"] for s in srows] != list(range(m)):
        v.problems.append(f"{spath}: examples are not 0..{m - 1}, one row each")
        return srows, None
    for s in srows:
        for fld in ("T", "L_s"):
            if s[fld] != rows[0][fld]:
                v.problems.append(f"{spath} example {s['example']}: field {fld} is {s[fld]!r}, its evals rows say "
                                  f"{rows[0][fld]!r}")
                break
    scores = []
    for s in srows:
        try:
            sc = json.loads(s["scores"]) if s["scores"] else None
            if not isinstance(sc, dict):
                raise ValueError
        except ValueError:
            v.problems.append(f"{spath} example {s['example']}: field scores is not a JSON object of per-metric scores")
            return srows, None
        scores.append(sc)
    return srows, scores


def check_values(v: Verdict, path: str, spath: str, rows: list[dict], scores: list[dict], kind, task) -> None:
    """Each evals row's value, ci_low and ci_high derived again from the per-example scores, by its kind's rule."""
    m = len(scores)
    for r in rows:
        if r["n_examples"] != m:
            v.problems.append(f"{path}: field n_examples is {r['n_examples']} but {spath} holds {m} evaluated "
                              f"examples")
            continue
        want = kind.derive(v, path, r, scores, task)
        if want is None:
            v.underived.add(f"evals metric {r['metric']} (no per-example score of it)")
            v.notes.append(f"{path}: {r['metric']} not re-derived: the samples carry no per-example {r['metric']}")
            continue
        v.add(kind.recomputed)
        for fld in ("value", "ci_low", "ci_high"):
            if not same(r[fld], want[fld]):
                v.problems.append(f"{path}: field {fld} of {r['metric']} is {r[fld]} but the {m} per-example scores "
                                  f"give {want[fld]}")


def check_texts(v: Verdict, spath: str, srows: list[dict], scores: list[dict], task, row: dict, run: Run | None,
                kind) -> None:
    """The kept outputs: a prefix of the examples, as many as the config keeps; each re-scored (unless its kind
    takes the scores as stored)."""
    textual = [s for s in srows if s["output"] is not None or s["reference"] is not None]
    k, m = len(textual), len(srows)
    if [s["example"] for s in textual] != list(range(k)):
        v.problems.append(f"{spath}: the examples with kept text are not the first {k}")
    if run is not None and kind.keeps_text:
        want = min(run.eval.n_samples_kept, m)
        if k != want:
            v.problems.append(f"{spath}: text kept for {k} examples but the config keeps n_samples_kept = "
                              f"{run.eval.n_samples_kept} of {m}")
    if kind.as_stored(v, row["task"], k, m):
        return
    if not _rescore_file(v, spath, [s for s in textual if s["output"] is not None], scores, task):
        v.add("scores_as_stored", m)
        return
    v.add("scores_as_stored", m - k)
    if m - k:
        v.underived.add("per-example scores of examples whose outputs were not kept (taken as stored)")


def _rescore_file(v: Verdict, path: str, rows: list[dict], scores: list[dict], task) -> bool:
    """Re-score the kept outputs from their text (Task.rescore); each must match its stored per-metric
    scores. False when the task cannot re-score from text (named among what is not re-derived)."""
    for r in rows:
        where = f"{path} example {r['example']}"
        try:
            s = task.rescore(r["input"], r["output"], r["reference"])
        except NotRescorable as e:
            v.underived.add(str(e))
            return False
        except (ValueError, IndexError, TypeError) as e:
            v.problems.append(f"{where}: output does not re-score: {str(e).splitlines()[0][:160]}")
            continue
        v.add("samples")
        stored = scores[r["example"]]
        primary = s.get(task.primary_metric)
        if primary is not None and not same(r["score"], primary):
            v.problems.append(f"{where}: stored score {r['score']} but its output re-scores to {primary} "
                              f"({task.primary_metric}; output {str(r['output'])[:60]!r})")
        for m, val in s.items():
            if m in stored and m != task.primary_metric and not same(stored[m], val):
                v.problems.append(f"{where}: stored {m} {stored[m]} but re-scored {val}")
    return True


def check_cost(v: Verdict, path: str, spath: str, rows: list[dict], srows: list[dict], kind, pt, run, task):
    """forward_passes, forward_passes_mean and eval_flops derived again from the per-example cost, by its kind's rule."""
    if run is None:
        v.underived.add("evaluation cost of runs whose config is unusable")
        return
    # what the cost rules read of a model, its FLOP counting, without building one (RecursiveDenoiser's
    # flops_per_forward is model.costs.flops_per_forward of its config and sequence spec)
    counted = SimpleNamespace(flops_per_forward=partial(flops_per_forward, run.model, len(task.pos_ids()),
                                                        task.vocab_size))
    want = kind.cost(v, spath, counted, rows, srows, pt, task)
    for r in rows if want is not None else ():
        for fld in ("forward_passes", "eval_flops", "forward_passes_mean"):
            if not same(r[fld], want[fld]):
                v.problems.append(f"{path}: field {fld} of {r['metric']} is {r[fld]} but the per-example cost in "
                                  f"{spath} gives {want[fld]}")
