"""Likelihood-scored evaluation (Text8): `study.trial.evaluate_point` for a task whose
`eval_mode` is "likelihood". It writes the NLL bound per character (nats), bits per character
and perplexity, and a few unconditional samples (T steps, L_s loops) for a look.

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
from study.trial import now, sampling_cost
from tasks import EvalSet


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
    nll, lo, hi = mean_ci(per_char)

    n_gen = min(run.eval.n_samples_kept, n_generate, len(ev))
    got = None
    if n_gen > 0:
        got = sample_all(model, ev.x0[:n_gen], ev.cond[:n_gen], T=pt.T, L_s=pt.L_s, unmask=pt.sampler,
                         temperature=pt.temperature, remask=pt.remask, seed=pt.seed, precision=precision)
    secs = time.perf_counter() - t0

    fwd = model.flops_per_forward(pt.L_s)
    n_t = len(t_values)
    base = {"run_id": run.run_id, "eval_key": pt.key, "T": pt.T, "L_s": pt.L_s, "sampler": pt.sampler,
            "split": pt.split, "eval_seconds": secs, "created_at": now(),
            # the bound calls the model once per noise level (L_s loops each) per sequence, whatever T is
            "forward_passes": n_t * pt.L_s, "eval_flops": n_t * fwd * n}
    ln2 = math.log(2)
    rows = [
        {**base, "n_examples": n, "metric": "nll", "value": nll, "ci_low": lo, "ci_high": hi},
        {**base, "n_examples": n, "metric": "bpc", "value": nll / ln2, "ci_low": lo / ln2, "ci_high": hi / ln2},
        {**base, "n_examples": n, "metric": "ppl", "value": math.exp(nll), "ci_low": math.exp(lo),
         "ci_high": math.exp(hi)},
    ]
    samples = []
    if got is not None:
        gen_out = got.x
        scores = task.score(gen_out, ev.head(n_gen))
        vals = [s["known_words"] for s in scores]
        m = sum(vals) / len(vals)
        rows.append({**base, "n_examples": len(vals), "metric": "known_words", "value": m, "ci_low": None,
                     "ci_high": None, **sampling_cost(model, got)})
        samples = [{"run_id": run.run_id, "eval_key": pt.key, "T": pt.T, "L_s": pt.L_s, "example": i,
                    "input": "", "output": task.render(gen_out[i]), "reference": task.render(ev.x0[i]),
                    "score": scores[i]["known_words"], "scores": json.dumps(scores[i])} for i in range(n_gen)]
    # samples first: an eval point counts as done only once its evals file exists
    store.write_rows("samples", samples, run.run_id, f"{pt.key}.parquet")
    store.write_rows("evals", rows, run.run_id, f"{pt.key}.parquet")
    return rows
