"""`study backfill --study NAME`: the continuous quantities (study.engine.evaluate.evaluate_nll: the `nll-test` and
`nll-val` points, ELBO and reference NLL per blank) of the done runs of a store written before they were
kept, scored from each run's stored final weights under the study's lease (no `study run` meanwhile), each
file written atomically (Store.write_rows). The checkpoints' numbers (history `val_elbo`, `val_ref_nll`)
cannot be backfilled: checkpoints are deleted once a run ends."""
from __future__ import annotations

import torch

from store import Store
from study.commands.puzzles import load_run_model
from study.commands.verify.runs import run_of_config
from study.engine.evaluate import NLL_KEYS, evaluate_run, scored
from tasks import make_task

NO_CHECKPOINTS = ("checkpoint numbers (history val_elbo, val_ref_nll) are not backfilled: a run's checkpoints "
                  "are deleted when it ends, so only its final weights can be scored")


def backfill(results: str, study: str, echo=print) -> int:
    """Score every done run that lacks a split's point; returns the number of points written."""
    from store.lease import acquire

    store = Store(results, study)
    wrote = 0
    with acquire(store, "backfill", echo=echo):
        runs = store.read("runs")
        done = sorted(runs.loc[runs["status"] == "done", "run_id"]) if not runs.empty else []
        for rid in done:
            have = store.eval_keys(rid, whole=True)
            if all(k in have for k in NLL_KEYS.values()):
                continue
            cfg, _, model = load_run_model(store, rid)
            run = run_of_config(cfg, study)
            task = make_task(run.task)  # with its evaluation fields (n_test, n_val: the config's task_eval)
            if not scored(task):
                continue  # a likelihood task stores its own NLL bound
            row = store.run_row(rid) or {}
            torch.set_num_threads(max(1, int(run.resources.cpu)))  # as the trial ran: the same reduction order
            with store.task_data() as d:
                task.prepare(d)
            keys = evaluate_run(run, task, model, store, have, task.eval_set, row.get("precision") or "float32")
            echo(f"{rid}: " + (", ".join(keys) or "nothing to add"))
            wrote += len(keys)
    echo(f"study {study}: {wrote} point(s) written from the stored weights; {NO_CHECKPOINTS}")
    return wrote
