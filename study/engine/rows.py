"""What a trial writes that needs no torch: the runs row, the evals rows of a point's per-example scores, its
cost rule (the continuous quantities' too: study/engine/evaluate.py scores them), the check of cached task
data. study.engine.trial and study.engine.evaluate use these (and
re-export them); `study verify` re-derives the store's rows with the same functions without importing torch."""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys

from stats import mean_ci, t_ci, wilson
from study.spec.grid import Run

GEN_SUFFIX = "-gen"  # eval key of a likelihood point's unconditional generations: `<key>-gen`
STATE_KEYS = ("model", "opt", "step", "seconds", "history", "torch_rng")  # what Trainer.state_dict holds
NLL_KEYS = {"test": "nll-test", "val": "nll-val"}  # eval key of each split's continuous-quantity point
NLL_METRICS = ("elbo", "ref_nll")
NLL_SAMPLER = "likelihood"  # the continuous rows' sampler column: nothing is sampled
N_T = 8  # noise levels of the continuous quantities' ELBO estimate


def gpu_ids() -> str | None:
    """The GPU ids Ray assigned to this trial ("0", "0,1"), or None: none assigned, or not in Ray.
    Ray also exports them as CUDA_VISIBLE_DEVICES, so inside the trial torch numbers them from 0."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    ids = ray.get_gpu_ids()
    return ",".join(str(i) for i in ids) or None


def damaged_data(data_dir: str, deep: bool = True) -> list[tuple[str, str]]:
    """(path, why) of every cached task data file (.npz) in `data_dir` that does not load whole (`deep`:
    every array read, its CRC checked), or (not `deep`: cheap, for every `study run`) whose zip
    directory does not read (truncated, random bytes, a git-lfs pointer)."""
    import zipfile

    import numpy as np

    out = []
    for name in sorted(os.listdir(data_dir)) if os.path.isdir(data_dir) else []:
        path = os.path.join(data_dir, name)
        if not name.endswith(".npz") or name.startswith(".") or ".tmp-" in name:
            continue
        try:
            if not deep:
                with zipfile.ZipFile(path) as z:
                    if not z.namelist():
                        raise ValueError("an empty archive")
                continue
            with np.load(path, allow_pickle=False) as z:
                for k in z.files:
                    z[k]
        except Exception as e:  # noqa: BLE001 -- any failure to load is damage (BadZipFile, zlib, pickle, ...)
            out.append((path, f"not a readable data file: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"))
    return out


def run_row(run: Run, costs: dict, status: str, code_version: str, device: str | None = None,
            error: str | None = None, attempts: int = 1, train_seconds: float | None = None,
            final_loss: float | None = None, grid: str | None = None, attention: str | None = None,
            precision: str | None = None, weights_sha256: str | None = None,
            history_sha256: str | None = None) -> dict:
    """The runs row (every column of store.RUNS). attention, precision: what the run trained with (None
    when it did not train in this process)."""
    return {
        "run_id": run.run_id, "study": run.study, "group": run.group, "task": run.task.name,
        "task_params": json.dumps(run.task.model_dump(), sort_keys=True), "K": run.model.K, "L_t": run.model.L,
        "schedule": run.train.schedule, "loss": run.train.loss, "d_model": run.model.d_model,
        "heads": run.model.n_heads, "lr": run.train.lr, "batch": run.train.batch_size, "steps": run.train.steps,
        "seed": run.train.seed, **costs, "train_seconds": train_seconds, "final_loss": final_loss,
        "status": status, "error": error, "attempts": attempts, "device": device, **node_info(),
        "code_version": code_version, "config": json.dumps(run.resolved(), sort_keys=True), "created_at": now(),
        "grid": grid, "attention": attention, "precision": precision, "weights_sha256": weights_sha256,
        "history_sha256": history_sha256, "row_sha256": None,  # set by Store.write_rows
    }


def node_info() -> dict:
    """Where this process runs: hostname, and Ray's node id, IP and assigned GPU ids inside a Ray worker."""
    info = {"node": socket.gethostname(), "node_id": None, "node_ip": None, "gpu_ids": None}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        info["node_id"] = ray.get_runtime_context().get_node_id()
        info["node_ip"] = ray.util.get_node_ip_address()
        info["gpu_ids"] = gpu_ids()
    return info


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def clipped(lo, hi, metric) -> tuple:
    """An interval inside its metric's declared bounds (tasks.base.Metric.bounds: a mean of 0..1 scores such
    as cell_acc has a normal interval that can pass 1)."""
    b = metric.bounds if metric is not None else None
    return (lo, hi) if b is None or lo is None or hi is None else (max(lo, b[0]), min(hi, b[1]))


def metric_rows(scores: list[dict], metrics, base: dict, task=None) -> list[dict]:
    """One evals row per metric: the mean of the per-example scores and its 95% interval
    (Wilson for 0/1 scores, mean +- 1.96 sd / sqrt(n) otherwise, clipped to `task`'s declared bounds of the
    metric); `base` holds the other columns."""
    return column_rows({m: [s[m] for s in scores] for m in metrics}, base, task)


def column_rows(columns: dict, base: dict, task=None) -> list[dict]:
    """metric_rows of each metric's per-example scores, given as one sequence per metric (`study eval
    --puzzles` keeps them so, a float each, whatever the file's size)."""
    rows = []
    for m, vals in columns.items():
        n = len(vals)
        value = sum(vals) / n
        binary = all(v in (0.0, 1.0) for v in vals)
        lo, hi = clipped(*(wilson(sum(vals), n) if binary else mean_ci(vals)[1:]),
                         task.metric_of(m) if task is not None else None)
        rows.append({**base, "n_examples": n, "metric": m, "value": value, "ci_low": lo, "ci_high": hi})
    return rows


def likelihood_rows(per_char: list[float], base: dict, metrics) -> list[dict]:
    """One evals row per likelihood metric (Task.likelihood_metrics) of per-sequence NLL bounds (nats per
    position): their mean and its normal 95% interval over the sequences, each in its metric's unit (the
    nats divided by Metric.likelihood: 1 for nats, ln 2 for bits)."""
    n = len(per_char)
    nll, lo, hi = mean_ci(per_char)
    return [{**base, "n_examples": n, "metric": m.name, "value": nll / m.likelihood, "ci_low": lo / m.likelihood,
             "ci_high": hi / m.likelihood} for m in metrics]


def likelihood_cost(model, n_t: int, L_s: int, n: int) -> dict:
    """forward_passes / eval_flops of the NLL bound of n sequences: once per noise level (L_s loops each)
    per sequence, whatever T is."""
    return {"forward_passes": n_t * L_s, "eval_flops": n_t * model.flops_per_forward(L_s) * n}


def passes_cost(model, passes: list[int], head_calls: int) -> dict:
    """forward_passes (the most any example ran), forward_passes_mean and eval_flops of a sampling eval from
    each example's block passes and the head's applications (model.rmdm.Sampled's passes and head_calls: the
    steps and loops the sampler actually ran; it stops once nothing is masked, so a T above the number of
    blanks costs less than T * L_s; adaptive depth stops looping once settled). eval_flops: every block pass,
    plus the head each time it read predictions."""
    total = sum(passes)
    flops = model.flops_per_forward(total, heads=head_calls) if total else 0
    return {"forward_passes": max(passes) if passes else 0,
            "forward_passes_mean": total / len(passes) if passes else None, "eval_flops": flops}


def nll_cost(model, n_loops: int, n: int, n_t: int = N_T) -> dict:
    """forward_passes (block passes per example: n_t ELBO calls and the reference's one, L_t loops each) and
    eval_flops of n examples' continuous quantities."""
    return {"forward_passes": (n_t + 1) * n_loops, "eval_flops": (n_t + 1) * model.flops_per_forward(n_loops) * n,
            "forward_passes_mean": None}


def nll_rows(scores: list[dict], base: dict) -> list[dict]:
    """One evals row per metric of NLL_METRICS: the mean over examples and its 95% Student t interval."""
    n = len(scores)
    rows = []
    for m in NLL_METRICS:
        vals = [s[m] for s in scores]
        mean, lo, hi = t_ci(vals) if n >= 2 else (vals[0], vals[0], vals[0])
        rows.append({**base, "n_examples": n, "metric": m, "value": mean, "ci_low": lo, "ci_high": hi})
    return rows
