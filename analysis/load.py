"""Read a study's tables from the results store."""
from __future__ import annotations

import json

import pandas as pd

from study.store import Store, list_studies


class MissingData(ValueError):
    """The store lacks what a figure needs; the message says what."""


def latest_study(results: str) -> str:
    studies = list_studies(results)
    if not studies:
        raise MissingData(f"no study with results under {results!r}")
    return studies[-1][0]


def load(results: str, study: str | None = None) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """(study, runs, evals joined with their run's columns)."""
    study = study or latest_study(results)
    store = Store(results, study)
    runs = store.read("runs")
    if runs.empty:
        raise MissingData(f"study {study!r} has no runs in {store.dir}")
    evals = store.read("evals")
    params = runs["task_params"].map(json.loads)
    runs = runs.assign(task_variant=[_variant(r.task, p) for r, p in zip(runs.itertuples(), params)],
                       mask_rate=[p.get("mask_rate") for p in params])
    cols = ["run_id", "task", "task_variant", "mask_rate", "K", "L_t", "schedule", "loss", "d_model", "seed",
            "n_params", "n_params_non_embedding", "flops_per_forward", "status"]
    joined = evals.merge(runs[cols], on="run_id", how="inner")
    return study, runs, joined


def _variant(task: str, p: dict) -> str:
    if task == "sudoku":
        return f"sudoku {p.get('n')}x{p.get('n')}, {round(100 * p.get('mask_rate', 0))}% masked"
    return task
