"""The samples files: one row per example, its scores, its kept outputs re-scored from their text, and each
evals value derived again from the per-example scores."""
from __future__ import annotations

import json

from study.commands.verify.context import Verdict, same
from study.spec.grid import Run
from tasks import NotRescorable


def checked_samples(v: Verdict, spath: str, rid: str, key: str, rows: list[dict], row: dict,
                     st) -> tuple[list[dict], bool] | None:
    """(the samples rows by example, whether they are of an older store without per-example costs); None (a
    problem) when the examples are not 0..m-1 once each."""
    srows = sorted(st.to_pylist(), key=lambda s: (s["example"] is None, s["example"] or 0))
    m = len(srows)
    if [s["example"] for s in srows] != list(range(m)):
        v.problems.append(f"{spath}: examples are not 0..{m - 1}, one row each")
        return None
    # written before every example was stored with its cost: allowed for runs from before grids were recorded
    legacy = all(s["passes"] is None for s in srows)
    if legacy and row.get("grid") is not None:
        v.problems.append(f"{spath}: field passes is empty: a run of grid {row['grid']} stores every evaluated "
                          f"example with its cost")
        legacy = False
    if legacy:
        v.underived.add("forward_passes / eval_flops of older samples files (no per-example cost)")
    if any(s["run_id"] != rid or s["eval_key"] != key for s in srows):
        v.problems.append(f"{spath}: rows of another run or eval point than its path says")
    for s in srows:
        for fld in ("T", "L_s"):
            if s[fld] != rows[0][fld]:
                v.problems.append(f"{spath} example {s['example']}: field {fld} is {s[fld]!r}, its evals rows say "
                                  f"{rows[0][fld]!r}")
                break
    return srows, legacy


def sample_scores(v: Verdict, spath: str, srows: list[dict]) -> list[dict] | None:
    """Each example's per-metric scores; None (a problem) at the first that is not a JSON object."""
    scores = []
    for s in srows:
        try:
            sc = json.loads(s["scores"]) if s["scores"] else None
            if not isinstance(sc, dict):
                raise ValueError
        except ValueError:
            v.problems.append(f"{spath} example {s['example']}: field scores is not a JSON object of per-metric scores")
            return None
        scores.append(sc)
    return scores


def check_values(v: Verdict, path: str, spath: str, rows: list[dict], scores: list[dict], kind: str,
                 legacy: bool, task) -> None:
    """Each evals row's value derived again from the per-example scores, where the samples hold every example."""
    m = len(scores)
    partial = []
    for r in rows:
        if r["n_examples"] != m or (legacy and kind == "likelihood"):
            if legacy:
                partial.append(r["metric"])
            else:
                v.problems.append(f"{path}: field n_examples is {r['n_examples']} but {spath} holds {m} evaluated "
                                  f"examples")
            continue
        _check_value(v, path, r, scores, kind, task)
    if partial:
        v.underived.add("values of eval points whose samples keep only some examples (written before "
                        "per-example scores were stored for every example)")
        v.notes.append(f"{path}: {', '.join(partial)} not re-derived: its samples file is of an older store "
                       f"({m} examples kept of {rows[0]['n_examples']})")


def _check_value(v: Verdict, path: str, r: dict, scores: list[dict], kind: str, task) -> None:
    """value, ci_low, ci_high of one evals row, derived again from the per-example scores."""
    from study.engine.rows import likelihood_rows, metric_rows

    m = r["metric"]
    declared = {x.name: x for x in task.likelihood_metrics()}  # a likelihood point's rows: from the nats
    nats = next((x.name for x in declared.values() if x.likelihood == 1.0), None)
    if kind == "likelihood" and m in declared and all(nats in s for s in scores):
        want = likelihood_rows([s[nats] for s in scores], {}, [declared[m]])[0]
        if m != nats and all(m in s for s in scores):
            mean = sum(s[m] for s in scores) / len(scores)  # the contract: the mean of the per-example scores
            if not same(mean, want["value"]):
                v.problems.append(f"{path}: {m} per-example scores average {mean}, not {nats} / "
                                  f"{declared[m].likelihood:.6g} = {want['value']}")
    elif kind == "nll" and all(m in s for s in scores):
        from study.engine.nllrows import NLL_METRICS, nll_rows

        want = nll_rows([{x: s.get(x, s[m]) for x in NLL_METRICS} for s in scores], {})[NLL_METRICS.index(m)]
    elif all(m in s for s in scores):
        want = metric_rows(scores, [m], {}, task)[0]
        if not (same(r["ci_low"], want["ci_low"]) and same(r["ci_high"], want["ci_high"])):  # a store written
            want.update({k: v for k, v in metric_rows(scores, [m], {})[0].items()  # before intervals were clipped
                         if k in ("ci_low", "ci_high") and same(r[k], v)})
        if kind == "gen":
            want.update(ci_low=None, ci_high=None)  # the generations' known_words carry no interval
    else:
        v.underived.add(f"evals metric {m} (no per-example score of it)")
        v.notes.append(f"{path}: {m} not re-derived: the samples carry no per-example {m}")
        return
    v.add("nll_recomputed" if kind == "nll" else "metrics_recomputed")
    for fld in ("value", "ci_low", "ci_high"):
        if not same(r[fld], want[fld]):
            v.problems.append(f"{path}: field {fld} of {m} is {r[fld]} but the {len(scores)} per-example scores "
                              f"give {want[fld]}")


def check_texts(v: Verdict, spath: str, srows: list[dict], scores: list[dict], task, row: dict,
                 run: Run | None, kind: str, m: int, legacy: bool) -> None:
    """The kept outputs: a prefix of the examples, as many as the config keeps; each re-scored."""
    textual = [s for s in srows if s["output"] is not None or s["reference"] is not None]
    k = len(textual)
    if [s["example"] for s in textual] != list(range(k)):
        v.problems.append(f"{spath}: the examples with kept text are not the first {k}")
    if run is not None and kind in ("sample", "likelihood") and not legacy:
        want = min(run.eval.n_samples_kept, m)
        if k != want:
            v.problems.append(f"{spath}: text kept for {k} examples but the config keeps n_samples_kept = "
                              f"{run.eval.n_samples_kept} of {m}")
    if kind in ("likelihood", "gen", "nll"):
        if kind == "likelihood":
            v.underived.add("per-sequence likelihood bounds (recomputing them needs the model: `study eval`)")
        elif kind == "nll":
            v.underived.add("per-example ELBO and reference NLL (recomputing them needs the model: --deep)")
            return
        elif k:
            v.underived.add(f"{row['task']} per-example scores (no text re-scorer for this task)")
        v.add("scores_as_stored", m)
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
