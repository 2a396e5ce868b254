"""The `search:` section of a grid and the best-values files that feed sweeps (no Ray here).

A search grid is a sweep grid plus a `search:` section. Its base sections, axes and groups
expand as usual, but every expanded point is a *search group*: one Optuna study of its own
(for example one per (K, L), so each architecture gets its own learning rate). The
distributions below are sampled on top of each group's configuration::

    search:
      n_trials: 8                                  # per group
      metric: {name: vpr, T: 5}                    # a task metric at one eval point (L_s: train,
                                                   #   sampler: confidence by default), or
                                                   #   final_loss / val_loss
      mode: max                                    # max | min
      params:
        lr: {dist: loguniform, low: 1.0e-4, high: 1.0e-2}
        train.warmup: {dist: int, low: 0, high: 100, step: 10}
        model.dropout: {dist: uniform, low: 0.0, high: 0.2}
        train.schedule: {dist: choice, values: [fixed, reverse]}
      pruning: {scheduler: asha, metric: loss, grace_period: 50, reduction_factor: 2}
      max_concurrent: 2                            # trials of one group in flight at once
      resources: {cpu: 1, gpu: 0.25}               # per trial (default: the grid's `resources`)
      seed: 0
      points: [{lr: 3.0e-3}]                       # tried first (warm start), optional
      split: val                                   # what trials are scored on: val, the only one allowed

Trials are scored -- the objective, ASHA's intermediate scores, val_loss -- on the task's
validation split, drawn from the training distribution and disjoint from the test split
that sweeps report: selecting on test would make the reported numbers optimistic. Every
eval row a trial writes says `split: val`. `split: test` is refused, and so is a best-values
file that records another split than val, or none (files from before tuning read val were
selected on test).

`study tune` writes `<results>/<study>/best.yaml` (format below); a sweep grid takes the
winners by reference, at the top level or per group::

    defaults_from: {file: results/tune_sudoku_lr/best.yaml, group: auto}   # or group: K1_L3

`group: auto` gives every run the best values of the one search group whose point (for
example model.K = 1, model.L = 3) matches the run. Best values override the grid's
`model` / `train` sections; a key that is also an axis of the sweep is an error. The file
path must be relative (resolved against the working directory, like `--results`), without
'..', and end in .yaml or .yml.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import Field

from study.grid import Strict

BEST_KIND = "rmdm-study/best-values"
LOSS_METRICS = ("final_loss", "val_loss")
DISTS = ("choice", "int", "loguniform", "uniform")


class SearchMetric(Strict):
    """What a trial is scored by: a task metric at one eval point, or a loss."""

    name: str
    T: int | None = Field(None, ge=1)
    L_s: int | Literal["train"] = "train"
    sampler: Literal["confidence", "random"] = "confidence"

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


@dataclass(frozen=True)
class Dist:
    key: str  # canonical 'section.field'
    dist: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    values: tuple = ()

    def describe(self) -> str:
        if self.dist == "choice":
            return f"choice{list(self.values)}"
        s = f", step={self.step:g}" if self.step else ""
        return f"{self.dist}({self.low:g}, {self.high:g}{s})"

    def probes(self) -> list:
        """Values that must all give a valid configuration (checked before anything runs)."""
        if self.dist == "choice":
            return list(self.values)
        if self.dist == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]


@dataclass(frozen=True)
class Search:
    params: dict[str, Dist]
    n_trials: int
    metric: SearchMetric
    mode: str
    pruning: Pruning | None
    max_concurrent: int
    resources: Any  # study.grid.Resources | None
    seed: int
    points: tuple[dict, ...]
    split: str = "val"  # the split trials are scored on


@dataclass(frozen=True)
class SearchGroup:
    """One Optuna study: a point of the grid (its base run) and the name it is stored under."""

    name: str
    point: dict
    run: Any  # study.grid.Run


SEARCH_KEYS = {"params", "n_trials", "metric", "mode", "pruning", "max_concurrent", "resources", "seed", "points",
               "split"}
SEARCH_SPLITS = ("val",)  # never test: a search selects on what it reads
DIST_KEYS = {"loguniform": {"dist", "low", "high"}, "uniform": {"dist", "low", "high", "step"},
             "int": {"dist", "low", "high", "step", "log"}, "choice": {"dist", "values"}}


def parse_search(raw: Any, err, canon_key, validate, resources_cls) -> Search:
    """Validate a `search:` mapping. `err(key, msg)` raises GridError naming the file."""
    from model.config import ModelConfig, TrainConfig
    from study.grid import TRAIN_BOOKKEEPING

    if not isinstance(raw, dict):
        err("search", "must be a mapping with keys " + ", ".join(sorted(SEARCH_KEYS)))
    for k in raw:
        if k not in SEARCH_KEYS:
            err(f"search.{k}", f"unknown key; allowed: {', '.join(sorted(SEARCH_KEYS))}")
    for k in ("params", "n_trials", "metric", "mode"):
        if k not in raw:
            err(f"search.{k}", "is required")
    n_trials = raw["n_trials"]
    if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 1:
        err("search.n_trials", f"must be an integer >= 1 (got {n_trials!r})")
    mode = raw["mode"]
    if mode not in ("max", "min"):
        err("search.mode", f"must be 'max' or 'min' (got {mode!r})")
    m = raw["metric"]
    metric = validate(SearchMetric, {"name": m} if isinstance(m, str) else m, "search.metric", err)
    if metric.name not in LOSS_METRICS and metric.T is None:
        err("search.metric.T", f"a task metric ({metric.name!r}) is measured at one eval point: give T")
    if metric.name in LOSS_METRICS and mode != "min":
        err("search.mode", f"{metric.name} is a loss: mode must be 'min'")
    pruning = None
    if raw.get("pruning") is not None:
        pruning = validate(Pruning, raw["pruning"], "search.pruning", err)
        if pruning.metric == "objective" and pruning.every is None:
            err("search.pruning.every", "pruning on the search metric needs `every` (steps between evaluations)")
        if pruning.metric == "loss" and pruning.every is not None:
            err("search.pruning.every", "only used with metric: objective (the training loss is reported every "
                                        "train.log_every steps)")
    mc = raw.get("max_concurrent", 1)
    if not isinstance(mc, int) or isinstance(mc, bool) or mc < 1:
        err("search.max_concurrent", f"must be an integer >= 1 (got {mc!r})")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        err("search.seed", f"must be an integer (got {seed!r})")
    res = validate(resources_cls, raw["resources"], "search.resources", err) if raw.get("resources") else None
    split = raw.get("split", "val")
    if split not in SEARCH_SPLITS:
        err("search.split", f"must be {', '.join(SEARCH_SPLITS)} (got {split!r}): a search selects on the split it "
                            f"reads, and selecting on test makes the reported numbers optimistic")

    params_raw = raw["params"]
    if not isinstance(params_raw, dict) or not params_raw:
        err("search.params", "must be a non-empty mapping of field -> distribution, e.g. "
                             "{lr: {dist: loguniform, low: 1.0e-4, high: 1.0e-2}}")
    params: dict[str, Dist] = {}
    for k, spec in params_raw.items():
        where = f"search.params.{k}"
        key = canon_key(k, "search.params.", err)
        sec, fld = key.split(".", 1)
        cls = {"model": ModelConfig, "train": TrainConfig}.get(sec)
        if cls is None:
            err(where, "searches range over model and train fields only")
        if fld not in cls.model_fields:
            err(where, f"unknown field {fld!r} of {sec}; allowed: {', '.join(sorted(cls.model_fields))}")
        if fld in TRAIN_BOOKKEEPING and sec == "train":
            err(where, f"{fld} does not change the trained model: nothing to search")
        if key in params:
            err(where, f"{key} is given twice")
        if isinstance(spec, list):
            err(where, "a list of values is a grid-search axis: put it under `axes`, or search it with "
                       "{dist: choice, values: [...]}")
        if not isinstance(spec, dict) or "dist" not in spec:
            err(where, f"must be a mapping {{dist: {'|'.join(DISTS)}, ...}} (got {spec!r})")
        dist = spec["dist"]
        if dist not in DIST_KEYS:
            err(where + ".dist", f"unknown distribution {dist!r}; allowed: {', '.join(DISTS)}")
        for sk in spec:
            if sk not in DIST_KEYS[dist]:
                err(f"{where}.{sk}", f"unknown key for dist {dist}; allowed: {', '.join(sorted(DIST_KEYS[dist]))}")
        integral = cls.model_fields[fld].annotation is int
        if dist == "choice":
            vals = spec.get("values")
            if not isinstance(vals, list) or not vals:
                err(where + ".values", "must be a non-empty list")
            if any(not isinstance(v, (int, float, str, bool)) or v is None for v in vals) or len(set(vals)) < len(vals):
                err(where + ".values", f"must be distinct numbers, strings or booleans (got {vals!r})")
            params[key] = Dist(key, dist, values=tuple(vals))
            continue
        for b in ("low", "high"):
            v = spec.get(b)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                err(f"{where}.{b}", f"must be a finite number (got {v!r})")
        low, high = spec["low"], spec["high"]
        if not low < high:
            err(where, f"needs low < high (got low={low!r}, high={high!r})")
        if dist == "loguniform" and low <= 0:
            err(where + ".low", f"loguniform needs low > 0 (got {low!r})")
        if integral and dist != "int":
            err(where + ".dist", f"{key} is an integer field: use dist int or choice (got {dist})")
        if dist == "int":
            if any(not isinstance(spec[b], int) for b in ("low", "high")):
                err(where, f"dist int needs integer low and high (got {low!r}, {high!r})")
            if not integral:
                err(where + ".dist", f"{key} is not an integer field: use uniform, loguniform or choice")
        step = spec.get("step")
        if step is not None and (not isinstance(step, (int, float)) or isinstance(step, bool) or step <= 0
                                 or (dist == "int" and not isinstance(step, int))):
            err(where + ".step", f"must be a positive {'integer' if dist == 'int' else 'number'} (got {step!r})")
        if dist == "int" and spec.get("log") not in (None, False, True):
            err(where + ".log", f"must be true or false (got {spec.get('log')!r})")
        if dist == "int" and spec.get("log"):
            if low < 1:
                err(where + ".low", "a log-scale int needs low >= 1")
            if step not in (None, 1):
                err(where + ".step", "a log-scale int cannot have a step")
            dist = "intlog"
        params[key] = Dist(key, dist, low=low, high=high, step=step)

    pts = raw.get("points", [])
    if not isinstance(pts, list):
        err("search.points", "must be a list of {param: value} mappings")
    points = []
    for i, p in enumerate(pts):
        if not isinstance(p, dict) or not p:
            err(f"search.points[{i}]", "must be a non-empty mapping of param -> value")
        cp = {canon_key(k, f"search.points[{i}].", err): v for k, v in p.items()}
        if set(cp) != set(params):
            err(f"search.points[{i}]", f"must give exactly the searched params {sorted(params)} (got {sorted(cp)})")
        for k, v in cp.items():
            if not _inside(params[k], v):
                err(f"search.points[{i}].{k}", f"{v!r} is outside the distribution {params[k].describe()}")
        points.append(cp)
    return Search(params=params, n_trials=n_trials, metric=metric, mode=mode, pruning=pruning, max_concurrent=mc,
                  resources=res, seed=seed, points=tuple(points), split=split)


def _short_value(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _inside(d: Dist, v: Any) -> bool:
    if d.dist == "choice":
        return v in d.values
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    return d.low <= v <= d.high


def group_name(grid_group: str | None, point: dict, study: str) -> str:
    """Name of a search group: the grid group's name and the values of its point, e.g. 'K1_L3'."""
    from study.grid import ALIASES

    short = {v: k for k, v in ALIASES.items()}
    parts = [grid_group] if grid_group is not None else []
    for k, v in point.items():
        parts.append(f"{short.get(k, k)}{v}")
    return "_".join(str(p) for p in parts) or study


# ---- best-values files ---------------------------------------------------------------------
@dataclass(frozen=True)
class BestValues:
    """A `best.yaml` written by `study tune`: per search group, its point and its best values."""

    file: str
    study: str
    groups: dict[str, dict]  # name -> {"point": {key: v}, "best": {key: v}, ...}

    def pick(self, group: str, run, where: str, err) -> tuple[str, dict]:
        """(search group, best values) for a run of a sweep; `group` may be 'auto'."""
        if group != "auto":
            if group not in self.groups:
                err(where + ".group", f"no search group {group!r} in {self.file}; groups: "
                                      f"{', '.join(sorted(self.groups))} (or auto)")
            return group, dict(self.groups[group]["best"])
        hits = [g for g, d in self.groups.items() if all(_run_value(run, k) == v for k, v in d["point"].items())]
        if len(hits) != 1:
            have = {k: _run_value(run, k) for d in self.groups.values() for k in d["point"]}
            err(where + ".group", f"auto: {len(hits)} search groups of {self.file} match a run with {have} "
                                  f"(need exactly one; groups: {', '.join(sorted(self.groups))})")
        return hits[0], dict(self.groups[hits[0]]["best"])


def _run_value(run, key: str):
    sec, fld = key.split(".", 1)
    return getattr(getattr(run, sec), fld)


def load_best(spec: Any, where: str, err, canon_key) -> tuple[BestValues, str]:
    """Validate a `defaults_from: {file, group}` entry and read its file."""
    if not isinstance(spec, dict) or set(spec) != {"file", "group"}:
        err(where, "must be {file: results/<study>/best.yaml, group: <search group> | auto}")
    path, group = spec["file"], spec["group"]
    if not isinstance(group, str) or not group:
        err(where + ".group", f"must be a search group name or 'auto' (got {group!r})")
    if (not isinstance(path, str) or not path or os.path.isabs(path) or "\\" in path
            or ".." in path.split("/") or not path.endswith((".yaml", ".yml"))):
        err(where + ".file", f"must be a relative path to a .yaml file without '..' (got {path!r})")
    from study.grid import GridError, grid_file_text, safe_yaml

    if not os.path.lexists(path):
        err(where + ".file", f"{path} does not exist (relative to {os.getcwd()}): run `study tune` first")
    try:  # read as a grid is: a regular file within the grid bounds (no FIFO, no endless line), YAML kept safe
        raw = safe_yaml(grid_file_text(path))
    except GridError as e:
        err(where + ".file", str(e))
    except RecursionError:
        err(where + ".file", f"cannot read {path}: nested too deeply")
    except yaml.YAMLError as e:
        err(where + ".file", f"cannot read {path}: {' '.join(str(e).split())}")
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
