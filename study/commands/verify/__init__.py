"""`study verify`: check a study's store before believing a figure drawn from it.

Recomputes everything the store lets it recompute, and names the file and field of each
disagreement:
- runs: the run id is the hash of the training config (configs/<id>.json and the row's `config`
  agree field by field); every column a config implies (task, K, L_t, d_model, heads, schedule,
  loss, lr, batch, steps, seed, parameter and FLOP counts) is what `study.engine.rows.run_row` and the
  model's own counting give for that config; `status` agrees with `error`, the weights and the eval
  points; `final_loss` is the history's last loss; `grid` names a grid the study recorded.
- evals: each file is checked by the rules of the evaluation kind its rows name (study/engine/kinds: its
  key, its rows' derivation, its cost; one loop over the files, never a key's shape); a sampled point's
  key is the key of an evaluation point some grid of the study (grids/, see
  store/provenance.py) or the run's config owes, or the key of its rows' own fields; T, L_s,
  sampler, split and n_examples are that point's; value, ci_low and ci_high are what
  `study.engine.rows.metric_rows` (`likelihood_rows` for a likelihood point) gives the
  per-example scores of its samples file; forward_passes, forward_passes_mean and eval_flops are
  what the sampling cost rule (`study.engine.rows.passes_cost`; `likelihood_cost`)
  gives the per-example passes and steps.
- samples: one row per evaluated example (0..n-1); the outputs kept are re-scored from their text
  by the task (`Task.rescore`) and must match the stored scores; a task that cannot re-score from
  text says so (`NotRescorable`) and is named among what is not re-derived.
- every eval point owed by every grid the study ran (and by each done run's config) is present,
  with its samples file; a run a grid lists that has no row yet is owed (a status line naming the
  `study run` that finishes it), not damage; the read index (_index/) agrees with the files it summarises.
- the store's invariants: every table file parses and lies where the layout puts it, one runs
  row per id, weights present (and loadable without running code) for every done run, histories
  monotone within an attempt.
What cannot be re-derived (measured times, hosts, per-example scores whose outputs were not kept)
is named in the summary line. Reads the store only.

One module per thing checked (runs, configs, grids, evals, samples, cost, read_index, histories,
leftovers), each check a function of one `Context` (context.py).
"""
from __future__ import annotations

import hashlib
import math

import pyarrow.fs as pafs

from store import SCHEMAS, Store, is_safe_name
from study.commands.verify.configs import check_run_configs
from study.commands.verify.context import Context, Verdict, stem
from study.commands.verify.digests import check_digests
from study.commands.verify.evals import check_evals_and_samples, kind_of
from study.commands.verify.grids import check_grids, expected_points
from study.commands.verify.histories import check_histories
from study.commands.verify.leftovers import check_leftovers
from study.commands.verify.read_index import check_index
from study.commands.verify.runs import check_final_loss, check_runs
from study.commands.verify.weights import check_weights
from tasks import check_registered

__all__ = ["PointError", "Verdict", "verify_study"]


class PointError(ValueError):
    """`--point` names no stored eval point: a usage error (exit 2) listing those there are."""


def verify_study(store: Store, deep: bool = False, fraction: float = 1.0, points: list[str] | None = None) -> Verdict:
    """Every check of the store; `deep`: also evaluate a `fraction` of the eval points (or the named `points`)
    again from the stored weights (deep.py)."""
    c = Context(store, Verdict(store.study, store.dir))
    read_tables(c)
    chosen = chosen_points(c, fraction, points or []) if deep else []
    check_runs(c)
    check_registered(r["task"] for r in c.runs.values())  # a plugin's task not registered: UnknownTask, exit 2
    check_grids(c)
    check_run_configs(c)
    check_weights(c)
    check_digests(c)
    expected_points(c)
    check_evals_and_samples(c)
    check_histories(c)
    check_final_loss(c)
    check_index(c)
    check_leftovers(c)
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


def read_tables(c: Context) -> None:
    """Every Parquet file of the store, parsed; one that does not parse is a problem."""
    c.files = table_files(c)
    for (table, rel), path in c.files.items():
        data = c.store.read_bytes(path)
        t = c.store._parse(path, data, SCHEMAS[table]) if data is not None else None
        if t is None:
            c.v.problems.append(f"unreadable file {path}: {c.store.unreadable.get(path, 'vanished while read')}")
        else:
            c.tables[(table, rel)] = t


def table_files(c: Context) -> dict[tuple[str, tuple[str, ...]], str]:
    """(table, path parts inside the table) -> path, for every Parquet file; misplaced files are problems."""
    store, v = c.store, c.v
    out = {}
    for table in SCHEMAS:
        root = f"{store.dir}/{table}"
        for info in store.fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
            if info.type != pafs.FileType.File or info.base_name[0] in "._":
                continue  # temp files of interrupted writers are not part of the store
            rel = tuple(info.path[len(root) + 1:].split("/"))
            flat = table in ("runs", "history")
            if (not info.base_name.endswith(".parquet") or len(rel) != (1 if flat else 2)
                    or not all(is_safe_name(p) for p in rel)):
                v.problems.append(f"orphan file {info.path}: not where the store's layout puts a {table} file")
                continue
            out[(table, rel)] = info.path
    return out
