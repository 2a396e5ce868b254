"""Read a study's tables from the results store (the only thing `analysis` reads)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd
import pyarrow.fs as pafs

from store import Store, list_studies

# columns of a run that say which model it is; the seed is not one of them (seeds are aggregated)
RUN_COLS = ["run_id", "task", "task_variant", "sudoku_n", "mask_rate", "K", "L_t", "schedule", "loss", "d_model",
            "heads", "lr", "batch", "steps", "seed", "n_params", "n_params_non_embedding", "flops_per_forward", "status"]
# what identifies a trained model apart from its seed; seeds of one model are aggregated (analysis.tables)
MODEL_KEYS = ["task", "task_variant", "K", "L_t", "schedule", "loss", "d_model", "heads", "lr", "batch", "steps"]
# a run with the same values here as another run of the study trains the same model with the same
# seed: a retraining (new code, a task config that gained a field, hence a new run id), not a second
# seed. The newest finished one is analysed; the others are listed in StudyData.superseded.
REPEAT_KEYS = [*MODEL_KEYS, "seed"]


class MissingData(ValueError):
    """The store lacks what a figure needs; the message says what."""


@dataclass
class StudyData:
    """Everything a report needs, read once from one study's directory."""

    name: str
    dir: str
    runs: pd.DataFrame  # one row per run, with task_variant / mask_rate / sudoku_n derived from task_params
    evals: pd.DataFrame  # evals joined with RUN_COLS of their run
    history: pd.DataFrame  # training curves (train_loss, depth = L_t of that step) joined with the run columns
    grid_text: str | None = None  # results/<study>/grid.yaml as last run
    configs: dict[str, dict] = field(default_factory=dict)  # run_id -> configs/<run_id>.json
    store: Store | None = None
    superseded: pd.DataFrame | None = None  # runs retrained later under another id (REPEAT_KEYS): not analysed


def latest_study(results: str) -> str:
    studies = list_studies(results)
    if not studies:
        raise MissingData(f"no study with results under {results!r}")
    return studies[-1][0]


def load(results: str, study: str | None = None) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """(study, runs, evals joined with their run's columns)."""
    d = load_study(results, study)
    return d.name, d.runs, d.evals


def load_study(results: str, study: str | None = None) -> StudyData:
    """Read runs, evals, history, the grid and the per-run configs of a study (default: the newest)."""
    if study is None:
        study = latest_study(results)
    store = Store(results, study)
    runs = store.read("runs")
    if runs.empty:
        known = ", ".join(s for s, _ in list_studies(results)) or "none"
        raise MissingData(f"study {study!r} has no runs in {store.dir} (studies with runs: {known})")
    runs, superseded = drop_superseded(enrich_runs(runs))
    evals = store.read("evals").merge(runs[RUN_COLS], on="run_id", how="inner")
    history = store.read("history")
    if not history.empty:
        history = history.rename(columns={"L_t": "depth", "loss": "train_loss"}).merge(runs[RUN_COLS], on="run_id", how="inner")
    grid = store.read_bytes(store.path("grid.yaml"))
    return StudyData(name=study, dir=store.dir, runs=runs, evals=evals, history=history,
                     grid_text=grid.decode("utf-8", "replace") if grid is not None else None,
                     configs=_configs(store), store=store, superseded=superseded)


def drop_superseded(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs to analyse, runs superseded by a newer run of the same model and seed).

    Of runs equal on REPEAT_KEYS the newest finished one is kept (the newest of all if none
    finished); averaging them as seeds would count one seed twice.
    """
    keys = [c for c in REPEAT_KEYS if c in runs.columns]
    order = runs.assign(_done=runs["status"].eq("done")).sort_values(["_done", "created_at"], kind="stable")
    keep = order.groupby(keys, dropna=False, sort=False).tail(1).index
    kept = runs.loc[runs.index.isin(keep)]
    return kept.reset_index(drop=True), runs.loc[~runs.index.isin(keep)].reset_index(drop=True)


def enrich_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Add the columns derived from task_params: task_variant (a readable name), sudoku_n, mask_rate."""
    params = runs["task_params"].map(lambda s: json.loads(s) if isinstance(s, str) and s else {})
    return runs.assign(task_variant=[task_variant(t, p) for t, p in zip(runs["task"], params)],
                       sudoku_n=[p.get("n") if t == "sudoku" else None for t, p in zip(runs["task"], params)],
                       mask_rate=[p.get("mask_rate") for p in params])


def task_variant(task: str, p: dict) -> str:
    if task == "sudoku":
        n = p.get("n")
        rate = p.get("mask_rate")
        masked = f", {round(100 * rate)}% masked" if rate is not None else ""
        return f"sudoku {n}x{n}{masked}"
    if task == "countdown":
        ops = p.get("n_operands") or p.get("operands") or p.get("n")
        return f"countdown-{ops}" if ops else "countdown"
    return task


def _configs(store: Store) -> dict[str, dict]:
    sel = pafs.FileSelector(f"{store.dir}/configs", allow_not_found=True)
    out = {}
    for info in store.fs.get_file_info(sel):
        if info.base_name.endswith(".json") and not info.base_name.startswith("."):
            data = store.read_bytes(info.path)
            try:
                out[info.base_name[: -len(".json")]] = json.loads(data) if data else {}
            except json.JSONDecodeError as e:
                out[info.base_name[: -len(".json")]] = {"error": f"unreadable config: {e}"}
    return out
