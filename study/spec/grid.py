"""YAML grid -> validated list of runs (the points it expands: study/spec/points.py; the bounds every run is
held to: study/spec/bounds.py). The sections and keys of a grid: docs/guide/grids.md. Everything is validated
before anything runs: an error names the file, the key and the allowed values. YAML is `safe_load`ed; nothing
in a grid is ever evaluated.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import os
import typing
from dataclasses import dataclass, field
from typing import Any

from model.config import ModelConfig, TrainConfig
from model.costs import flops_per_forward, loss_weights_problem, param_counts, train_flops_total
from store import NAME_RULE, is_safe_name
# BOUNDS and MAX_STEP_BYTES: also read from here (study.spec.grid.BOUNDS), as before bounds.py held them
from study.spec.bounds import BOUNDS, MAX_RUNS_ENV, MAX_STEP_BYTES, check_bounds, max_runs  # noqa: F401
from study.spec.gridfile import MAX_GRID_DEPTH, read_yaml, too_deep
from study.spec.points import check_keys, count_points, deep_update, mapping, points, satisfies
from study.spec.search import Search, load_best
from study.spec.sections import (GROUP_KEYS, LOOP_ONLY_TRAIN, SECTIONS, TOP_KEYS, TRAIN_BOOKKEEPING, Err, EvalConfig,
                                 GridError, Resources, aliases, canon_key, cut, short, validate)
from tasks import TASKS, TaskConfig, how_to_register, make_task


def sampling_depth(value: int | str, L: int) -> int:
    """A depth as a grid writes it (`eval.L_s`, `adaptive.max_loops`, `search.metric.L_s`): an integer, or
    'train' for the run's training depth L."""
    return L if value == "train" else value


def single_loop(train: TrainConfig) -> TrainConfig:
    """At L = 1 every loss over loops and every depth schedule is the same training (one loop, weight
    1, depth 1): written as loss 'all', schedule 'fixed' and the loop-only fields at their defaults,
    so those runs share one id and are trained once."""
    defaults = {k: TrainConfig.model_fields[k].default for k in LOOP_ONLY_TRAIN}
    return TrainConfig.model_validate({**train.model_dump(), **defaults})


def inert_train_fields(train: TrainConfig) -> set[str]:
    """Fields that cannot change the trained weights under this loss and schedule, so two runs
    differing only in them are one run (and one id): nothing is trained twice."""
    inert = {"truncate_k": train.loss != "truncated", "loss_weights": train.loss != "weighted",
             "min_depth": train.schedule == "fixed"}
    return {k for k, yes in inert.items() if yes}


@dataclass(frozen=True)
class Run:
    """One trained model and the evaluation points it owes."""

    study: str
    task: TaskConfig
    model: ModelConfig
    train: TrainConfig
    eval: EvalConfig
    resources: Resources
    retries: int
    group: str | None = None

    @property
    def training_config(self) -> dict:
        return {
            # fields that change the evaluation set only, never the trained model: not in the run id, but
            # in the key of every evaluation they shape (TaskConfig.eval_fields)
            "task": self.task.model_dump(exclude=self.task.eval_only_fields()),
            "model": self.model.model_dump(),
            "train": self.train.model_dump(exclude=TRAIN_BOOKKEEPING | inert_train_fields(self.train)),
        }

    @functools.cached_property  # fields are frozen; a plan of 10,000 runs asks for each id several times
    def run_id(self) -> str:
        return config_hash(self.training_config)

    def eval_points(self) -> list["EvalPoint"]:
        split = self.task.split_of(self.eval.split)
        data = tuple(sorted(self.task.eval_fields(self.eval.split).items()))
        pts = []
        common = dict(temperature=self.eval.temperature, remask=self.eval.remask, n_examples=self.eval.n_examples,
                      split=split, seed=self.eval.seed, data=data)
        for T, ls, smp in itertools.product(self.eval.T, self.eval.L_s, self.eval.sampler):
            pts.append(EvalPoint(T=T, L_s=sampling_depth(ls, self.model.L), sampler=smp, **common))
        for T, ad, smp in itertools.product(self.eval.T, self.eval.adaptive, self.eval.sampler):
            cap = sampling_depth(ad.max_loops, self.model.L)
            if cap >= 2:  # 'train' at L = 1: one loop leaves nothing to adapt
                pts.append(EvalPoint(T=T, L_s=cap, sampler=smp, adaptive=ad.threshold, **common))
        return sorted(set(pts), key=lambda p: (p.sampler, p.adaptive is not None, p.adaptive or 0, p.L_s, p.T))

    def resolved(self) -> dict:
        """Everything about this run, as stored beside its results (`task_eval`: the task's
        evaluation-only fields, which the run id leaves out)."""
        return {"run_id": self.run_id, "study": self.study, "group": self.group, **self.training_config,
                "task_eval": self.task.model_dump(include=self.task.eval_only_fields()),
                "eval": self.eval.model_dump(), "resources": self.resources.model_dump(), "retries": self.retries}

    def costs(self) -> dict:
        """Parameters and FLOPs, counted by the model itself (built on the meta device: no memory).

        They depend on the task and the model only: runs differing in seed, lr, steps... share one
        count (a 10,000-run sweep over seeds builds a handful of models, not 10,000)."""
        return dict(_costs(self.task.name, self.task.model_dump_json(), self.model.model_dump_json()))

    def train_flops(self) -> int:
        """Model FLOPs of the whole training run (the depth schedule included), shared like `costs`
        by runs whose task, model and step-shaping training fields agree (lr, seed... do not count,
        except the seed of a stochastic schedule, which draws each step's depth)."""
        drop = set(_FLOP_FREE_TRAIN) | ({"seed"} if self.train.schedule != "stochastic" else set())
        return _train_flops(self.task.name, self.task.model_dump_json(), self.model.model_dump_json(),
                            self.train.model_dump_json(exclude=drop))


# training fields that never change a step's FLOPs (nor which depth a step runs)
_FLOP_FREE_TRAIN = ("lr", "weight_decay", "warmup", "min_lr_ratio", "grad_clip", "precision", "checkpoint_every",
                    "log_every")


@functools.lru_cache(maxsize=4096)
def _train_flops(task_name: str, task_json: str, model_json: str, train_json: str) -> int:
    task = make_task(TASKS[task_name][0].model_validate_json(task_json))
    return train_flops_total(ModelConfig.model_validate_json(model_json), TrainConfig.model_validate_json(train_json),
                             len(task.pos_ids()), task.vocab_size)


@functools.lru_cache(maxsize=4096)
def _costs(task_name: str, task_json: str, model_json: str) -> tuple:
    task = make_task(TASKS[task_name][0].model_validate_json(task_json))
    cfg = ModelConfig.model_validate_json(model_json)  # counted from the config: no torch (model/costs.py)
    counts = param_counts(cfg, task.vocab_size, task.pos_sizes())
    return (("n_params", counts["total"]), ("n_params_non_embedding", counts["non_embedding"]),
            ("flops_per_forward", flops_per_forward(cfg, len(task.pos_ids()), task.vocab_size)))


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation of a trained run. Its key holds everything that changes the result (the run id
    is beside it in the store), so a changed field is a new evaluation, never a stale one."""

    T: int
    L_s: int
    sampler: str
    temperature: float
    remask: float
    n_examples: int
    split: str  # the split actually read ('test' | 'val'), as stored in the evals rows
    seed: int
    data: tuple[tuple[str, Any], ...] = ()  # the task's evaluation-only fields that shape this split
    adaptive: float | None = None  # adaptive depth: its settling threshold, L_s being the cap; None: fixed L_s

    @property
    def key(self) -> str:
        fields = {**self.__dict__, "data": dict(self.data)}
        if self.adaptive is None:
            del fields["adaptive"]  # fixed-depth keys stay those stored before adaptive points existed
        mode = "" if self.adaptive is None else "-adaptive"
        return f"T{self.T}-Ls{self.L_s}-{self.sampler}{mode}-{config_hash(fields)[:8]}"

    @property
    def label(self) -> str:
        """The evals rows' `sampler`: the unmasking rule, and for adaptive depth its threshold
        (`confidence+adaptive(0.9)`), so the report tells adaptive points from fixed ones."""
        return self.sampler if self.adaptive is None else f"{self.sampler}+adaptive({self.adaptive:g})"


def config_hash(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class SearchGroup:
    """One Optuna study of a search grid: a point of the grid (its base run) and the name it is stored under."""

    name: str
    point: dict
    run: Run


def search_group_name(grid_group: str | None, point: dict, study: str) -> str:
    """Name of a search group: the grid group's name and the values of its point, e.g. 'K1_L3'."""
    short_names = {v: k for k, v in aliases().items()}
    parts = ([grid_group] if grid_group is not None else []) + [f"{short_names.get(k, k)}{v}" for k, v in point.items()]
    return "_".join(str(p) for p in parts) or study


@dataclass
class Grid:
    path: str
    study: str
    runs: list[Run]
    raw: dict = field(default_factory=dict)
    search: Search | None = None  # the `search:` section (study/spec/search.py), when the grid has one
    search_groups: list[SearchGroup] = field(default_factory=list)  # one Optuna study each
    tuned: dict = field(default_factory=dict)  # run_id -> {key: {value, file, group}} from `defaults_from`
    overrides: list = field(default_factory=list)  # command-line `key=value` applied to raw (study/spec/overrides.py)
    claims: typing.Any = None  # the `claims:` and `seeds:` sections (study/spec/claims.py Claims), when present


def load_grid(path: str, overrides: typing.Sequence[str] = ()) -> Grid:
    """Read, validate and expand a grid file, after command-line `overrides` (study/spec/overrides.py: applied
    to the file's mapping, then the same checks as a file). Raises GridError naming file (or override) and key."""
    from study.spec.overrides import OverrideError, apply, attribute, parse, show

    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise GridError(f"{path}: a grid is a mapping with keys {sorted(TOP_KEYS)}")
    if not overrides:
        return expand(raw, path)
    try:
        raw, claims = apply(raw, parse(overrides), path)
    except OverrideError as e:
        raise GridError(str(e)) from None
    if too_deep(raw, MAX_GRID_DEPTH):
        raise GridError(f"{path} with overrides: nested deeper than {MAX_GRID_DEPTH} levels")
    try:
        grid = expand(raw, path)
    except GridError as e:
        raise GridError(attribute(str(e), path, overrides, claims)) from None
    for ov, keys in claims:  # best values of a search (defaults_from) win over the sections
        fields = {k for k in keys if "." in k and not k.startswith(("axes.", "groups"))}
        for run_id, src in grid.tuned.items():
            hit = fields & set(src)
            if hit:
                k = sorted(hit)[0]
                raise GridError(f"override {show(ov.text)}: {k} is taken from {src[k].get('file')} by defaults_from "
                                f"for run {run_id} (and wins there): remove defaults_from (~defaults_from) to set it")
    grid.overrides = list(overrides)
    return grid


def _group_specs(raw: dict, err: Err) -> list[tuple[str | None, dict, str]]:
    """(group name, its mapping, its key prefix) of each group of the grid (the grid itself without `groups`)."""
    groups = raw.get("groups")
    if groups is None:
        specs = [(None, raw, "")]
    else:
        if not isinstance(groups, list) or not groups:
            err("groups", "must be a non-empty list of group mappings")
        specs = []
        for i, g in enumerate(groups):
            where = f"groups[{i}]"
            if not isinstance(g, dict):
                err(where, "must be a mapping")
            check_keys(g, GROUP_KEYS, where + ".", err)
            gname = str(g.get("name", i))
            twin = next((w for n, _, w in specs if n == gname), None)
            if twin is not None:  # their runs would be stored, reported and searched as one group
                err(where + ".name", f"group name {short(gname)} is also the name of {twin.rstrip('.')}: "
                                     f"give each group its own name")
            specs.append((gname, g, where + "."))
        for k in ("axes", "couple", "constraints", "include", "exclude"):
            if k in raw:
                err(k, "cannot be used at the top level together with `groups`: put it in each group")
    return specs


def expand(raw: dict, path: str = "grid.yaml") -> Grid:
    err = Err(path)
    check_keys(raw, TOP_KEYS, "", err)
    study = raw.get("study") or os.path.splitext(os.path.basename(path))[0]
    if not is_safe_name(study):  # the store's rule: a name that passes here opens as a Store
        err("study", f"must be a plain name: {NAME_RULE} (got {study!r})")
    retries = raw.get("retries", 2)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        err("retries", f"must be an integer >= 0 (got {short(retries)})")
    base = {s: mapping(raw.get(s, {}), s, err) for s in SECTIONS}
    specs = _group_specs(raw, err)
    search = validate(Search, raw["search"], "search", err) if "search" in raw else None
    runs: dict[str, Run] = {}
    search_groups: dict[str, SearchGroup] = {}
    tuned: dict[str, dict] = {}
    cap, counted = max_runs(), 0
    for _, spec, where in specs:  # counted before anything is expanded (a 6 KB grid can ask for 10^6 runs)
        counted += count_points(spec, where, err)
        if counted > cap:
            err(where + "axes", f"{counted:,} points to expand (the product of the axes and couple lists, plus "
                                f"include, before constraints and exclude), beyond the bound {cap:,} "
                                f"(study/spec/bounds.py BOUNDS['grid.runs']; set ${MAX_RUNS_ENV} to allow more)")
    for name, spec, where in specs:
        sections = copy.deepcopy(base)
        if name is not None:
            for s in SECTIONS:
                deep_update(sections[s], mapping(spec.get(s, {}), where + s, err))
        df_where = where + "defaults_from" if "defaults_from" in spec else "defaults_from"
        best = None
        if raw.get("defaults_from") is not None or spec.get("defaults_from") is not None:
            best = load_best(spec.get("defaults_from", raw.get("defaults_from")), df_where, err)
        resolve = functools.partial(_resolve, sections, study, retries, name, err)  # a point -> its Run
        for point, included in points(spec, where, err):
            run = resolve(point)
            source = {}
            if best is not None:  # best values of a search override the sections, never an axis
                gname, values = best[0].pick(best[1], run, df_where, err)
                for k in values:
                    if k in point:
                        err(df_where, f"{k} comes from {best[0].file} (group {gname}) and is also an axis here")
                run = resolve({**values, **point})
                source = {k: {"value": v, "file": best[0].file, "group": gname} for k, v in values.items()}
            if not included and not _constraints_hold(run, spec, where, err):
                continue  # a constraint on a value that no axis of this point set: checked once resolved
            if search is not None:
                for k in set(source) & set(search.params):
                    err(f"search.params.{k}", f"{k} is also taken from {best[0].file} by defaults_from")
                _check_search_point(search, point, run, resolve, err)
                gname = search_group_name(name, point, study)
                if gname in search_groups and search_groups[gname].run.run_id != run.run_id:
                    err(where + "axes", f"two search groups would be named {gname!r}: give the grid groups names")
                search_groups.setdefault(gname, SearchGroup(gname, point, run))
            runs.setdefault(run.run_id, run)  # identical training configs are one run
            if source:
                tuned[run.run_id] = source
    if not runs:
        err("axes", "the grid expands to no runs (check constraints / exclude)")
    from study.spec.claims import parse_claims

    claims = parse_claims(raw, list(runs.values()), err)
    if claims is not None:  # each model at the first `seeds.min` seeds; study/engine/claims.py adds the others
        if search is not None:
            err("claims", "a search grid (`search:`) decides no claims: use a grid of fixed models")
        runs = {r.run_id: r for m in runs.values() for r in claims.seeds_of(m, claims.seeds.min)}
    return Grid(path=path, study=study, runs=list(runs.values()), raw=raw, search=search,
                search_groups=list(search_groups.values()), tuned=tuned, claims=claims)


def _check_search_point(search: Search, point: dict, run: Run, resolve, err: Err) -> None:
    """A searched key is never also an axis; every edge of every distribution gives a valid run."""
    for k in search.params:
        if k in point:
            err(f"search.params.{k}", f"{k} is also a grid-search axis of this grid: search it or sweep it, "
                                      f"not both")
    m = search.metric
    if m.name not in ("final_loss", "val_loss"):
        names = TASKS[run.task.name][1].metric_names_of()
        if m.name not in names:
            err("search.metric.name", f"unknown metric {m.name!r} for task {run.task.name}; allowed: "
                                      f"{', '.join(names)}, final_loss, val_loss")
        ls = sampling_depth(m.L_s, run.model.L)
        if not any((p.T, p.L_s, p.sampler) == (m.T, ls, m.sampler) for p in run.eval_points()):
            err("search.metric", f"the eval point T={m.T}, L_s={m.L_s}, sampler={m.sampler} is not in the grid's "
                                 f"`eval` section (T={run.eval.T}, L_s={run.eval.L_s}): add it there")
    if search.pruning is not None and search.pruning.grace_period >= run.train.steps:
        err("search.pruning.grace_period", f"must be below train.steps ({run.train.steps}): "
                                           f"otherwise no trial can be stopped")
    for k, d in search.params.items():
        for v in d.probes():
            try:
                resolve({**point, k: v})
            except GridError as e:
                err(f"search.params.{k}", f"the value {short(v)} gives an invalid run: {e}")


def _constraints_hold(run: Run, spec: dict, where: str, err: Err) -> bool:
    """The constraints on the resolved run: a key no axis sets takes its base (or default) value."""
    for i, c in enumerate(spec.get("constraints", [])):
        cw = f"{where}constraints[{i}]"
        values = {}
        for k in c["product"]:
            ck = canon_key(k, cw + ".product.", err)
            sec, fld = ck.split(".", 1)
            v = getattr(run, sec)
            for part in fld.split("."):
                if part not in type(v).model_fields:
                    err(f"{cw}.product", f"{k}: no such field; {sec} has: {', '.join(sorted(type(v).model_fields))}")
                v = getattr(v, part)
            values[ck] = v
        if not satisfies(values, c, cw, err):
            return False
    return True


def _resolve(sections: dict, study: str, retries: int, group: str | None, err: Err, point: dict) -> Run:
    s = copy.deepcopy(sections)
    for k, v in point.items():  # 'section.field' (canonical): the section is always there
        *head, last = k.split(".")
        cur = s
        for p in head:
            cur = cur.setdefault(p, {})
        cur[last] = v
    if s["task"].get("name") not in TASKS:
        err("task.name", f"unknown task {short(s['task'].get('name'))}; {how_to_register()}")
    cfg = {sec: validate(cls or TASKS[s["task"]["name"]][0], s[sec], sec, err) for sec, cls in SECTIONS.items()}
    task, model, ev = cfg["task"], cfg["model"], cfg["eval"]
    likelihood = TASKS[task.name][1].eval_mode == "likelihood"
    for key, fix in (("adaptive", "adaptive sampling depth does not apply (remove eval.adaptive)"),
                     ("at_checkpoints", "set eval.at_checkpoints to 0 (its training curves show the loss)")):
        if likelihood and getattr(ev, key):
            err(f"eval.{key}", f"task {task.name} is scored by its likelihood bound, not by sampling: {fix}")
    if model.L == 1:  # one loop: every loss and schedule trains the same model, under one id
        cfg["train"] = single_loop(cfg["train"])
    train = cfg["train"]
    if loss_weights_problem(train, model.L):
        err("train.loss_weights", loss_weights_problem(train, model.L))
    if train.loss == "truncated" and train.truncate_k > model.L:
        err("train.truncate_k", f"must be <= L ({model.L}) (got {train.truncate_k})")
    if train.min_depth > model.L:
        err("train.min_depth", f"must be <= L ({model.L}) (got {train.min_depth})")
    check_bounds(cfg, retries, err)  # before any model or data is built
    return Run(study=study, retries=retries, group=group, **cfg)


def check_data(grid: Grid) -> None:
    """Every run's task can make the data it asks for -- the training examples, the test split, and the
    validation split where the run's `eval.split` or the grid's search is scored on it -- asked of the
    task itself (`Task.check_data`), before anything is planned or dispatched: a trial would otherwise
    search without end for examples its generator cannot make. GridError naming file, key and bound."""
    from tasks import DataBoundError

    checked = set()
    for run in grid.runs:
        splits = ("test", run.eval.split) + ((grid.search.split,) if grid.search is not None else ())
        splits = tuple(dict.fromkeys(splits))
        key = (run.task.model_dump_json(), splits)
        if key in checked:
            continue
        checked.add(key)
        try:
            make_task(run.task).check_data(splits)
        except DataBoundError as e:
            raise GridError(cut(f"{grid.path}: key '{e.key}': {e.msg}")) from None
