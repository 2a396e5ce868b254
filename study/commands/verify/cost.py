"""The evaluation cost: forward_passes, forward_passes_mean and eval_flops derived again from the per-example
passes and steps."""
from __future__ import annotations

from study.commands.verify.context import Verdict, same
from study.spec.grid import Run


class _Counted:
    """What `passes_cost` / `likelihood_cost` read of a model, its FLOP counting, without building one:
    RecursiveDenoiser.flops_per_forward is model.costs.flops_per_forward of its config and sequence spec."""

    def __init__(self, run: Run, task):
        self.cfg, self.seq_len, self.vocab = run.model, len(task.pos_ids()), task.vocab_size

    def flops_per_forward(self, n_loops: int | None = None, heads: int = 1) -> int:
        from model.costs import flops_per_forward

        return flops_per_forward(self.cfg, self.seq_len, self.vocab, n_loops, heads)


def check_cost(v: Verdict, path: str, spath: str, rows: list[dict], srows: list[dict], kind, pt, run, task):
    """forward_passes, forward_passes_mean and eval_flops derived again from the per-example cost, by its kind's rule."""
    if run is None:
        v.underived.add("evaluation cost of runs whose config is unusable")
        return
    want = kind.cost(v, spath, _Counted(run, task), rows, srows, pt, task)
    for r in rows if want is not None else ():
        for fld in ("forward_passes", "eval_flops", "forward_passes_mean"):
            if not same(r[fld], want[fld]):
                v.problems.append(f"{path}: field {fld} of {r['metric']} is {r[fld]} but the per-example cost in "
                                  f"{spath} gives {want[fld]}")
