"""Evaluation kinds: what an eval point of the store is, stored in its evals rows' `kind` column (never read
from the shape of its key). One module per kind, each owning its eval key, its rows, its cost rule and its
re-derivation for `study verify` (`--deep`: `redo`), registered here by name as tasks are in tasks/
(study.engine.trial.evaluate_point evaluates a point by its kind):

- sample.py: a grid's point of a sample-and-score task (study.engine.evaluate.evaluate);
- likelihood.py: a grid's point of a likelihood task (text8): the NLL bound of its sequences;
- gen.py: a likelihood point's unconditional generations, key `<point key>-gen`;
- nll.py: the continuous quantities of a run (study.engine.evaluate.evaluate_nll), key `nll-<split>`;
- ext.py: `study eval --puzzles` on an external file (study/commands/puzzles.py), key `ext-<digest>-...`.

A kind is torch-free: what evaluates (torch) is imported inside `evaluate` / `redo`, so `study verify`
re-derives a store's rows without torch. A new kind is one module with one `register` call; importing it
(a task's plugin module, RMDM_STUDY_TASKS) makes it known to every command.
"""
from __future__ import annotations

from study.engine.kinds import ext, gen, likelihood, nll, sample  # noqa: F401 -- each registers itself
from study.engine.kinds.base import KINDS, Kind, register  # noqa: F401 (the registry's face)
