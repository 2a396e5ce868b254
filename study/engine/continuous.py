"""The continuous quantities of a run (issue 32): beside what the sampler scores, two likelihoods per example
that move while an all-or-nothing metric (VPR) sits at 0, for the two-step ladder law (analysis/ladder).

For each example of a split, at the run's trained depth L_t (the final loop):
- `elbo`: the masked-diffusion NLL bound (model/elbo.py) of its blanks (the positions not given), in nats per
  blank: Monte-Carlo over N_T stratified noise levels t with one mask per t, drawn by a generator of its own
  seeded from the run id and the split (`nll_seed`), never the global RNG;
- `ref_nll`: the reference's NLL per blank at the puzzle's own mask: every blank masked, one forward pass,
  the cross-entropy of the reference tokens averaged over the blanks (no randomness at all).

Stored as one eval point per split (eval key `nll-test` / `nll-val`, `NLL_KEYS`): evals rows `elbo` and
`ref_nll` (the mean over the examples and its 95% Student t interval over examples), T = 0, L_s = L_t,
sampler 'likelihood'; samples rows per example with both values in `scores` (no text: nothing is
generated), so `study verify` derives each evals row again and `--deep` recomputes them from the weights.
A likelihood-scored task (text8: eval_mode 'likelihood') already stores its NLL bound: it gets none.

Checkpoints score the same two on the `eval.at_checkpoints` validation examples (history `val` keys
`val_elbo`, `val_ref_nll`). Nothing here reads or advances the global torch, numpy or python RNG, so the
trained weights and every other number are the same with or without them.
"""
from __future__ import annotations

import hashlib
import json
import time

import torch
import torch.nn.functional as F

from model import RecursiveDenoiser
from model.elbo import nll_bound
from model.precision import autocast
from study.engine.evaluate import EvalRow, Evaluation, SampleRow, now, write
from study.engine.nllrows import N_T, NLL_KEYS, NLL_METRICS, SAMPLER, nll_cost, nll_rows  # noqa: F401 (re-exported)
from tasks import SPLITS, DataBoundError

BATCH = 64  # examples per model call


def nll_seed(run_id: str, split: str) -> int:
    """The seed of a split's ELBO masks: from the run and the split only (the same at every call)."""
    return int(hashlib.sha256(f"{run_id}/{split}/elbo".encode()).hexdigest()[:8], 16)


def t_values(n_t: int = N_T) -> torch.Tensor:
    """The stratified noise levels of the ELBO: the midpoints of n_t equal bins of (0, 1]."""
    return (torch.arange(n_t, dtype=torch.float64) + 0.5) / n_t


@torch.no_grad()
def ref_nll(model: RecursiveDenoiser, x0: torch.Tensor, cond: torch.Tensor, n_loops: int,
            precision: str = "float32") -> torch.Tensor:
    """(B,) the reference's NLL per blank with every blank masked: one forward pass at `n_loops` loops."""
    model.eval()
    B, N = x0.shape
    blank = ~cond
    xt = torch.where(blank, torch.full_like(x0, model.spec.mask_id), x0)
    with autocast(x0.device, precision):
        logits = model(xt, n_loops=n_loops, all_logits=False)[-1].float()
    ce = F.cross_entropy(logits.reshape(B * N, -1), x0.reshape(-1), reduction="none").view(B, N)
    return ((ce * blank).sum(1).double() / blank.sum(1).clamp(min=1).double()).cpu()


def example_values(model: RecursiveDenoiser, x0: torch.Tensor, cond: torch.Tensor, n_loops: int, seed: int,
                   precision: str = "float32") -> list[dict[str, float]]:
    """Per example, {'elbo', 'ref_nll'} in nats per blank (see the module docstring)."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(x0), BATCH):
        x, c = x0[i:i + BATCH].to(device), cond[i:i + BATCH].to(device)
        nats = nll_bound(model, x, c, t_values(), n_loops=n_loops, seed=seed + i, precision=precision)
        elbo = nats / (~c).sum(1).clamp(min=1).double().cpu()
        ref = ref_nll(model, x, c, n_loops, precision)
        out += [{"elbo": float(e), "ref_nll": float(r)} for e, r in zip(elbo.tolist(), ref.tolist())]
    return out


def evaluate_nll(model: RecursiveDenoiser, run_id: str, split: str, ev, n_loops: int,
                 precision: str = "float32"):
    """The `nll-<split>` point of a run on the examples of `ev`: its Evaluation (evals and samples rows)."""
    key = NLL_KEYS[split]
    t0 = time.perf_counter()
    scores = example_values(model, ev.x0, ev.cond, n_loops, nll_seed(run_id, split), precision)
    base = {"run_id": run_id, "eval_key": key, "T": 0, "L_s": n_loops, "sampler": SAMPLER, "split": split,
            "eval_seconds": time.perf_counter() - t0, "created_at": now(), "kind": "nll", **nll_cost(model, n_loops, len(scores))}
    passes = base["forward_passes"]
    samples = [SampleRow(run_id, key, 0, n_loops, example=i, input=None, output=None, reference=None,
                         score=s["elbo"], scores=json.dumps(s), passes=passes, steps=None)
               for i, s in enumerate(scores)]
    return Evaluation(key, [EvalRow(**r) for r in nll_rows(scores, base)], samples, scores)


def checkpoint_values(model: RecursiveDenoiser, run_id: str, ev, n_loops: int,
                      precision: str = "float32") -> dict[str, float]:
    """A checkpoint's history keys `val_elbo` and `val_ref_nll`: the means over the validation examples `ev`."""
    scores = example_values(model, ev.x0, ev.cond, n_loops, nll_seed(run_id, "val"), precision)
    return {f"val_{m}": sum(s[m] for s in scores) / len(scores) for m in NLL_METRICS}


def scored(task) -> bool:
    """Whether a task's runs get these points: a sample-and-score task (a likelihood task has its own)."""
    return task.eval_mode == "sample"


def evaluate_run(run, task, model: RecursiveDenoiser, store, done: set[str], eval_set, precision: str = "float32",
                 log=lambda msg: None) -> list[str]:
    """Write each split's `nll-<split>` point of a run that `done` (its eval keys already stored) lacks, on the
    first eval.n_examples examples of `eval_set(split)`; returns the keys written. None for a likelihood task.
    The splits: validation, and test unless the run is evaluated on validation (a search's trial: its
    selection never reads the test split); validation only where the task's data can hold it beside train
    and test (a small 4x4 Sudoku may not: then it is left out and said in the log)."""
    if not scored(task):
        return []
    wrote, own = [], task.cfg.split_of(run.eval.split)
    for split in [s for s in SPLITS if s == "val" or own == s]:
        key = NLL_KEYS[split]
        if key in done:
            continue
        if split != own:
            try:
                task.check_data((own, split))
            except DataBoundError as e:
                log(f"{key} left out: {e}")
                continue
        ev = eval_set(split).head(run.eval.n_examples)
        write(store, run.run_id, evaluate_nll(model, run.run_id, split, ev, run.model.L, precision))
        log(f"evaluated {key}")
        wrote.append(key)
    return wrote
