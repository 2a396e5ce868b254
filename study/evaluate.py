"""Likelihood-scored evaluation (Text8): `study.trial.evaluate_point` for a task whose
`eval_mode` is "likelihood". It writes the NLL bound per character (nats) and bits per character
of the evaluation sequences, and a few unconditional samples (T steps, L_s loops) for a look.

Two eval keys per point, so every evals value is the mean of its samples rows' per-example scores:
- `<key>` (the grid's point): evals rows nll and bpc; samples, one row per evaluated sequence,
  `scores` = {"nll": its NLL bound per character, "bpc": that / ln 2}, `reference` = its text for
  the first n_samples_kept sequences (input and output null: nothing is generated). Perplexity is
  exp(nll), a transform of the mean and not a mean itself: the analysis derives it from nll.
- `<key>-gen` (when any sample is kept): the evals row known_words of min(n_samples_kept, 16)
  unconditional generations, and their samples rows (text, scores, cost).

`forward_passes` keeps the store's one meaning, block passes per example (a model call at L_s
loops is L_s of them; see model/sampler.py): the NLL bound calls the model once per noise level,
so its rows say n_t * L_s whatever T is; the `known_words` row of the generated samples says
the steps the sampler actually ran times L_s.
(`study eval --puzzles`, external puzzle files, is study/puzzles.py.)
"""
from __future__ import annotations

import json
import math
import time

from model import RecursiveDenoiser
from model.elbo import nll_bound
from model.sampler import sample_all
from store import Store
from stats import mean_ci
from study.trial import now, sample_rows, sampling_cost
from tasks import EvalSet


GEN_SUFFIX = "-gen"  # eval key of a likelihood point's unconditional generations: `<key>-gen`


def likelihood_cost(model: RecursiveDenoiser, n_t: int, L_s: int, n: int) -> dict:
    """forward_passes / eval_flops of the NLL bound of n sequences: once per noise level (L_s loops each)
    per sequence, whatever T is."""
    return {"forward_passes": n_t * L_s, "eval_flops": n_t * model.flops_per_forward(L_s) * n}


def likelihood_rows(per_char: list[float], base: dict) -> list[dict]:
    """The evals rows nll and bpc of per-sequence NLL bounds (nats per character): their mean and its
    normal 95% interval (bpc: the same in bits)."""
    n = len(per_char)
    nll, lo, hi = mean_ci(per_char)
    ln2 = math.log(2)
    return [{**base, "n_examples": n, "metric": "nll", "value": nll, "ci_low": lo, "ci_high": hi},
            {**base, "n_examples": n, "metric": "bpc", "value": nll / ln2, "ci_low": lo / ln2, "ci_high": hi / ln2}]


def evaluate_likelihood(run, pt, model: RecursiveDenoiser, task, ev_full: EvalSet, store: Store,
                        precision: str = "float32", n_generate: int = 16) -> list[dict]:
    """NLL bound / bpc of `pt.n_examples` evaluation sequences at depth L_s, and
    min(n_samples_kept, n_generate) unconditional samples at (T, L_s); writes evals and samples
    (see the module docstring for the two keys). Returns the evals rows of both."""
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

    n_gen = min(run.eval.n_samples_kept, n_generate, len(ev))
    got = None
    if n_gen > 0:
        got = sample_all(model, ev.x0[:n_gen], ev.cond[:n_gen], T=pt.T, L_s=pt.L_s, unmask=pt.sampler,
                         temperature=pt.temperature, remask=pt.remask, seed=pt.seed, precision=precision)
    secs = time.perf_counter() - t0

    n_t = len(t_values)
    base = {"run_id": run.run_id, "eval_key": pt.key, "T": pt.T, "L_s": pt.L_s, "sampler": pt.sampler,
            "split": pt.split, "eval_seconds": secs, "created_at": now(), **likelihood_cost(model, n_t, pt.L_s, n)}
    rows = likelihood_rows(per_char, base)
    ln2 = math.log(2)
    keep = min(run.eval.n_samples_kept, n)
    samples = [{"run_id": run.run_id, "eval_key": pt.key, "T": pt.T, "L_s": pt.L_s, "example": i,
                "input": None, "output": None, "reference": task.render(ev.x0[i]) if i < keep else None,
                "score": v / ln2, "scores": json.dumps({"nll": v, "bpc": v / ln2}), "passes": n_t * pt.L_s,
                "steps": None} for i, v in enumerate(per_char)]
    gen_rows = []
    if got is not None:
        gen_key = pt.key + GEN_SUFFIX
        gen_out = got.x
        scores = task.score(gen_out, ev.head(n_gen))
        vals = [s["known_words"] for s in scores]
        gen_rows = [{**base, "eval_key": gen_key, "n_examples": len(vals), "metric": "known_words",
                     "value": sum(vals) / len(vals), "ci_low": None, "ci_high": None, **sampling_cost(model, got)}]
        gen_samples = sample_rows(run.run_id, gen_key, pt.T, pt.L_s, task, ev.x0, ev.cond, gen_out, ev.x0, scores,
                                  got, keep=n_gen, primary="known_words")
        for r in gen_samples:
            r["input"] = ""  # unconditional: nothing given
        store.write_rows("samples", gen_samples, run.run_id, f"{gen_key}.parquet")
        store.write_rows("evals", gen_rows, run.run_id, f"{gen_key}.parquet")
    # samples first: an eval point counts as done only once its evals file exists (the generations before it)
    store.write_rows("samples", samples, run.run_id, f"{pt.key}.parquet")
    store.write_rows("evals", rows, run.run_id, f"{pt.key}.parquet")
    return rows + gen_rows
