"""The samples files: one row per example, its scores, its kept outputs re-scored from their text, and each
evals value derived again from the per-example scores."""
from __future__ import annotations

import json

from study.commands.verify.context import Verdict, same
from study.spec.grid import Run
from tasks import NotRescorable


def checked_samples(v: Verdict, spath: str, rows: list[dict], st) -> list[dict] | None:
    """The samples rows by example; None (a problem) when the examples are not 0..m-1 once each."""
    srows = sorted(st.to_pylist(), key=lambda s: (s["example"] is None, s["example"] or 0))
    m = len(srows)
    if [s["example"] for s in srows] != list(range(m)):
        v.problems.append(f"{spath}: examples are not 0..{m - 1}, one row each")
        return None
    for s in srows:
        for fld in ("T", "L_s"):
            if s[fld] != rows[0][fld]:
                v.problems.append(f"{spath} example {s['example']}: field {fld} is {s[fld]!r}, its evals rows say "
                                  f"{rows[0][fld]!r}")
                break
    return srows


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
