"""The continuous quantities' rows and cost (study/engine/continuous.py scores them), without torch: what
`study verify` re-derives them with."""
from __future__ import annotations

from stats import t_ci

NLL_KEYS = {"test": "nll-test", "val": "nll-val"}  # eval key of each split's point
NLL_METRICS = ("elbo", "ref_nll")
SAMPLER = "likelihood"  # the rows' sampler column: nothing is sampled
N_T = 8  # noise levels of the ELBO estimate


def nll_cost(model, n_loops: int, n: int, n_t: int = N_T) -> dict:
    """forward_passes (block passes per example: n_t ELBO calls and the reference's one, L_t loops each) and
    eval_flops of n examples."""
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
