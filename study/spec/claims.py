"""The `claims:` and `seeds:` sections of a grid: what a study is meant to decide, and how many seeds it may
spend deciding it (docs/DESIGN.md, "Claims"). Each entry becomes one claim per pair of the grid it names and
per T; the grid's runs are each model's first `seeds.min` seeds, and study/engine/claims.py adds the others.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Literal

from pydantic import Field, model_validator

import tasks
from model.config import Strict
from stats.sequential import KINDS, SPENDING
from study.spec.sections import LOOP_ONLY_TRAIN, Err, canon_key, field_of, refuse, short, validate

# fields that only shape the loop: an iso-parameter or iso-FLOP partner need not match them (as analysis/tables.py)
LOOP_ONLY = {*(f"train.{k}" for k in LOOP_ONLY_TRAIN), "model.step_emb", "model.reinject_input"}
PAIRS = ("iso-param", "iso-flop")
ALPHA = ("family", "per-claim")  # claims_alpha: Bonferroni over the grid's claims, or each claim alone


class Seeds(Strict):
    min: int = Field(2, ge=2, description="seeds every model of a claim is trained with first (>= 2: a spread)")
    max: int = Field(8, ge=2, le=1000, description="the most seeds a model is given")
    batch: int = Field(1, ge=1, description="seeds added at once to the models of undecided claims")
    spending: Literal[SPENDING] = Field("obrien-fleming", description="the Lan-DeMets alpha-spending function")

    @model_validator(mode="after")
    def _order(self):
        if self.max < self.min:
            raise refuse(f"must be >= min ({self.min}) (got {self.max})", "max")
        return self


class ClaimEntry(Strict):
    pair: Literal[PAIRS] | None = Field(None, description="every pair of this kind the grid holds")
    A: dict | None = Field(None, description="model fields naming model A, e.g. {K: 1, L: 2}")
    B: dict | None = None
    T: list[int] = Field(description="denoising steps, each sampled at the model's training depth")
    metric: str | None = Field(None, description="default: the task's primary metric")
    claim: Literal[KINDS]
    margin: float | None = Field(None, gt=0, description="the 'matches' margin, in the metric's units")

    @model_validator(mode="after")
    def _shape(self):
        if (self.pair is None) == (self.A is None and self.B is None) or (self.A is None) != (self.B is None):
            raise refuse("name the pair as `pair: iso-param | iso-flop`, or as A and B (model fields), not both")
        if self.claim != "beats" and self.margin is None:
            raise refuse(f"a {self.claim} claim needs its margin, stated before the run "
                         f"(`margin: 0.02`, in the metric's units)", "margin")
        if self.claim == "beats" and self.margin is not None:
            raise refuse("a beats claim takes no margin (A - B > 0); use matches_or_beats for A - B > -margin",
                         "margin")
        if not self.T or min(self.T) < 1:
            raise refuse(f"T values must be integers >= 1 (got {self.T})", "T")
        return self


@dataclasses.dataclass(frozen=True)
class Claims:
    seeds: Seeds
    base_seed: int
    claims: list[dict]  # one per (entry, pair, T): see _claim; A and B name their model by its base run id
    models: dict  # base run id -> the model's base Run (the grid's seed)
    alpha: str = "family"  # claims_alpha (ALPHA)

    def seeds_of(self, model, n: int | None = None) -> list:
        """Model `model` (a base run id, or a base Run) at seeds base + 0 .. n - 1 (default max), each an
        ordinary run with its own id."""
        run = self.models[model] if isinstance(model, str) else model
        return [dataclasses.replace(run, train=run.train.model_copy(update={"seed": self.base_seed + i}))
                for i in range(self.seeds.max if n is None else n)]

    def spec(self) -> dict:
        """What the store keeps as claims.json: the design and each claim with its models' run ids per seed."""
        ids = {m: [r.run_id for r in self.seeds_of(m)] for m in self.models}
        return {"seeds": self.seeds.model_dump(), "base_seed": self.base_seed, "claims_alpha": self.alpha,
                "claims": [{**c, "A": {**c["A"], "runs": ids[c["A"]["model"]]},
                            "B": {**c["B"], "runs": ids[c["B"]["model"]]}} for c in self.claims]}


def _identity(run, drop: set[str]) -> str:
    flat = {f"{sec}.{k}": v for sec, d in run.training_config.items() for k, v in d.items()}
    return json.dumps({k: v for k, v in flat.items() if k not in drop and k != "train.seed"}, sort_keys=True,
                      default=str)


def _pairs(kind: str, runs: list) -> list[tuple]:
    """(looped A, one-loop B) of one recipe: B has A's K blocks (iso-param) or as many as A runs, K x L (iso-flop)."""
    flop = kind == "iso-flop"
    drop = LOOP_ONLY | {"model.L"} | ({"model.K"} if flop else set())
    return [(a, b) for a in runs for b in runs if a.model.L > 1 and b.model.L == 1
            and a.model.K * (a.model.L if flop else 1) == b.model.K and _identity(a, drop) == _identity(b, drop)]


def _named(fields: dict, runs: list, key: str, err: Err):
    if not isinstance(fields, dict) or not fields:
        err(key, "must be a mapping of model fields, e.g. {K: 1, L: 2}")
    want = {canon_key(k, key + ".", err): v for k, v in fields.items()}
    hits = [r for r in runs if all(field_of(r, k) == v for k, v in want.items())]
    if len(hits) != 1:
        what = "no model" if not hits else f"{len(hits)} models"
        err(key, f"{short(fields)} names {what} of the grid (models: "
                 f"{', '.join(sorted({_label(r) for r in runs}))}); name exactly one")
    return hits[0]


def _label(run) -> str:
    return f"({run.model.K} x {run.model.L})"


def parse_claims(raw: dict, runs: list, err: Err) -> Claims | None:
    """The claims of grid mapping `raw` over its base runs (one per model, the grid's seed); None when it has none.
    Raises through `err`: unknown keys, a matches claim without margin, a pair or T the grid does not hold."""
    if not {"claims", "seeds", "claims_alpha"} & set(raw):
        return None
    for key in ("seeds", "claims_alpha"):
        if "claims" not in raw and key in raw:
            err(key, f"a `{key}:` section needs a `claims:` section: the seeds are spent deciding claims")
    alpha = raw.get("claims_alpha", "family")
    if alpha not in ALPHA:
        err("claims_alpha", f"must be one of {', '.join(ALPHA)} (got {alpha!r})")
    seeds = validate(Seeds, raw.get("seeds") or {}, "seeds", err)
    if len({r.train.seed for r in runs}) > 1:
        err("seeds", "a claims grid draws its own seeds (train.seed + 0 .. max - 1): remove the seed axis")
    entries = raw["claims"]
    if not isinstance(entries, list) or not entries:
        err("claims", "must be a non-empty list of claims, e.g. [{pair: iso-param, T: [1], claim: beats}]")
    claims = []
    for i, e in enumerate(entries):
        key = f"claims[{i}]"
        if not isinstance(e, dict):
            err(key, "must be a mapping: {pair | A and B, T, metric, claim, margin}")
        c = validate(ClaimEntry, e, key, err)
        if c.pair is not None:
            pairs = _pairs(c.pair, runs)
            if not pairs:
                err(f"{key}.pair", f"the grid holds no {c.pair} pair (models: "
                                   f"{', '.join(sorted({_label(r) for r in runs}))})")
        else:
            pairs = [(_named(c.A, runs, f"{key}.A", err), _named(c.B, runs, f"{key}.B", err))]
        for a, b in pairs:
            for T in c.T:
                claims.append(_claim(c, a, b, T, key, err))
    models = {r.run_id: r for r in runs if any(r.run_id in (c["A"]["model"], c["B"]["model"]) for c in claims)}
    return Claims(seeds, runs[0].train.seed, claims, models, alpha)


def _claim(c: ClaimEntry, a, b, T: int, key: str, err: Err) -> dict:
    if a.task.model_dump() != b.task.model_dump():
        err(key, f"{_label(a)} and {_label(b)} are of different tasks: never scored on the same examples")
    names = tasks.TASKS[a.task.name][1].metric_names_of()
    metric = c.metric if c.metric is not None else tasks.primary_metric(a.task.name, names)
    if metric not in names:
        err(f"{key}.metric", f"unknown metric {metric!r} for task {a.task.name}; allowed: {', '.join(names)}")
    points = []
    for r in (a, b):
        sampler = "confidence" if "confidence" in r.eval.sampler else r.eval.sampler[0]
        p = next((p for p in r.eval_points() if p.T == T and p.L_s == r.model.L and p.adaptive is None
                  and p.sampler == sampler), None)
        if p is None:
            err(f"{key}.T", f"{_label(r)} is not evaluated at T={T}, L_s = its L_t ({r.model.L}): add it to "
                            f"`eval` (T: {r.eval.T}, L_s: {r.eval.L_s})")
        points.append(p)
    side = [{"label": _label(r), "model": r.run_id, "L_s": p.L_s, "sampler": p.label, "split": p.split,
             "eval_key": p.key} for r, p in zip((a, b), points)]
    return {"name": f"{_label(a)} {c.claim} {_label(b)} at T={T}", "kind": c.claim, "margin": c.margin, "T": T,
            "metric": metric, "lower_is_better": tasks.lower_is_better(metric), "pair": c.pair or "named",
            "A": side[0], "B": side[1]}
