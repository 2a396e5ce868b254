"""The one evaluation path: sample a model on examples, score the outputs with the task, and build
the `evals` and `samples` rows the store keeps (typed: `EvalRow`, `SampleRow`).

`evaluate` samples and scores; every caller goes through it: a run's eval points (study.engine.kinds.evaluate_point,
called by study.engine.trial), the generations of a likelihood point, `study eval --puzzles` (study/commands/puzzles.py,
a chunk of the file at a time) and a search's scores (study/engine/tune.py, nothing written).

A task's `eval_mode` names the evaluation kind of its points (study/engine/kinds):
- 'sample': `evaluate` on the point's examples; one evals row per metric of the task, each the mean
  of the samples rows' per-example scores (95% interval: Wilson for 0/1 scores, else normal), and a
  samples row per example: its scores and cost (block passes, denoising steps), its text for the
  first `eval.n_samples_kept` examples only.
- 'likelihood': the NLL bound per position of the evaluation sequences in each unit the task's likelihood
  metrics declare (Metric.likelihood: nats, bits), and a few unconditional samples (T steps, L_s loops)
  for a look. Two eval keys per point: `<key>`: one evals row per likelihood metric; samples, one row
  per evaluated sequence, `scores` = {metric: its NLL bound per position in that metric's unit},
  `score` = the task's `sample_score` of them, `reference` = its text for the first n_samples_kept
  sequences (input and output null: nothing is generated). A transform of the mean that is not a mean
  itself (a perplexity, exp of the nats) is a derived metric (Metric.stored False): the analysis's.
  `<key>-gen` (when any sample is kept): the evals row known_words of min(n_samples_kept, 16)
  unconditional generations (no interval), and their samples rows (text, scores, cost).

`forward_passes` keeps the store's one meaning, block passes per example (a model call at L_s loops
is L_s of them; see model/sampler.py): the most any example ran when sampling; the NLL bound calls
the model once per noise level, so its rows say n_t * L_s whatever T is.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from dataclasses import dataclass

import torch

from model import RecursiveDenoiser
from model.elbo import nll_bound
from model.sampler import Sampled, sample_all
from store import Store, digest
from study.engine.rows import (GEN_SUFFIX, likelihood_cost, likelihood_rows, metric_rows, now,  # noqa: F401
                               passes_cost)
from study.spec.grid import EvalPoint, Run
from study.spec.sections import N_GENERATE
from tasks import EvalSet

NLL_BATCH = 64  # sequences per call of the NLL bound


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
            **sampling_cost(model, got)}
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
    device = next(model.parameters()).device
    t_values = task.t_values()
    t0 = time.perf_counter()
    per_char = []
    for i in range(0, len(ev), NLL_BATCH):
        x, c = ev.x0[i:i + NLL_BATCH].to(device), ev.cond[i:i + NLL_BATCH].to(device)
        nats = nll_bound(model, x, c, t_values, n_loops=pt.L_s, seed=pt.seed + i, precision=precision)
        per_char += (nats / (~c).sum(1).clamp(min=1).double().cpu()).tolist()
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


def sampling_cost(model: RecursiveDenoiser, got: Sampled) -> dict:
    """forward_passes (the most any example ran), forward_passes_mean and eval_flops of a sampling
    eval, from the steps and loops the sampler actually ran (it stops once nothing is masked, so a T
    above the number of blanks costs less than T * L_s; adaptive depth stops looping once settled).
    eval_flops: every block pass, plus the head each time it read predictions."""
    return passes_cost(model, got.passes.tolist(), got.head_calls)

