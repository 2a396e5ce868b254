"""`study eval --puzzles FILE` (study/commands/puzzles.py): a run's weights on an external file, key
`ext-<file digest>-T<T>-Ls<L_s>-<sampler>-s<seed>`. Only the file's digest is stored: the point cannot be made
again, so its key is checked against its rows, and `--deep` leaves it be."""
from __future__ import annotations

from study.engine.kinds.base import Kind, register


def key_of(digest: str, T: int, L_s: int, sampler: str, seed: int) -> str:
    return f"ext-{digest}-T{T}-Ls{L_s}-{sampler}-s{seed}"


class Ext(Kind):
    name = "ext"
    keeps_text, redone = False, False

    def point(self, v, path, key, rows, known, run, task):
        v.underived.add("the puzzle file of an external evaluation (ext- keys: only its digest is stored)")
        if key in known:
            v.problems.append(f"{path}: field kind is 'ext' but eval key {key} is a point its grid or config owes")
        for r in rows:
            for fld, want in (("T", f"-T{r['T']}-"), ("L_s", f"-Ls{r['L_s']}-"), ("sampler", f"-{r['sampler']}-")):
                if want not in key:
                    v.problems.append(f"{path}: field {fld} is {r[fld]!r} but the eval key {key} says otherwise")
        return None

register(Ext())
