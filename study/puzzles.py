"""`study eval RUN_ID --puzzles FILE`: solve the Sudoku puzzles of an external file with a
trained run's final weights, write `evals` and `samples` rows beside the run's own, and
optionally the completed grids in the input's order and format.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time

import torch

from model import ModelConfig, RecursiveDenoiser, SeqSpec
from model.sampler import sample_all
from model.train import CheckpointError, load_state
from store import Store, list_studies
from study.trial import metric_rows, now, sampling_cost
from tasks import TASKS, EvalSet, make_task

class EvalError(ValueError):
    """`study eval` cannot run: unknown run, wrong task, bad file (message says which)."""


def find_run(results: str, run_id: str, study: str | None = None) -> Store:
    """The study that holds final weights of `run_id`."""
    studies = [study] if study else [s for s, _ in list_studies(results)]
    if study is None and os.path.isdir(results):  # also studies whose runs table is not written yet
        studies = sorted(set(studies) | {d for d in os.listdir(results) if os.path.isdir(os.path.join(results, d))})
    found = []
    for s in studies:
        try:
            st = Store(results, s)
            if st.exists(st.weights_path(run_id)):
                found.append(st)
        except ValueError:
            continue
    if not found:
        where = f"study {study!r}" if study else f"any study under {results}"
        raise EvalError(f"no final weights of run {run_id!r} in {where} (is the run trained? see `study status`)")
    if len(found) > 1:
        raise EvalError(f"run {run_id!r} has weights in several studies ({', '.join(s.study for s in found)}): "
                        f"pick one with --study")
    return found[0]


def load_run_model(store: Store, run_id: str, device: str | torch.device = "cpu"):
    """(resolved config, task, model) of a trained run, from its stored config and final weights."""
    raw = store.read_bytes(store.path("configs", f"{run_id}.json"))
    if raw is None:
        raise EvalError(f"{store.dir}: no stored config of run {run_id!r}")
    cfg = json.loads(raw)
    name = cfg["task"]["name"]
    if name not in TASKS:
        raise EvalError(f"run {run_id!r} is task {name!r}, unknown here; known tasks: {', '.join(sorted(TASKS))}")
    task = make_task(TASKS[name][0].model_validate(cfg["task"]))
    model_cfg = ModelConfig.model_validate(cfg["model"])
    model = RecursiveDenoiser(model_cfg, SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())).to(device)
    try:
        sd = load_state(io.BytesIO(store.read_bytes(store.weights_path(run_id))), device, store.weights_path(run_id))
    except CheckpointError as e:
        raise EvalError(str(e)) from None
    model.load_state_dict(sd["model"])
    return cfg, task, model


def evaluate_puzzles(run_id: str, puzzles: str, results: str = "results", study: str | None = None,
                     T: int | None = None, L_s: int | None = None, out: str | None = None,
                     sampler: str = "confidence", seed: int = 0, n_samples_kept: int | None = None,
                     device: str | None = None) -> dict:
    """Solve the Sudoku puzzles of `puzzles` with run `run_id`; write evals + samples rows (and `out`).

    T defaults to the largest T of the run's grid, L_s to its training depth. Returns a summary:
    eval_key, n, metrics {name: (value, ci_low, ci_high)}, out."""
    from tasks.sudoku import Sudoku, format_puzzles, read_puzzles

    store = find_run(results, run_id, study)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg, task, model = load_run_model(store, run_id, dev)
    if not isinstance(task, Sudoku):
        raise EvalError(f"--puzzles reads Sudoku files; run {run_id!r} is task {task.name!r}")
    T = T or max(cfg.get("eval", {}).get("T", [task.n]))
    L_s = L_s or model.cfg.L
    if T < 1 or L_s < 1:
        raise EvalError(f"T and L_s must be >= 1 (got T={T}, L_s={L_s})")
    pf = read_puzzles(puzzles, task.n)
    givens = torch.from_numpy(pf.givens)
    cond = givens >= 0
    x = torch.where(cond, givens, torch.zeros_like(givens))
    t0 = time.perf_counter()
    got = sample_all(model, x, cond, T=T, L_s=L_s, unmask=sampler, seed=seed)
    output = got.x
    secs = time.perf_counter() - t0
    has_ref = pf.solutions is not None
    ref = torch.from_numpy(pf.solutions) if has_ref else x
    scores = task.score(output, EvalSet(ref, cond))
    metrics = task.metric_names if has_ref else ("vpr",)

    with open(puzzles, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:8]
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.splitext(os.path.basename(puzzles))[0])[:40].strip("._") or "file"
    key = f"ext-{stem}-{digest}-T{T}-Ls{L_s}-{sampler}-s{seed}"
    n = len(scores)
    base = {"run_id": run_id, "eval_key": key, "T": T, "L_s": L_s, "sampler": sampler,
            "split": f"external:{os.path.basename(puzzles)}", "eval_seconds": secs, "created_at": now(),
            **sampling_cost(model, got)}
    rows = metric_rows(scores, metrics, base)
    summary = {r["metric"]: (r["value"], r["ci_low"], r["ci_high"]) for r in rows}
    keep = n if n_samples_kept is None else min(n_samples_kept, n)
    samples = [{"run_id": run_id, "eval_key": key, "T": T, "L_s": L_s, "example": i,
                "input": task.render(x[i], cond[i]), "output": task.render(output[i]),
                "reference": task.render(ref[i]) if has_ref else None, "score": scores[i]["vpr"],
                "scores": json.dumps({m: scores[i][m] for m in metrics})} for i in range(keep)]
    store.write_rows("samples", samples, run_id, f"{key}.parquet")
    store.write_rows("evals", rows, run_id, f"{key}.parquet")
    if out:
        text = format_puzzles(pf, output.numpy())
        tmp = f"{out}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, out)
    return {"study": store.study, "eval_key": key, "n": n, "T": T, "L_s": L_s, "metrics": summary, "out": out}
