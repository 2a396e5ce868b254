"""The `search:` section of a grid and the best-values files (`best.yaml`, written by `study tune`) that feed
sweeps through `defaults_from`; no Ray here. The section's keys, an example and why trials are scored on val,
never test: docs/guide/grids.md, "Search grids".
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from model.config import ModelConfig, Strict, TrainConfig
from study.spec.gridfile import read_yaml
from study.spec.sections import (TRAIN_BOOKKEEPING, BadKey, Err, GridError, Resources, canon_key, canonical, field_of,
                                 refuse, short)

BEST_KIND = "rmdm-study/best-values"
LOSS_METRICS = ("final_loss", "val_loss")
DISTS = ("choice", "int", "loguniform", "uniform")
DIST_KEYS = {"loguniform": {"dist", "low", "high"}, "uniform": {"dist", "low", "high", "step"},
             "int": {"dist", "low", "high", "step", "log"}, "choice": {"dist", "values"}}
SEARCH_SPLITS = ("val",)  # never test: a search selects on what it reads


class SearchMetric(Strict):
    """What a trial is scored by: a task metric at one eval point, or a loss."""

    name: str
    T: int | None = Field(None, ge=1)
    L_s: int | Literal["train"] = "train"
    sampler: Literal["confidence", "random"] = "confidence"

    @model_validator(mode="before")
    @classmethod
    def _named(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v  # `metric: val_loss`

    @model_validator(mode="after")
    def _at_one_point(self) -> SearchMetric:
        if self.name not in LOSS_METRICS and self.T is None:
            raise refuse(f"a task metric ({self.name!r}) is measured at one eval point: give T", at="T")
        return self

    @property
    def label(self) -> str:
        if self.name in LOSS_METRICS:
            return self.name
        return (f"{self.name}@T{self.T}" + ("" if self.L_s == "train" else f",L_s={self.L_s}")
                + ("" if self.sampler == "confidence" else f",{self.sampler}"))


class Pruning(Strict):
    """ASHA over training steps: trials report `metric` every `log_every` steps (training loss)
    or every `every` steps (the search metric, from an intermediate evaluation)."""

    scheduler: Literal["asha"] = "asha"
    metric: Literal["loss", "objective"] = "loss"
    grace_period: int = Field(..., ge=1, description="steps every trial trains before it can be stopped")
    reduction_factor: float = Field(2.0, gt=1)
    every: int | None = Field(None, ge=1, description="steps between intermediate evaluations (metric: objective)")

    @model_validator(mode="after")
    def _every_with_objective(self) -> Pruning:
        if self.metric == "objective" and self.every is None:
            raise refuse("pruning on the search metric needs `every` (steps between evaluations)", at="every")
        if self.metric == "loss" and self.every is not None:
            raise refuse("only used with metric: objective (the training loss is reported every train.log_every "
                         "steps)", at="every")
        return self


class Dist(Strict):
    """The distribution one searched field is sampled from; each `dist` takes its own keys (DIST_KEYS)."""

    dist: Literal["choice", "int", "loguniform", "uniform"]
    low: int | float | None = None
    high: int | float | None = None
    step: int | float | None = None
    log: bool = Field(False, strict=True)  # int only: sampled on a log scale
    values: tuple[int | float | str | bool, ...] = ()  # choice only

    @model_validator(mode="before")
    @classmethod
    def _keys_of_its_dist(cls, spec: Any) -> Any:
        if isinstance(spec, list):
            raise refuse("a list of values is a grid-search axis: put it under `axes`, or search it with "
                         "{dist: choice, values: [...]}")
        if not isinstance(spec, dict) or "dist" not in spec:
            raise refuse(f"must be a mapping {{dist: {'|'.join(DISTS)}, ...}} (got {short(spec)})")
        dist = spec["dist"]
        if not isinstance(dist, str) or dist not in DIST_KEYS:
            raise refuse(f"unknown distribution {short(dist)}; allowed: {', '.join(DISTS)}", at="dist")
        for k in spec:
            if k not in DIST_KEYS[dist]:
                raise refuse(f"unknown key for dist {dist}; allowed: {', '.join(sorted(DIST_KEYS[dist]))}", at=str(k))
        return spec

    @field_validator("low", "high", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise refuse(f"must be a finite number (got {short(v)})")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> Dist:
        if self.dist == "choice":
            vals = list(self.values)
            if not vals:
                raise refuse("must be a non-empty list", at="values")
            if len(set(vals)) < len(vals):
                raise refuse(f"must be distinct numbers, strings or booleans (got {short(vals)})", at="values")
            return self
        low, high, step = self.low, self.high, self.step
        for name in ("low", "high"):
            if getattr(self, name) is None:
                raise refuse("must be a finite number (got None)", at=name)
        if not low < high:
            raise refuse(f"needs low < high (got low={low!r}, high={high!r})")
        if self.dist == "loguniform" and low <= 0:
            raise refuse(f"loguniform needs low > 0 (got {low!r})", at="low")
        integral = self.dist == "int"
        if integral and not (isinstance(low, int) and isinstance(high, int)):
            raise refuse(f"dist int needs integer low and high (got {low!r}, {high!r})")
        if step is not None and (isinstance(step, bool) or step <= 0 or (integral and not isinstance(step, int))):
            raise refuse(f"must be a positive {'integer' if integral else 'number'} (got {step!r})", at="step")
        if self.log and low < 1:
            raise refuse("a log-scale int needs low >= 1", at="low")
        if self.log and step not in (None, 1):
            raise refuse("a log-scale int cannot have a step", at="step")
        return self

    def describe(self) -> str:
        """The distribution as `study plan` shows it (a log-scale int is `intlog`)."""
        if self.dist == "choice":
            return f"choice{list(self.values)}"
        s = f", step={self.step:g}" if self.step else ""
        return f"{'intlog' if self.dist == 'int' and self.log else self.dist}({self.low:g}, {self.high:g}{s})"

    def probes(self) -> list:
        """Values that must all give a valid configuration (checked before anything runs)."""
        if self.dist == "choice":
            return list(self.values)
        if self.dist == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]

    def holds(self, v: Any) -> bool:
        """Whether value `v` can be drawn from this distribution (a warm-start point's value)."""
        if self.dist == "choice":
            return v in self.values
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return False
        return self.low <= v <= self.high


class Search(Strict):
    """A grid's `search:` section (see the module's docstring). `params` and `points` are keyed by
    canonical 'section.field' keys once validated (`lr` is `train.lr`)."""

    params: dict[str, Dist]
    n_trials: int = Field(ge=1)
    metric: SearchMetric
    mode: Literal["max", "min"]
    pruning: Pruning | None = None
    max_concurrent: int = Field(1, ge=1, description="trials of one group in flight at once")
    resources: Resources | None = Field(None, description="per trial (default: the grid's `resources`)")
    seed: int = 0
    points: tuple[Any, ...] = Field((), description="values tried first (warm start)")
    split: str = Field("val", description="what trials are scored on: val, the only one allowed")

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            raise refuse("must be a mapping with keys " + ", ".join(sorted(cls.model_fields)))
        return raw

    @field_validator("params")
    @classmethod
    def _searched_fields(cls, params: dict[str, Dist]) -> dict[str, Dist]:
        if not params:
            raise refuse("must be a non-empty mapping of field -> distribution, e.g. "
                         "{lr: {dist: loguniform, low: 1.0e-4, high: 1.0e-2}}")
        out: dict[str, Dist] = {}
        for k, d in params.items():
            key = _canonical(k, "")
            sec, fld = key.split(".", 1)
            config = {"model": ModelConfig, "train": TrainConfig}.get(sec)
            if config is None:
                raise refuse("searches range over model and train fields only", at=k)
            if fld not in config.model_fields:
                raise refuse(f"unknown field {fld!r} of {sec}; allowed: {', '.join(sorted(config.model_fields))}",
                             at=k)
            if sec == "train" and fld in TRAIN_BOOKKEEPING:
                raise refuse(f"{fld} does not change the trained model: nothing to search", at=k)
            if key in out:
                raise refuse(f"{key} is given twice", at=k)
            integral = config.model_fields[fld].annotation is int
            if integral and d.dist not in ("int", "choice"):
                raise refuse(f"{key} is an integer field: use dist int or choice (got {d.dist})", at=f"{k}.dist")
            if d.dist == "int" and not integral:
                raise refuse(f"{key} is not an integer field: use uniform, loguniform or choice", at=f"{k}.dist")
            out[key] = d
        return out

    @field_validator("resources", mode="before")
    @classmethod
    def _own_resources(cls, v: Any) -> Any:
        return v or None  # empty: the grid's

    @field_validator("points")
    @classmethod
    def _warm_start(cls, points: tuple, info) -> tuple[dict, ...]:
        params = info.data.get("params")
        if params is None:
            return points  # the params' own error is the one reported
        out = []
        for i, p in enumerate(points):
            if not isinstance(p, dict) or not p:
                raise refuse("must be a non-empty mapping of param -> value", at=f"[{i}]")
            cp = {_canonical(k, f"[{i}]."): v for k, v in p.items()}
            if set(cp) != set(params):
                raise refuse(f"must give exactly the searched params {sorted(params)} (got {sorted(cp)})", at=f"[{i}]")
            for k, v in cp.items():
                if not params[k].holds(v):
                    raise refuse(f"{short(v)} is outside the distribution {params[k].describe()}", at=f"[{i}].{k}")
            out.append(cp)
        return tuple(out)

    @field_validator("split")
    @classmethod
    def _never_test(cls, v: str) -> str:
        if v not in SEARCH_SPLITS:
            raise refuse(f"must be {', '.join(SEARCH_SPLITS)} (got {v!r}): a search selects on the split it reads, "
                         f"and selecting on test makes the reported numbers optimistic")
        return v

    @model_validator(mode="after")
    def _loss_is_minimised(self) -> Search:
        if self.metric.name in LOSS_METRICS and self.mode != "min":
            raise refuse(f"{self.metric.name} is a loss: mode must be 'min'", at="mode")
        return self


def _canonical(key: Any, at: str) -> str:
    """canonical(key), a BadKey refused at `at` + the key."""
    try:
        return canonical(key)
    except BadKey as e:
        raise refuse(e.msg, at=at + e.key) from None


def _short_value(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


# ---- best-values files ---------------------------------------------------------------------
@dataclass(frozen=True)
class BestValues:
    """A `best.yaml` written by `study tune`: per search group, its point and its best values."""

    file: str
    study: str
    groups: dict[str, dict]  # name -> {"point": {key: v}, "best": {key: v}, ...}

    def pick(self, group: str, run, where: str, err: Err) -> tuple[str, dict]:
        """(search group, best values) for a run of a sweep; `group` may be 'auto'."""
        if group != "auto":
            if group not in self.groups:
                err(where + ".group", f"no search group {group!r} in {self.file}; groups: "
                                      f"{', '.join(sorted(self.groups))} (or auto)")
            return group, dict(self.groups[group]["best"])
        hits = [g for g, d in self.groups.items() if all(field_of(run, k) == v for k, v in d["point"].items())]
        if len(hits) != 1:
            have = {k: field_of(run, k) for d in self.groups.values() for k in d["point"]}
            err(where + ".group", f"auto: {len(hits)} search groups of {self.file} match a run with {have} "
                                  f"(need exactly one; groups: {', '.join(sorted(self.groups))})")
        return hits[0], dict(self.groups[hits[0]]["best"])


def load_best(spec: Any, where: str, err: Err) -> tuple[BestValues, str]:
    """Validate a `defaults_from: {file, group}` entry and read its file."""
    if not isinstance(spec, dict) or set(spec) != {"file", "group"}:
        err(where, "must be {file: results/<study>/best.yaml, group: <search group> | auto}")
    path, group = spec["file"], spec["group"]
    if not isinstance(group, str) or not group:
        err(where + ".group", f"must be a search group name or 'auto' (got {group!r})")
    if (not isinstance(path, str) or not path or os.path.isabs(path) or "\\" in path
            or ".." in path.split("/") or not path.endswith((".yaml", ".yml"))):
        err(where + ".file", f"must be a relative path to a .yaml file without '..' (got {path!r})")
    if not os.path.lexists(path):
        err(where + ".file", f"{path} does not exist (relative to {os.getcwd()}): run `study tune` first")
    try:  # read as a grid is: a regular file within the grid bounds (no FIFO, no endless line), YAML kept safe
        raw = read_yaml(path)
    except GridError as e:
        err(where + ".file", str(e))
    if not isinstance(raw, dict) or raw.get("kind") != BEST_KIND or not isinstance(raw.get("groups"), dict):
        err(where + ".file", f"{path} is not a best-values file written by `study tune` (kind: {BEST_KIND})")
    if raw.get("split") not in SEARCH_SPLITS:  # values selected on test would make a sweep's test numbers optimistic
        got = (f"records split {_short_value(raw.get('split'))}" if "split" in raw else
               "records no split (written before `study tune` scored on val: selected on test)")
        err(where + ".file", f"{path} {got}; best values must come from a search scored on "
                             f"{', '.join(SEARCH_SPLITS)}: run `study tune` again")
    groups = {}
    for g, d in raw["groups"].items():
        if not isinstance(d, dict) or not isinstance(d.get("point"), dict) or not isinstance(d.get("best"), dict):
            err(where + ".file", f"{path}: group {g!r} needs `point` and `best` mappings")
        if not d["best"]:
            continue  # a group whose every trial failed has no best values
        best = {}
        for k, v in d["best"].items():
            ck = canon_key(k, f"{where}.file({path}).groups.{g}.best.", err)
            if ck.split(".")[0] not in ("model", "train"):
                err(f"{where}.file", f"{path}: group {g!r}: best values are model/train fields (got {k!r})")
            best[ck] = v
        groups[str(g)] = {**d, "point": dict(d["point"]), "best": best}
    if not groups:
        err(where + ".file", f"{path} holds no group with best values")
    return BestValues(file=path, study=str(raw.get("study")), groups=groups), group
