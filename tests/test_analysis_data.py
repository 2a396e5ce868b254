"""Hand-made results stores for the analysis and report tests (no tests here; imported by them).

Two studies written as real Parquet through store.Store.write_rows:
- "paper": 9x9 Sudoku at 25% and 50% masked, models (K x L) with known VPR at T = 1, 2, 4, 8,
  two seeds of (1 x 3), (1 x L) families evaluated at several sampling depths L_s (cross-depth,
  compute), a random-sampler row that must be ignored, history rows.
- "ablation" (written last, so the newest): loss and schedule ablations of (1 x 3), text8 models
  with NLL, history rows.
"""
from __future__ import annotations

import datetime as dt
import json

from store import Store
from tests.helpers import full_row

N = 100  # examples per evaluation point: values are counts / 100
TS = [1, 2, 4, 8]

# VPR at T = 1, 2, 4, 8 (L_s = L_t), 9x9 Sudoku, 25% masked, d_model 64, seed 0
VPR_25 = {
    (1, 1): [0.10, 0.40, 0.80, 0.93],  # never reaches 0.95
    (1, 3): [0.70, 0.96, 0.94, 0.98],  # seed 0 alone reaches at T = 2; the seed mean at T = 4
    (1, 5): [0.80, 0.97, 0.98, 0.99],
    (2, 1): [0.30, 0.70, 0.95, 0.97],  # reaches exactly 0.95 at T = 4
    (2, 3): [0.96, 0.97, 0.99, 0.99],
    (3, 1): [0.50, 0.85, 0.96, 0.98],
    (6, 1): [0.90, 0.97, 0.99, 0.99],
}
VPR_25_SEED1 = {(1, 3): [0.70, 0.92, 0.98, 0.98]}
# 50% masked: (1 x 1), (1 x 3) at d_model 64 and (3 x 1) at d_model 32 (no iso-FLOP partner: other width)
VPR_50 = {(1, 1, 64): [0.00, 0.05, 0.20, 0.40], (1, 3, 64): [0.20, 0.50, 0.70, 0.80],
          (3, 1, 32): [0.10, 0.30, 0.60, 0.75]}
# cross-depth at T = 4: (L_t, L_s) -> VPR (seed 0; (1 x 3) seed 1 adds 0.02 to each of its cells)
CROSS = {(1, 3): 0.85, (3, 1): 0.60, (3, 2): 0.80, (3, 4): 0.95, (3, 6): 0.97, (5, 1): 0.55, (5, 3): 0.90}
TEXT8_NLL = {(1, 1): 4.742, (1, 3): 5.429, (1, 5): 5.530}


def n_params(K: int, d_model: int = 64) -> int:
    return K * 100 * d_model // 64 + 50


def run_row(study: str, task: str, tp: dict, K: int, L: int, seed: int = 0, d_model: int = 64,
            loss: str = "all", schedule: str = "fixed") -> dict:
    run_id = f"{task}-{tp.get('mask_rate', 'x')}-{K}x{L}-d{d_model}-{loss}-{schedule}-s{seed}".replace(".", "p")
    return full_row("runs", **{
            "run_id": run_id, "study": study, "task": task, "task_params": json.dumps(tp, sort_keys=True), "K": K,
            "L_t": L, "schedule": schedule, "loss": loss, "d_model": d_model, "heads": 4, "lr": 1e-3, "batch": 32,
            "steps": 100, "seed": seed, "n_params": n_params(K, d_model), "n_params_non_embedding": K * 100,
            "flops_per_forward": K * L * 1000, "train_seconds": 1.0, "final_loss": 0.5, "status": "done",
            "error": None, "attempts": 1, "node": "testnode", "device": "cpu", "code_version": "abc123",
            "config": "{}", "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})


def eval_row(run: dict, T: int, L_s: int, metric: str, value: float, sampler: str = "confidence") -> dict:
    return full_row("evals", **{
            "run_id": run["run_id"], "eval_key": f"T{T}-L{L_s}-{sampler}", "T": T, "L_s": L_s, "sampler": sampler,
            "split": "test", "n_examples": N, "metric": metric, "value": value, "ci_low": None, "ci_high": None,
            "forward_passes": T * L_s, "eval_flops": T * L_s * 1000 * N, "eval_seconds": 0.1,
            "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})


def _write(store: Store, run: dict, evals: list[dict], history: bool = True) -> None:
    store.write_rows("runs", [run], f"{run['run_id']}.parquet")
    by_key: dict[str, list[dict]] = {}
    for e in evals:
        by_key.setdefault(e["eval_key"], []).append(e)
    for key, rows in by_key.items():
        store.write_rows("evals", rows, run["run_id"], f"{key}.parquet")
    if history:
        rows = [full_row("history", run_id=run["run_id"], step=s, loss=3.0 / (1 + s / 50) + 0.1 * run["seed"],
                         loop_losses=[3.0 / (1 + s / 50)] * run["L_t"], L_t=run["L_t"], lr=1e-3, seconds=s / 10)
                for s in range(0, 101, 20)]
        store.write_rows("history", rows, f"{run['run_id']}.parquet")
    store.write_config(run["run_id"], {"run_id": run["run_id"], "model": {"K": run["K"], "L": run["L_t"]}})


def write_paper(root: str) -> Store:
    store = Store(root, "paper")
    sud25, sud50 = {"n": 9, "mask_rate": 0.25}, {"n": 9, "mask_rate": 0.5}
    for (K, L), vals in VPR_25.items():
        seeds = [(0, vals)] + ([(1, VPR_25_SEED1[(K, L)])] if (K, L) in VPR_25_SEED1 else [])
        for seed, vs in seeds:
            run = run_row("paper", "sudoku", sud25, K, L, seed=seed)
            ev = [eval_row(run, T, L, "vpr", v) for T, v in zip(TS, vs)]
            ev += [eval_row(run, T, L, "cell_acc", min(1.0, v + 0.05)) for T, v in zip(TS, vs)]
            if K == 1:
                for (lt, ls), v in CROSS.items():
                    if lt == L:
                        ev.append(eval_row(run, 4, ls, "vpr", v + 0.02 * seed))
            if (K, L) == (2, 3):
                ev.append(eval_row(run, 1, 3, "vpr", 0.0, sampler="random"))  # must be ignored
            _write(store, run, ev)
    for (K, L, d), vals in VPR_50.items():
        run = run_row("paper", "sudoku", sud50, K, L, d_model=d)
        _write(store, run, [eval_row(run, T, L, "vpr", v) for T, v in zip(TS, vals)])
    store.write_text(store.path("grid.yaml"), "study: paper\ntask: {name: sudoku, n: 9}\naxes: {K: [1, 2]}\n")
    return store


def write_ablation(root: str) -> Store:
    store = Store(root, "ablation")
    sud = {"n": 9, "mask_rate": 0.25}
    losses = {"all": [0.6, 0.8, 0.9, 0.95], "final": [0.3, 0.5, 0.7, 0.8], "truncated": [0.5, 0.7, 0.85, 0.9]}
    for loss, vals in losses.items():
        run = run_row("ablation", "sudoku", sud, 1, 3, loss=loss)
        _write(store, run, [eval_row(run, T, 3, "vpr", v) for T, v in zip(TS, vals)])
    for sched, vals in {"reverse_curriculum": [0.7, 0.9, 0.95, 0.97], "curriculum": [0.4, 0.6, 0.8, 0.9]}.items():
        run = run_row("ablation", "sudoku", sud, 1, 3, schedule=sched)
        _write(store, run, [eval_row(run, T, 3, "vpr", v) for T, v in zip(TS, vals)])
    for (K, L), nll in TEXT8_NLL.items():
        run = run_row("ablation", "text8", {"seq_len": 64}, K, L)
        _write(store, run, [eval_row(run, 1, L, "nll", nll)])
    store.write_text(store.path("grid.yaml"), "study: ablation\naxes: {loss: [all, final, truncated]}\n")
    return store


def write_all(root: str) -> None:
    write_paper(root)
    write_ablation(root)  # newest: the default study
