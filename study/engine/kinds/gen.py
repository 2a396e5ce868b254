"""A likelihood point's unconditional generations (likelihood.py writes them beside the point): key
`<point key>-gen`, one evals row `known_words` of min(n_samples_kept, 16) generations, no interval, sampled at
fixed depth; no text re-scorer reads them back."""
from __future__ import annotations

from study.engine.kinds.base import KINDS, Kind, register
from study.engine.rows import GEN_SUFFIX as SUFFIX


class Gen(Kind):
    name = "gen"
    keeps_text = False
    bounded = False

    def as_stored(self, v, task_name, kept, m) -> bool:
        if kept:
            v.underived.add(f"{task_name} per-example scores (no text re-scorer for this task)")
        v.add("scores_as_stored", m)
        return True

    def metrics(self, task) -> set[str]:
        return {"known_words"}

    def primary(self, task) -> str:
        return "known_words"

    def point(self, v, path, key, rows, known, run, task):
        """The grid's likelihood point whose generations these are."""
        return next((pt for pt in known.values() if pt.key + SUFFIX == key), False)

    def label(self, pt) -> str:
        return pt.sampler

    def adaptive(self, pt) -> None:
        return None  # fixed depth whatever the point says

    def derive(self, v, path, r, scores, task):
        want = super().derive(v, path, r, scores, task)
        return want and {**want, "ci_low": None, "ci_high": None}  # the generations carry no interval

    def redo(self, c, rid, key, pt, run, task, model, precision):
        return KINDS["likelihood"].redo(c, rid, key, pt, run, task, model, precision)


register(Gen())
