"""Evaluations beyond sample-and-score: likelihood-scored tasks, and external puzzle files.

`evaluate_likelihood` is `study.trial.evaluate_point` for a task whose `eval_mode` is
"likelihood" (Text8): it writes the NLL bound per character (nats), bits per character and
perplexity, and a few unconditional samples (T steps, L_s loops) for a look.

`evaluate_puzzles` is `study eval RUN_ID --puzzles FILE`: it solves the puzzles of a file with a
trained run's final weights, writes `evals` and `samples` rows beside the run's own, and can
write the completed grids in the input's order and format.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import time

import torch

from model import ModelConfig, RecursiveDenoiser, SeqSpec, sample
from model.elbo import nll_bound
from store import Store, list_studies
from tasks import TASKS, EvalSet, make_task, wilson


def _now():
    from study.trial import now

    return now()


# ---- likelihood ------------------------------------------------------------------------------
def evaluate_likelihood(run, pt, model: RecursiveDenoiser, task, ev_full: EvalSet, store: Store,
                        precision: str = "float32", n_generate: int = 16) -> list[dict]:
    """NLL bound / bpc / perplexity of `pt.n_examples` evaluation sequences at depth L_s, and
    min(n_samples_kept, n_generate) unconditional samples at (T, L_s); writes evals and samples."""
    ev = ev_full.head(pt.n_examples)
    device = next(model.parameters()).device
    t_values = task.t_values()
    t0 = time.perf_counter()
    per_char = []
    bs = 64
    for i in range(0, len(ev), bs):
        x, c = ev.x0[i:i + bs].to(device), ev.cond[i:i + bs].to(device)
        nats = nll_bound(model, x, c, t_values, n_loops=pt.L_s, seed=pt.seed + i, precision=precision)
        per_char += (nats / (~c).sum(1).clamp(min=1).double().cpu()).tolist()
    n = len(per_char)
    nll = sum(per_char) / n
    sd = math.sqrt(sum((v - nll) ** 2 for v in per_char) / (n - 1)) if n > 1 else 0.0
    lo, hi = nll - 1.96 * sd / math.sqrt(n), nll + 1.96 * sd / math.sqrt(n)

    n_gen = min(run.eval.n_samples_kept, n_generate, len(ev))
    gen_out = None
    if n_gen > 0:
        x, c = ev.x0[:n_gen].to(device), ev.cond[:n_gen].to(device)
        gen_out = sample(model, x, c, T=pt.T, L_s=pt.L_s, unmask=pt.sampler, temperature=pt.temperature,
                         remask=pt.remask, seed=pt.seed, precision=precision).cpu()
    secs = time.perf_counter() - t0

    fwd = model.flops_per_forward(pt.L_s)
    n_t = len(t_values)
    base = {"run_id": run.run_id, "eval_key": pt.key, "T": pt.T, "L_s": pt.L_s, "sampler": pt.sampler,
            "split": pt.split, "eval_seconds": secs, "created_at": _now(),
            # the bound costs n_t forward passes of L_s loops per sequence, whatever T is
            "forward_passes": n_t * pt.L_s, "eval_flops": n_t * fwd * n}
    ln2 = math.log(2)
    rows = [
        {**base, "n_examples": n, "metric": "nll", "value": nll, "ci_low": lo, "ci_high": hi},
        {**base, "n_examples": n, "metric": "bpc", "value": nll / ln2, "ci_low": lo / ln2, "ci_high": hi / ln2},
        {**base, "n_examples": n, "metric": "ppl", "value": math.exp(nll), "ci_low": math.exp(lo),
         "ci_high": math.exp(hi)},
    ]
    samples = []
    if gen_out is not None:
        scores = task.score(gen_out, ev.head(n_gen))
        vals = [s["known_words"] for s in scores]
        m = sum(vals) / len(vals)
        rows.append({**base, "n_examples": len(vals), "metric": "known_words", "value": m, "ci_low": None,
                     "ci_high": None, "forward_passes": pt.T * pt.L_s, "eval_flops": pt.T * fwd * len(vals)})
        samples = [{"run_id": run.run_id, "eval_key": pt.key, "T": pt.T, "L_s": pt.L_s, "example": i,
                    "input": "", "output": task.render(gen_out[i]), "reference": task.render(ev.x0[i]),
                    "score": scores[i]["known_words"], "scores": json.dumps(scores[i])} for i in range(n_gen)]
    # samples first: an eval point counts as done only once its evals file exists
    store.write_rows("samples", samples, run.run_id, f"{pt.key}.parquet")
    store.write_rows("evals", rows, run.run_id, f"{pt.key}.parquet")
    return rows


# ---- external puzzles --------------------------------------------------------------------
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
    sd = torch.load(io.BytesIO(store.read_bytes(store.weights_path(run_id))), map_location=device,
                    weights_only=False)
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
    outs = []
    for i in range(0, len(x), 256):
        outs.append(sample(model, x[i:i + 256].to(dev), cond[i:i + 256].to(dev), T=T, L_s=L_s, unmask=sampler,
                           seed=seed + i).cpu())
    output = torch.cat(outs)
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
    fwd = model.flops_per_forward(L_s)
    rows, summary = [], {}
    for m in metrics:
        vals = [s[m] for s in scores]
        value = sum(vals) / n
        if all(v in (0.0, 1.0) for v in vals):
            lo, hi = wilson(sum(vals), n)
        else:
            sd = math.sqrt(sum((v - value) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
            lo, hi = value - 1.96 * sd / math.sqrt(n), value + 1.96 * sd / math.sqrt(n)
        summary[m] = (value, lo, hi)
        rows.append({"run_id": run_id, "eval_key": key, "T": T, "L_s": L_s, "sampler": sampler,
                     "split": f"external:{os.path.basename(puzzles)}", "n_examples": n, "metric": m, "value": value,
                     "ci_low": lo, "ci_high": hi, "forward_passes": T * L_s, "eval_flops": T * fwd * n,
                     "eval_seconds": secs, "created_at": _now()})
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
