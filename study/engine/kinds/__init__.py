"""Evaluation kinds: what an eval point of the store is, stored in its evals rows' `kind` column (never read
from the shape of its key). One module per kind, each owning its eval key, its rows, its cost rule and its
re-derivation for `study verify` (`--deep`: `redo`), registered here by name as tasks are in tasks/:

- sample.py: a grid's point of a sample-and-score task (study.engine.evaluate.evaluate);
- likelihood.py: a grid's point of a likelihood task (text8): the NLL bound of its sequences;
- gen.py: a likelihood point's unconditional generations, key `<point key>-gen`;
- nll.py: the continuous quantities of a run (study/engine/continuous.py), key `nll-<split>`;
- ext.py: `study eval --puzzles` on an external file (study/commands/puzzles.py), key `ext-<digest>-...`.

A kind is torch-free: what evaluates (torch) is imported inside `evaluate` / `redo`, so `study verify`
re-derives a store's rows without torch. A new kind is one module with one `register` call; importing it
(a task's plugin module, RMDM_STUDY_TASKS) makes it known to every command.
"""
from __future__ import annotations

from study.engine.kinds import ext, gen, likelihood, nll, sample  # noqa: F401 -- each registers itself
from study.engine.kinds.base import KINDS, Kind, register  # noqa: F401 (the registry's face)
from study.spec.grid import EvalPoint


def evaluate_point(run, pt: EvalPoint, model, task, ev_full, store, precision: str = "float32") -> list:
    """Evaluate one eval point of a run (its first `pt.n_examples` examples of `ev_full`) by the kind its task's
    `eval_mode` names, and write its rows; returns its evals rows (a likelihood point's generations' included)."""
    from study.engine.evaluate import write

    ev = ev_full.head(pt.n_examples)
    done = KINDS[task.eval_mode].evaluate(run.run_id, pt, model, task, ev, min(run.eval.n_samples_kept, len(ev)),
                                          precision)
    for e in done:
        write(store, run.run_id, e)
    return [r for e in done for r in e.evals]
