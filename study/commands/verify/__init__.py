"""`study verify`: check a study's store before believing a figure drawn from it: recompute everything the
store lets it recompute, name the file and field of each disagreement, and name what cannot be re-derived
(docs/DESIGN.md, "Verify", says what each check derives from what). Reads the store only.

Each check is a function of one `Context` (context.py), run in the order of `CHECKS`: files.py (the files,
the read index, leftovers), runs.py (rows, configs, weights, digests, histories), grids.py, evals.py
(evals, samples, cost; each file by its evaluation kind, study/engine/kinds); deep.py evaluates again.
"""
from __future__ import annotations

import hashlib
import math

from store import Store
from study.commands.verify.context import Context, Verdict, stem
from study.commands.verify.evals import check_evals_and_samples, kind_of
from study.commands.verify.files import check_index, check_leftovers, read_tables
from study.commands.verify.grids import check_grids, expected_points
from study.commands.verify.runs import (check_digests, check_histories, check_run_configs, check_runs,
                                        check_weights)

__all__ = ["PointError", "Verdict", "verify_study"]


class PointError(ValueError):
    """`--point` names no stored eval point: a usage error (exit 2) listing those there are."""


# every check, in the order each reads what the ones before it learnt (Context)
CHECKS = (check_runs, check_grids, check_run_configs, check_weights, check_digests, expected_points,
          check_evals_and_samples, check_histories, check_index, check_leftovers)


def verify_study(store: Store, deep: bool = False, fraction: float = 1.0, points: list[str] | None = None) -> Verdict:
    """Every check of the store; `deep`: also evaluate a `fraction` of the eval points (or the named `points`)
    again from the stored weights (deep.py)."""
    c = Context(store, Verdict(store.study, store.dir))
    read_tables(c)
    chosen = chosen_points(c, fraction, points or []) if deep else []
    for check in CHECKS:
        check(c)
    if deep:
        from study.commands.verify.deep import check_deep  # torch: only --deep evaluates again

        check_deep(c, chosen)
    return c.v


def chosen_points(c: Context, fraction: float, points: list[str]) -> list[tuple[str, str]]:
    """(run_id, eval key) of the stored eval points to evaluate again: those `points` names (RUN_ID/KEY, or KEY
    for every run; PointError when they name none), else a `fraction` of each kind's count (at least one),
    picked by a hash of their names (the same choice at every call, spread over runs and points)."""
    stored = {(rel[0], stem(rel[1])): t for (table, rel), t in c.tables.items() if table == "evals"}
    if points:
        want = [p.split("/", 1) if "/" in p else [None, p] for p in points]
        chosen = sorted((r, k) for r, k in stored if any((wr in (None, r)) and wk == k for wr, wk in want))
        if not chosen:
            keys = sorted({k for _, k in stored})
            raise PointError(f"--point {', '.join(points)}: no stored eval point of that name (RUN_ID/EVAL_KEY or "
                             f"EVAL_KEY, as in evals/<run_id>/<eval_key>.parquet); the stored eval keys "
                             f"(of {len({r for r, _ in stored})} run(s)): {', '.join(keys) or 'none'}")
        return chosen
    groups: dict[str, list] = {}
    for p, t in stored.items():
        kind = kind_of(t)
        groups.setdefault(kind.count if kind is not None else "eval_files", []).append(p)
    chosen = []
    for _, group in sorted(groups.items()):  # each count apart
        rank = sorted(group, key=lambda p: hashlib.sha256(f"{p[0]}/{p[1]}".encode()).hexdigest())
        chosen += rank[:max(1, math.ceil(fraction * len(rank)))]
    return sorted(chosen)
