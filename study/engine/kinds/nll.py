"""The continuous quantities of a run (study.engine.evaluate.evaluate_nll scores them): key `nll-<split>`, evals rows
`elbo` and `ref_nll` (their mean and Student t interval over the examples), T 0, L_s the run's L_t, sampler
'likelihood'; no text. Counted apart from the sampled points, and picked apart by `--deep --fraction`."""
from __future__ import annotations

from study.engine.kinds.base import Kind, register
from study.engine.rows import NLL_KEYS, NLL_METRICS, NLL_SAMPLER, nll_cost, nll_rows


class Nll(Kind):
    name = "nll"
    count, recomputed = "nll_files", "nll_recomputed"
    keeps_text = False

    def as_stored(self, v, task_name, kept, m) -> bool:
        v.underived.add("per-example ELBO and reference NLL (recomputing them needs the model: --deep)")
        return True

    def metrics(self, task) -> set[str]:
        return set(NLL_METRICS)

    def primary(self, task) -> str:
        return "elbo"

    def point(self, v, path, key, rows, known, run, task):
        """No point: T 0, L_s the run's L_t, sampler 'likelihood' and the split its key names, checked here."""
        split = next((s for s, k in NLL_KEYS.items() if k == key), None)
        if split is None:
            v.problems.append(f"{path}: field kind is 'nll' but eval key {key} is not the key of a "
                              f"continuous-quantity point ({', '.join(NLL_KEYS.values())})")
            return False
        want = {"T": 0, "sampler": NLL_SAMPLER, "split": split, **({"L_s": run.model.L} if run is not None else {})}
        for r in rows:
            for fld, w in want.items():
                if r[fld] != w:
                    v.problems.append(f"{path}: field {fld} is {r[fld]!r} but eval point {key} is {fld} = {w!r}")
        return None

    def derive(self, v, path, r, scores, task):
        m = r["metric"]
        if not all(m in s for s in scores):
            return None
        return nll_rows([{x: s.get(x, s[m]) for x in NLL_METRICS} for s in scores], {})[NLL_METRICS.index(m)]

    def cost(self, v, spath, model, rows, srows, pt, task) -> dict:
        want = nll_cost(model, rows[0]["L_s"], len(srows))
        if any(s["passes"] != want["forward_passes"] for s in srows):
            v.problems.append(f"{spath}: field passes differs from (n_t + 1) x L_s = {want['forward_passes']}")
        return want

    def redo(self, c, rid, key, pt, run, task, model, precision):
        """As many examples as the point stored, of the split its rows name."""
        from study.engine.evaluate import evaluate_nll

        rows = c.tables[("evals", (rid, f"{key}.parquet"))].to_pylist()
        ev = task.eval_set(rows[0]["split"]).head(rows[0]["n_examples"])
        return evaluate_nll(model, rid, rows[0]["split"], ev, run.model.L, precision)


register(Nll())
