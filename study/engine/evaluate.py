"""The one evaluation path: sample a model on examples, score the outputs with the task, and build the
`evals` and `samples` rows the store keeps (typed: `EvalRow`, `SampleRow`; columns: docs/guide/schema.md).

`evaluate` samples and scores; every caller goes through it: a run's eval points (by their kind:
study/engine/kinds, study.engine.trial.evaluate_point), the generations of a likelihood point, `study eval
--puzzles` (study/commands/puzzles.py, a chunk of the file at a time) and a search's scores
(study/engine/tune.py, nothing written). A likelihood point (`evaluate_likelihood`) stores the NLL bound per
position in each unit its task's likelihood metrics declare, under `<key>`, and a few unconditional
generations under `<key>-gen`. `forward_passes` keeps the store's one meaning, block passes per example
(docs/DESIGN.md): the NLL bound calls the model once per noise level, so its rows say n_t * L_s whatever T is.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model.precision import autocast
from model.rmdm import RecursiveDenoiser, Sampled, sample_all
from model.train import nll_bound
from store import Store, digest
from study.engine.rows import (GEN_SUFFIX, N_T, NLL_KEYS, NLL_METRICS, NLL_SAMPLER, likelihood_cost,  # noqa: F401
                               likelihood_rows, metric_rows, nll_cost, nll_rows, now, passes_cost)
from study.spec.grid import EvalPoint, Run
from study.spec.sections import N_GENERATE
from tasks import SPLITS, DataBoundError, EvalSet

NLL_BATCH = 64  # sequences per call of the NLL bound (and of the continuous quantities)


@dataclass(slots=True)
class EvalRow:
    """One row of the evals table (store.EVALS): one metric of one evaluation point."""

    run_id: str
    eval_key: str
    T: int
    L_s: int
    sampler: str  # the unmasking rule; `confidence+adaptive(0.9)` for adaptive depth (L_s is then its cap)
    split: str
    n_examples: int
    metric: str
    value: float
    ci_low: float | None
    ci_high: float | None
    forward_passes: int  # block passes per example: the most any example ran
    eval_flops: int
    eval_seconds: float
    created_at: dt.datetime
    forward_passes_mean: float | None  # block passes per example, the mean over examples (None: likelihood)
    kind: str  # the evaluation kind (study/engine/kinds) whose rules made it
    weights_sha256: str | None = None  # of the weights scored (set by write)
    point_sha256: str | None = None  # of the point's rows (set by Store.write_rows)


@dataclass(slots=True)
class SampleRow:
    """One row of the samples table (store.SAMPLES): one evaluated example."""

    run_id: str
    eval_key: str
    T: int
    L_s: int
    example: int
    input: str | None  # the texts: for the first n_samples_kept examples only
    output: str | None
    reference: str | None
    score: float  # the primary metric
    scores: str  # JSON of every metric's score of this example
    passes: int  # block passes it ran
    steps: int | None  # denoising steps it ran (None for a likelihood score)


@dataclass
class Evaluation:
    """The rows of one eval key (and what they were made of: per-example scores, the sampler's output)."""

    key: str
    evals: list[EvalRow]
    samples: list[SampleRow]
    scores: list[dict[str, float]]
    got: Sampled | None = None
    seconds: float = 0.0  # sampling time (the NLL bound's too for a likelihood point)


def evaluate(model: RecursiveDenoiser, task, pt: EvalPoint, ev: EvalSet, run_id: str, *, keep: int,
             precision: str = "float32", key: str | None = None, split: str | None = None,
             inputs: torch.Tensor | None = None, reference: bool = True, start: int = 0,
             metrics: tuple[str, ...] | None = None, primary: str | None = None, kind: str = "sample") -> Evaluation:
    """Sample the examples of `ev` as `pt` says, score the outputs against `ev`, and build their rows.

    inputs: what the sampler is given where it is not ev.x0 (only the `ev.cond` positions are read);
    reference: whether the samples rows keep ev.x0 as the examples' reference text; start: the number
    of the first example (a chunk of a longer file: the sampler's seed is pt.seed + start, so chunking
    never changes an output); metrics: the evals rows' metrics (default the task's), and then the only
    per-example scores kept; key and split default to pt's; keep: examples whose text is kept; kind: the
    rows' evaluation kind."""
    x = ev.x0 if inputs is None else inputs
    t0 = time.perf_counter()
    got = sample_all(model, x, ev.cond, T=pt.T, L_s=pt.L_s, unmask=pt.sampler, temperature=pt.temperature,
                     remask=pt.remask, seed=pt.seed + start, precision=precision, adaptive=pt.adaptive)
    seconds = time.perf_counter() - t0
    scores = task.score(got.x, ev)
    if metrics is not None:
        scores = [{m: s[m] for m in metrics} for s in scores]
    key = key or pt.key
    base = {"run_id": run_id, "eval_key": key, "T": pt.T, "L_s": pt.L_s, "sampler": pt.label,
            "split": split or pt.split, "eval_seconds": seconds, "created_at": now(), "kind": kind,
            **passes_cost(model, got.passes.tolist(), got.head_calls)}
    evals = [EvalRow(**r) for r in metric_rows(scores, metrics or task.metric_names, base, task)]
    samples = sample_rows(run_id, key, pt, task, x, ev.cond, got, ev.x0 if reference else None, scores, keep,
                          start, primary or task.primary_metric)
    return Evaluation(key, evals, samples, scores, got, seconds)


def checkpoint_scores(run: Run, model: RecursiveDenoiser, task, ev_val: EvalSet,
                      precision: str = "float32") -> dict[str, float]:
    """The training curves' metric at a checkpoint: the task's primary metric on the first
    `eval.at_checkpoints` validation examples, at every evaluated T with L_s = L_t and the run's first
    sampler, keyed 'val_<metric>_T<T>' (a name MLflow and TensorBoard accept). Nothing is stored as an
    evaluation: these are the history's. Sampling seeds its own generator and training re-seeds its RNG
    and sets train mode every step, so the trained weights are the same with or without them."""
    ev = ev_val.head(run.eval.at_checkpoints)
    metric = task.primary_metric
    out = {}
    for T in run.eval.T:
        pt = EvalPoint(T=T, L_s=run.model.L, sampler=run.eval.sampler[0], temperature=run.eval.temperature,
                       remask=run.eval.remask, n_examples=len(ev), split="val", seed=run.eval.seed)
        e = evaluate(model, task, pt, ev, run.run_id, keep=0, precision=precision, metrics=(metric,))
        out[f"val_{metric}_T{T}"] = e.evals[0].value
    return out


def write(store: Store, run_id: str, e: Evaluation) -> None:
    """Samples first: an eval point counts as done only once its evals file exists. Its evals rows record the
    digest of the run's final weights as stored (those scored): `study verify` compares it with the runs row's."""
    weights = digest.weights_sha256(store, run_id)
    for r in e.evals:
        r.weights_sha256 = weights
    store.write_rows("samples", e.samples, run_id, f"{e.key}.parquet")
    store.write_rows("evals", e.evals, run_id, f"{e.key}.parquet")


def evaluate_likelihood(run_id: str, pt: EvalPoint, model: RecursiveDenoiser, task, ev: EvalSet, keep: int,
                        precision: str = "float32", n_generate: int = N_GENERATE) -> list[Evaluation]:
    """NLL bound / bpc of the sequences of `ev` at depth L_s, and min(keep, n_generate) unconditional
    samples at (T, L_s): the point's generations (when any) then the point itself, in the order they
    are written (see the module docstring for the two keys)."""
    t_values = task.t_values()
    t0 = time.perf_counter()
    per_char = [v for _, _, nll in nll_batches(model, ev.x0, ev.cond, t_values, pt.L_s, pt.seed, precision)
                for v in nll]
    seconds = time.perf_counter() - t0
    n, n_t = len(per_char), len(t_values)
    n_gen = min(keep, n_generate, len(ev))
    gen = None
    if n_gen > 0:
        # fixed depth whatever the point says: its rows' sampler is the unmasking rule
        gen = evaluate(model, task, dataclasses.replace(pt, adaptive=None), ev.head(n_gen), run_id, keep=n_gen,
                       precision=precision, key=pt.key + GEN_SUFFIX, metrics=("known_words",), primary="known_words", kind="gen")
        seconds += gen.seconds
    base = {"run_id": run_id, "eval_key": pt.key, "T": pt.T, "L_s": pt.L_s, "sampler": pt.sampler,
            "split": pt.split, "eval_seconds": seconds, "created_at": now(), "forward_passes_mean": None, "kind": "likelihood",
            **likelihood_cost(model, n_t, pt.L_s, n)}
    metrics, shown = task.likelihood_metrics(), task.sample_score or task.primary_metric
    scores = [{m.name: v / m.likelihood for m in metrics} for v in per_char]
    point = Evaluation(pt.key, [EvalRow(**r) for r in likelihood_rows(per_char, base, metrics)], [
        SampleRow(run_id, pt.key, pt.T, pt.L_s, example=i, input=None, output=None,
                  reference=task.render(ev.x0[i]) if i < keep else None, score=sc[shown],
                  scores=json.dumps(sc), passes=n_t * pt.L_s, steps=None)
        for i, sc in enumerate(scores)], scores)
    if gen is None:
        return [point]
    # the generations' known_words carry no interval, the point's timing, and nothing as their input
    gen.evals = [dataclasses.replace(r, ci_low=None, ci_high=None, eval_seconds=seconds,
                                     created_at=base["created_at"]) for r in gen.evals]
    for r in gen.samples:
        r.input = ""
    return [gen, point]


def nll_batches(model: RecursiveDenoiser, x0: torch.Tensor, cond: torch.Tensor, t: torch.Tensor, n_loops: int,
                seed: int, precision: str):
    """Per batch of NLL_BATCH sequences (the batch at i seeded seed + i): its (x, cond) on the model's device and
    the NLL bound of each sequence per position not given, in nats."""
    device = next(model.parameters()).device
    for i in range(0, len(x0), NLL_BATCH):
        x, c = x0[i:i + NLL_BATCH].to(device), cond[i:i + NLL_BATCH].to(device)
        nats = nll_bound(model, x, c, t, n_loops=n_loops, seed=seed + i, precision=precision)
        yield x, c, (nats / (~c).sum(1).clamp(min=1).double().cpu()).tolist()


def sample_rows(run_id: str, key: str, pt: EvalPoint, task, x, cond, got: Sampled, ref, scores: list[dict],
                keep: int, start: int, primary: str) -> list[SampleRow]:
    """One samples row per evaluated example (number `start` + i): its per-metric scores and its cost
    (block passes, denoising steps) always; its input, output and reference text for the first `keep`
    examples only (null beyond), so every evals value can be derived again from the rows."""
    passes, steps = got.passes.tolist(), got.steps.tolist()
    return [SampleRow(run_id, key, pt.T, pt.L_s, example=start + i,
                      input=task.render(x[i], cond[i]) if i < keep else None,
                      output=task.render(got.x[i]) if i < keep else None,
                      reference=task.render(ref[i]) if i < keep and ref is not None else None,
                      score=s[primary], scores=json.dumps(s), passes=int(passes[i]), steps=int(steps[i]))
            for i, s in enumerate(scores)]


# ---- the continuous quantities ------------------------------------------------------------------
# The continuous quantities of a run (issue 32): beside what the sampler scores, two likelihoods per example
# that move while an all-or-nothing metric (VPR) sits at 0, for the two-step ladder law (analysis/ladder).
#
# For each example of a split, at the run's trained depth L_t (the final loop):
# - `elbo`: the masked-diffusion NLL bound (model/train.py) of its blanks (the positions not given), in nats per
#   blank: Monte-Carlo over N_T stratified noise levels t with one mask per t, drawn by a generator of its own
#   seeded from the run id and the split (`nll_seed`), never the global RNG;
# - `ref_nll`: the reference's NLL per blank at the puzzle's own mask: every blank masked, one forward pass,
#   the cross-entropy of the reference tokens averaged over the blanks (no randomness at all).
#
# Stored as one eval point per split (eval key `nll-test` / `nll-val`, `NLL_KEYS`): evals rows `elbo` and
# `ref_nll` (the mean over the examples and its 95% Student t interval over examples), T = 0, L_s = L_t,
# sampler 'likelihood'; samples rows per example with both values in `scores` (no text: nothing is
# generated), so `study verify` derives each evals row again and `--deep` recomputes them from the weights.
# A likelihood-scored task (text8: eval_mode 'likelihood') already stores its NLL bound: it gets none.
#
# Checkpoints score the same two on the `eval.at_checkpoints` validation examples (history `val` keys
# `val_elbo`, `val_ref_nll`). Nothing here reads or advances the global torch, numpy or python RNG, so the
# trained weights and every other number are the same with or without them.


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
    """Per example, {'elbo', 'ref_nll'} in nats per blank (see the section's head)."""
    out = []
    for x, c, elbo in nll_batches(model, x0, cond, t_values(), n_loops, seed, precision):
        ref = ref_nll(model, x, c, n_loops, precision)
        out += [{"elbo": float(e), "ref_nll": float(r)} for e, r in zip(elbo, ref.tolist())]
    return out


def evaluate_nll(model: RecursiveDenoiser, run_id: str, split: str, ev, n_loops: int,
                 precision: str = "float32"):
    """The `nll-<split>` point of a run on the examples of `ev`: its Evaluation (evals and samples rows)."""
    key = NLL_KEYS[split]
    t0 = time.perf_counter()
    scores = example_values(model, ev.x0, ev.cond, n_loops, nll_seed(run_id, split), precision)
    base = {"run_id": run_id, "eval_key": key, "T": 0, "L_s": n_loops, "sampler": NLL_SAMPLER, "split": split,
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
