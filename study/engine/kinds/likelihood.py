"""A grid's eval point of a likelihood task (text8: eval_mode 'likelihood'): the NLL bound per position of its
sequences in each unit the task's likelihood metrics declare, key `EvalPoint.key`; its generations are gen.py's.
Nothing is sampled: each sequence costs n_t x L_s block passes, and its text is a reference only."""
from __future__ import annotations

import math

from study.engine.kinds.base import Kind, register
from study.engine.rows import likelihood_cost, likelihood_rows


class Likelihood(Kind):
    name = "likelihood"

    def as_stored(self, v, task_name, kept, m) -> bool:
        v.underived.add("per-sequence likelihood bounds (recomputing them needs the model: `study eval`)")
        v.add("scores_as_stored", m)
        return True

    def metrics(self, task) -> set[str]:
        return {x.name for x in task.likelihood_metrics()}

    def label(self, pt) -> str:
        return pt.sampler

    def derive(self, v, path: str, r: dict, scores: list[dict], task) -> dict | None:
        """From the nats: each likelihood metric is the nats divided by its unit; its per-example scores'
        mean must be that (the contract)."""
        m, declared = r["metric"], {x.name: x for x in task.likelihood_metrics()}
        nats = next((x.name for x in declared.values() if x.likelihood == 1.0), None)
        if m not in declared or not all(nats in s for s in scores):
            return super().derive(v, path, r, scores, task)
        want = likelihood_rows([s[nats] for s in scores], {}, [declared[m]])[0]
        if m != nats and all(m in s for s in scores):
            mean = sum(s[m] for s in scores) / len(scores)
            if not math.isclose(mean, want["value"], rel_tol=1e-9, abs_tol=1e-9):
                v.problems.append(f"{path}: {m} per-example scores average {mean}, not {nats} / "
                                  f"{declared[m].likelihood:.6g} = {want['value']}")
        return want

    def cost(self, v, spath: str, model, rows: list[dict], srows: list[dict], pt, task) -> dict:
        n_t, L_s = len(task.t_values()), rows[0]["L_s"]
        for s in srows:
            if s["passes"] != n_t * L_s:
                v.problems.append(f"{spath} example {s['example']}: field passes is {s['passes']}, the bound runs "
                                  f"n_t x L_s = {n_t * L_s}")
                break
        return {**likelihood_cost(model, n_t, L_s, len(srows)), "forward_passes_mean": None}

    def evaluate(self, run_id: str, pt, model, task, ev, keep: int, precision: str) -> list:
        from study.engine.evaluate import evaluate_likelihood

        return evaluate_likelihood(run_id, pt, model, task, ev, keep, precision)


register(Likelihood())
