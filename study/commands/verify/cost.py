"""The evaluation cost: forward_passes, forward_passes_mean and eval_flops derived again from the per-example
passes and steps."""
from __future__ import annotations

from study.commands.verify.context import Verdict, same
from study.spec.grid import Run


class _Counted:
    """What `sampling_cost` / `likelihood_cost` read of a model, its FLOP counting, without building one:
    RecursiveDenoiser.flops_per_forward is model.flops.flops_per_forward of its config and sequence spec."""

    def __init__(self, run: Run, task):
        self.cfg, self.seq_len, self.vocab = run.model, len(task.pos_ids()), task.vocab_size

    def flops_per_forward(self, n_loops: int | None = None, heads: int = 1) -> int:
        from model.flops import flops_per_forward

        return flops_per_forward(self.cfg, self.seq_len, self.vocab, n_loops, heads)


def _meta_model(run: Run, task) -> _Counted:
    return _Counted(run, task)


def check_cost(v: Verdict, path: str, spath: str, rows: list[dict], srows: list[dict], kind: str, pt, run, task):
    """forward_passes, forward_passes_mean and eval_flops derived again from the per-example cost."""
    if run is None:
        v.underived.add("evaluation cost of runs whose config is unusable")
        return
    model = _meta_model(run, task)
    if kind == "nll":
        from study.engine.nllrows import nll_cost

        want = nll_cost(model, rows[0]["L_s"], len(srows))
        if any(s["passes"] != want["forward_passes"] for s in srows):
            v.problems.append(f"{spath}: field passes differs from (n_t + 1) x L_s = {want['forward_passes']}")
    elif kind == "likelihood":
        from study.engine.rows import likelihood_cost

        n_t = len(task.t_values())
        want = likelihood_cost(model, n_t, rows[0]["L_s"], len(srows))
        want["forward_passes_mean"] = None
        for s in srows:
            if s["passes"] != n_t * rows[0]["L_s"]:
                v.problems.append(f"{spath} example {s['example']}: field passes is {s['passes']}, the bound runs "
                                  f"n_t x L_s = {n_t * rows[0]['L_s']}")
                break
    else:
        from study.engine.rows import passes_cost  # sampling_cost's rule, on the per-example lists: no torch

        if any(s["passes"] is None or s["steps"] is None for s in srows):
            v.problems.append(f"{spath}: per-example passes or steps missing: the evaluation cost cannot be derived")
            return
        adaptive = pt.adaptive if pt is not None and kind != "ext" else None
        L_s = rows[0]["L_s"]
        if adaptive is None:
            for s in srows:
                if s["passes"] != s["steps"] * L_s:
                    v.problems.append(f"{spath} example {s['example']}: field passes is {s['passes']} but "
                                      f"{s['steps']} steps at L_s = {L_s} run {s['steps'] * L_s}")
                    break
            if pt is not None and any(s["steps"] > pt.T for s in srows):
                v.problems.append(f"{spath}: field steps exceeds T = {pt.T}")
            # model.sampler.Sampled at fixed depth: passes = steps x L_s, the head once per step
            passes, heads = [s["steps"] * L_s for s in srows], sum(s["steps"] for s in srows)
        else:  # adaptive: the loops each example ran, the head after every loop
            passes = [s["passes"] for s in srows]
            heads = sum(passes)
        want = passes_cost(model, passes, heads)
    for r in rows:
        if kind == "likelihood" and task.metric_of(r["metric"]) is None:
            continue  # an older store's generations row inside the likelihood point
        for fld in ("forward_passes", "eval_flops", "forward_passes_mean"):
            if fld == "forward_passes_mean" and (r[fld] is None and want[fld] is None):
                continue
            if not same(r[fld], want[fld]):
                v.problems.append(f"{path}: field {fld} of {r['metric']} is {r[fld]} but the per-example cost in "
                                  f"{spath} gives {want[fld]}")
