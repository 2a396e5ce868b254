"""What every evaluation kind starts from (study/engine/kinds/__init__.py says what a kind is): the registry
`KINDS`, `register`, and the rules of a sampled point, which each kind refines."""
from __future__ import annotations

from typing import ClassVar

from study.engine.rows import metric_rows, passes_cost
from study.spec.grid import EvalPoint

KINDS: dict[str, "Kind"] = {}


def register(kind: "Kind") -> "Kind":
    """Make a kind known by its `name` (the evals rows' `kind`); a second kind of that name is refused."""
    have = KINDS.get(kind.name)
    if have is not None and type(have) is not type(kind):
        raise ValueError(f"evaluation kind {kind.name!r} of {type(kind).__module__} clashes with the kind of "
                         f"{type(have).__module__}: give it another name")
    KINDS[kind.name] = kind
    return kind


class Kind:
    """A sampled evaluation point, the rules every kind starts from (sample.py is this as it stands)."""

    name: ClassVar[str]
    count: ClassVar[str] = "eval_files"  # the verdict's count of its files; --deep picks each count apart
    recomputed: ClassVar[str] = "metrics_recomputed"  # and of its values derived again
    keeps_text: ClassVar[bool] = True  # text kept for the config's n_samples_kept examples
    bounded: ClassVar[bool] = True  # evaluates at most its point's n_examples
    redone: ClassVar[bool] = True  # `--deep` can evaluate it again (`redo`)

    def as_stored(self, v, task_name: str, kept: int, m: int) -> bool:
        """Whether its m per-example scores are taken as stored (said in `v`), not re-scored from the `kept`
        outputs' text (Task.rescore)."""
        return False

    def metrics(self, task) -> set[str]:
        """The metrics its evals rows may name."""
        return set(task.metric_names)

    def owed_metrics(self, task) -> set[str]:
        """The metrics a grid's point of this kind must hold beside those its samples were scored on."""
        return set()

    def primary(self, task) -> str:
        """The metric a samples row's `score` holds."""
        return task.sample_score or task.primary_metric

    def point(self, v, path: str, key: str, rows: list[dict], known: dict, run, task):
        """The evaluation point of `key` (None: a kind without one), or False: none (said in `v`, or by the caller)."""
        if task.eval_mode != self.name:
            v.problems.append(f"{path}: field kind is {self.name!r} but task {task.name} evaluates its points by "
                              f"{task.eval_mode!r}")
            return False
        pt = known.get(key) or (point_from_rows(run, task, key, rows[0]) if run is not None else None)
        return pt if pt is not None else False

    def label(self, pt: EvalPoint) -> str:
        return pt.label

    def check_rows(self, v, path: str, key: str, rows: list[dict], pt: EvalPoint) -> None:
        """Each evals row's T, L_s, sampler and split are its point's, and it evaluates no more examples."""
        for r in rows:
            for fld, want in (("T", pt.T), ("L_s", pt.L_s), ("sampler", self.label(pt)), ("split", pt.split)):
                if r[fld] != want:
                    v.problems.append(f"{path}: field {fld} is {r[fld]!r} but eval point {key} is {fld} = {want!r}")
            if self.bounded and r["n_examples"] is not None and r["n_examples"] > pt.n_examples:
                v.problems.append(f"{path}: field n_examples is {r['n_examples']} but eval point {key} evaluates at "
                                  f"most {pt.n_examples} examples")

    def derive(self, v, path: str, r: dict, scores: list[dict], task) -> dict | None:
        """The row `r`'s value, ci_low and ci_high derived again from the per-example scores (None: not derivable)."""
        return metric_rows(scores, [r["metric"]], {}, task)[0] if all(r["metric"] in s for s in scores) else None

    def cost(self, v, spath: str, model, rows: list[dict], srows: list[dict], pt, task) -> dict | None:
        """forward_passes, forward_passes_mean and eval_flops its per-example cost gives (None: said in `v`)."""
        if any(s["passes"] is None or s["steps"] is None for s in srows):
            v.problems.append(f"{spath}: per-example passes or steps missing: the evaluation cost cannot be derived")
            return None
        adaptive, L_s = self.adaptive(pt), rows[0]["L_s"]
        if adaptive is not None:  # the loops each example ran, the head after every loop
            passes = [s["passes"] for s in srows]
            return passes_cost(model, passes, sum(passes))
        for s in srows:
            if s["passes"] != s["steps"] * L_s:
                v.problems.append(f"{spath} example {s['example']}: field passes is {s['passes']} but "
                                  f"{s['steps']} steps at L_s = {L_s} run {s['steps'] * L_s}")
                break
        if pt is not None and any(s["steps"] > pt.T for s in srows):
            v.problems.append(f"{spath}: field steps exceeds T = {pt.T}")
        # model.rmdm.Sampled at fixed depth: passes = steps x L_s, the head once per step
        return passes_cost(model, [s["steps"] * L_s for s in srows], sum(s["steps"] for s in srows))

    def adaptive(self, pt) -> float | None:
        return pt.adaptive if pt is not None else None

    def evaluate(self, run_id: str, pt: EvalPoint, model, task, ev, keep: int, precision: str) -> list:
        """The Evaluations of a grid's point (in the order they are written)."""
        from study.engine.evaluate import evaluate

        return [evaluate(model, task, pt, ev, run_id, keep=keep, precision=precision)]

    def redo(self, c, rid: str, key: str, pt, run, task, model, precision: str):
        """`--deep`: the point evaluated again as it was written (None: cannot be, said in a note)."""
        ev = task.eval_set(run.eval.split).head(pt.n_examples)
        got = {e.key: e for e in self.evaluate(rid, pt, model, task, ev, min(run.eval.n_samples_kept, len(ev)),
                                                precision)}
        if key not in got:
            c.v.problems.append(f"{c.store.path('evals', rid, key + '.parquet')}: --deep: evaluating point {pt.key} "
                                f"again makes no eval key {key}")
        return got.get(key)


def point_from_rows(run, task, key: str, r: dict) -> EvalPoint | None:
    """The evaluation point whose key the rows' own fields (T, L_s, sampler, split, n_examples) and the
    run's eval settings give, if that is `key`: a point of a grid the study did not record."""
    sampler, _, rest = str(r["sampler"]).partition("+adaptive(")
    try:
        adaptive = float(rest.rstrip(")")) if rest else None
    except ValueError:
        return None
    for asked in ("test", "val"):
        try:
            if task.cfg.split_of(asked) != r["split"]:
                continue
            data = tuple(sorted(task.cfg.eval_fields(asked).items()))
        except (ValueError, AttributeError, KeyError):
            continue
        for n in {r["n_examples"], run.eval.n_examples}:
            pt = EvalPoint(T=r["T"], L_s=r["L_s"], sampler=sampler, temperature=run.eval.temperature,
                           remask=run.eval.remask, n_examples=n, split=r["split"], seed=run.eval.seed, data=data,
                           adaptive=adaptive)
            if pt.key == key:
                return pt
    return None
