"""YAML grid -> validated list of runs.

A grid has base sections (`task`, `model`, `train`, `eval`, `resources`) and says how they
vary: `axes` (a product over dotted keys), `couple` (lists of points whose values vary
together, e.g. an iso-FLOP family of (K, L)), `constraints` (declarative filters such as
K*L = 30), `include` / `exclude` points, and `groups` (per-group overrides with their own
axes). Everything is validated before anything runs: an error names the file, the key and
the allowed values. YAML is `safe_load`ed; nothing in a grid is ever evaluated.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import math
import os
import reprlib
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator

from model.config import ModelConfig, Strict, TrainConfig
from model.costs import train_flops_total
from model.rmdm import RecursiveDenoiser, SeqSpec
from store import NAME_RULE, is_safe_name
from tasks import TASKS, TaskConfig, make_task


class GridError(ValueError):
    """A grid that cannot be run, with file and key in the message."""


def sampling_depth(value: int | str, L: int) -> int:
    """A depth as a grid writes it (`eval.L_s`, `adaptive.max_loops`, `search.metric.L_s`): an integer, or
    'train' for the run's training depth L."""
    return L if value == "train" else value


class Adaptive(Strict):
    """An adaptive-depth sampling point: loop until the predictions settle (argmax over the masked
    positions unchanged since the previous loop, confidence at each >= threshold), at most
    `max_loops` a denoising step (model/sampler.py)."""

    max_loops: int | Literal["train"] = Field(description="the cap L_s: an integer >= 2, or 'train' (L_t; "
                                                          "no adaptive point for a run trained at L = 1)")
    threshold: float = Field(gt=0, le=1, description="confidence (max softmax probability) every masked "
                                                     "position must reach")

    @field_validator("max_loops", "threshold", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("a number is meant here, not a boolean")
        return v

    @field_validator("max_loops")
    @classmethod
    def _cap(cls, v: int | str) -> int | str:
        if v != "train" and v < 2:
            raise ValueError("must be an integer >= 2 or 'train': one loop leaves nothing to compare")
        return v


class EvalConfig(Strict):
    """Evaluation points of every run; not part of the run id."""

    T: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    L_s: list[int | Literal["train"]] = Field(default_factory=lambda: ["train"])
    sampler: list[Literal["confidence", "random"]] = Field(default_factory=lambda: ["confidence"])
    temperature: float = Field(0.0, ge=0)
    remask: float = Field(0.0, ge=0, lt=1)
    n_examples: int = Field(200, ge=1)
    split: Literal["test", "val"] = Field("test", description="'val': the task's validation split (for selection)")
    seed: int = 0
    n_samples_kept: int = Field(50, ge=0, description="examples per eval point written to the samples table")
    # adaptive-depth points, each crossed with T and sampler, beside the fixed L_s ones
    adaptive: list[Adaptive] = Field(default_factory=list)

    @field_validator("T")
    @classmethod
    def _t(cls, v: list[int]) -> list[int]:
        if not v or min(v) < 1:
            raise ValueError(f"T values must be integers >= 1 (got {v})")
        return v

    @field_validator("L_s")
    @classmethod
    def _ls(cls, v: list) -> list:
        if not v or any(x != "train" and x < 1 for x in v):
            raise ValueError(f"L_s values must be integers >= 1 or 'train' (got {v})")
        return v


class Resources(Strict):
    cpu: float = Field(1, gt=0)
    gpu: float = Field(0, ge=0, description="fractions allowed: several small trials share a GPU")
    # a trial that asked for a GPU on a node without CUDA fails (never a silent CPU run), unless this is true
    allow_cpu_fallback: bool = False


SECTIONS: dict[str, type[BaseModel] | None] = {
    "task": None,  # depends on the task name; see _task_config
    "model": ModelConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "resources": Resources,
}
ALIASES = {
    "K": "model.K", "L": "model.L", "d_model": "model.d_model", "seed": "train.seed", "lr": "train.lr",
    "loss": "train.loss", "schedule": "train.schedule", "steps": "train.steps", "mask_rate": "task.mask_rate",
}
TOP_KEYS = {"study", "description", "retries", "axes", "couple", "constraints", "include", "exclude", "groups",
            "search", "defaults_from", *SECTIONS}  # search / defaults_from: see study/search.py
GROUP_KEYS = {"name", "axes", "couple", "constraints", "include", "exclude", "defaults_from", *SECTIONS}
TRAIN_BOOKKEEPING = {"checkpoint_every", "log_every"}  # do not change the trained weights
LOOP_ONLY_TRAIN = ("loss", "loss_weights", "truncate_k", "schedule", "min_depth")


def single_loop(train: TrainConfig) -> TrainConfig:
    """At L = 1 every loss over loops and every depth schedule is the same training (one loop, weight
    1, depth 1): written as loss 'all', schedule 'fixed' and the loop-only fields at their defaults,
    so those runs share one id and are trained once."""
    defaults = {k: TrainConfig.model_fields[k].default for k in LOOP_ONLY_TRAIN}
    return TrainConfig.model_validate({**train.model_dump(), **defaults})


def inert_train_fields(train: TrainConfig) -> set[str]:
    """Fields that cannot change the trained weights under this loss and schedule, so two runs
    differing only in them are one run (and one id): nothing is trained twice."""
    inert = set()
    if train.loss != "truncated":
        inert.add("truncate_k")
    if train.loss != "weighted":
        inert.add("loss_weights")
    if train.schedule == "fixed":
        inert.add("min_depth")
    return inert


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
    with torch.device("meta"):
        m = RecursiveDenoiser(ModelConfig.model_validate_json(model_json),
                              SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes()))
    counts = m.param_counts()
    return (("n_params", counts["total"]), ("n_params_non_embedding", counts["non_embedding"]),
            ("flops_per_forward", m.flops_per_forward()))


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


@dataclass
class Grid:
    path: str
    study: str
    runs: list[Run]
    raw: dict = field(default_factory=dict)
    search: Any = None  # study.search.Search when the grid has a `search:` section
    search_groups: list = field(default_factory=list)  # study.search.SearchGroup, one Optuna study each
    tuned: dict = field(default_factory=dict)  # run_id -> {key: {value, file, group}} from `defaults_from`
    overrides: list = field(default_factory=list)  # command-line `key=value` applied to raw (study/overrides.py)


# ---- loading -----------------------------------------------------------------------------
class GridLoader(yaml.SafeLoader):
    """`yaml.safe_load` that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *defaults`: keys given here override merged ones, as YAML intends
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: SafeLoader reports it itself
                if first is not key_node:  # by node: `{d_model: 16, d_model: 32}` is one line, two keys
                    at, again = first.start_mark, key_node.start_mark
                    where = (f"line {at.line + 1} column {at.column + 1}, again at column {again.column + 1}"
                             if at.line == again.line else f"line {at.line + 1}, again at line {again.line + 1}")
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {_short(key)} (first at {where}): give each key once",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


# A grid file is read whole before parsing, within these bounds (a hostile or mistaken file -- a
# FIFO, /dev/zero, a 50 MB line, a structure nested thousands deep -- is refused in one line, never
# read without end): the largest grid shipped is a few kB.
MAX_GRID_BYTES = 1 << 20  # 1 MiB
MAX_GRID_LINE = 1 << 16  # characters a line
MAX_GRID_DEPTH = 32  # nested mappings / lists


def read_regular_file(path: str, what: str, max_bytes: int | None = None, exc: type[Exception] = ValueError):
    """A binary file object of `path` once it is known to be a regular file (of at most `max_bytes`):
    opened without blocking (a FIFO with no writer would wait forever), refused otherwise with `exc`
    naming the file (a directory, a FIFO, a device such as /dev/zero, a socket)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise exc(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise exc(f"{path}: is a directory, not a {what}") from None
    except OSError as e:
        raise exc(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise exc(f"{path}: is a directory, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                    or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
            raise exc(f"{path}: is {kind}, not a regular file: give a {what}")
        if max_bytes is not None and st.st_size > max_bytes:
            raise exc(f"{path}: {st.st_size:,} bytes; a {what} is at most {max_bytes:,} bytes")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def grid_file_text(path: str) -> str:
    """The text of grid file `path`, within MAX_GRID_BYTES and MAX_GRID_LINE (GridError otherwise)."""
    f = read_regular_file(path, "grid file", MAX_GRID_BYTES, GridError)
    lines, total = [], 0
    with f:
        for ln, line in enumerate(iter(lambda: f.readline(MAX_GRID_LINE * 4 + 1), b""), 1):
            total += len(line)
            if total > MAX_GRID_BYTES:  # grew while read
                raise GridError(f"{path}: more than {MAX_GRID_BYTES:,} bytes; a grid file is at most that")
            if len(line) > MAX_GRID_LINE and len(line.rstrip(b"\r\n").decode("utf-8", "replace")) > MAX_GRID_LINE:
                raise GridError(f"{path}:{ln}: a line longer than {MAX_GRID_LINE:,} characters; break it up "
                                f"(YAML lists and mappings may span lines)")
            lines.append(line)
    try:
        return b"".join(lines).decode("utf-8")
    except UnicodeDecodeError as e:
        raise GridError(f"{path}: not a YAML text file (not UTF-8 at byte {e.start})") from None


def too_deep(obj: Any, limit: int) -> bool:
    """Whether `obj` nests mappings / lists deeper than `limit` (iteratively: no recursion)."""
    stack = [(obj, 0)]
    seen: set[int] = set()
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d >= limit:
                return True
            if id(v) in seen:  # a YAML alias: the same object, already walked
                continue
            seen.add(id(v))
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
            if isinstance(v, dict):
                stack.extend((k, d + 1) for k in v)
    return False


def _yaml_error(path: str, e: yaml.YAMLError) -> str:
    """One line: file:line:column, what YAML expected and what it found."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
    what = "; ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
    return f"{where}: not valid YAML: {' '.join(what.split())}"


def safe_yaml(text: str):
    """Parse YAML text with GridLoader (a yaml.SafeLoader subclass that also refuses a key given twice):
    plain data only, nothing is constructed. Raises yaml.YAMLError, or RecursionError when nested too deeply."""
    loader = GridLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_grid(path: str, overrides: typing.Sequence[str] = ()) -> Grid:
    """Read, validate and expand a grid file, after command-line `overrides` (study/overrides.py).
    Raises GridError naming file (or override) and key."""
    text = grid_file_text(path)
    try:
        raw = safe_yaml(text)
    except RecursionError:
        raise GridError(f"{path}: nested too deeply to read (a grid nests a few levels; at most "
                        f"{MAX_GRID_DEPTH})") from None
    except yaml.YAMLError as e:
        raise GridError(_cut(_yaml_error(path, e))) from None
    if too_deep(raw, MAX_GRID_DEPTH):
        raise GridError(f"{path}: nested deeper than {MAX_GRID_DEPTH} levels of mappings and lists; a grid nests "
                        f"a few")
    if not isinstance(raw, dict):
        raise GridError(f"{path}: a grid is a mapping with keys {sorted(TOP_KEYS)}")
    if overrides:  # applied to the file's mapping, then the same checks as a file (study/overrides.py)
        from study.overrides import expand_with

        return expand_with(raw, path, overrides)
    return expand(raw, path)


def expand(raw: dict, path: str = "grid.yaml") -> Grid:
    err = _Err(path)
    _check_keys(raw, TOP_KEYS, "", err)
    study = raw.get("study") or os.path.splitext(os.path.basename(path))[0]
    if not is_safe_name(study):  # the store's rule: a name that passes here opens as a Store
        err("study", f"must be a plain name: {NAME_RULE} (got {study!r})")
    retries = raw.get("retries", 2)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        err("retries", f"must be an integer >= 0 (got {_short(retries)})")
    base = {s: _mapping(raw.get(s, {}), s, err) for s in SECTIONS}
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
            _check_keys(g, GROUP_KEYS, where + ".", err)
            gname = str(g.get("name", i))
            twin = next((w for n, _, w in specs if n == gname), None)
            if twin is not None:  # their runs would be stored, reported and searched as one group
                err(where + ".name", f"group name {_short(gname)} is also the name of {twin.rstrip('.')}: "
                                     f"give each group its own name")
            specs.append((gname, g, where + "."))
        for k in ("axes", "couple", "constraints", "include", "exclude"):
            if k in raw:
                err(k, "cannot be used at the top level together with `groups`: put it in each group")
    search = None
    if "search" in raw:
        from study import search as sch

        search = sch.parse_search(raw["search"], err, _canon_key, _validate, Resources)
    runs: dict[str, Run] = {}
    search_groups: dict[str, Any] = {}
    tuned: dict[str, dict] = {}
    for name, spec, where in specs:
        sections = copy.deepcopy(base)
        if name is not None:
            for s in SECTIONS:
                _deep_update(sections[s], _mapping(spec.get(s, {}), where + s, err))
        df_where = where + "defaults_from" if "defaults_from" in spec else "defaults_from"
        best = None
        if raw.get("defaults_from") is not None or spec.get("defaults_from") is not None:
            from study import search as sch

            best = sch.load_best(spec.get("defaults_from", raw.get("defaults_from")), df_where, err, _canon_key)
        for point, included in _points(spec, where, err):
            run = _resolve(sections, point, study, retries, name, err)
            source = {}
            if best is not None:  # best values of a search override the sections, never an axis
                gname, values = best[0].pick(best[1], run, df_where, err)
                for k in values:
                    if k in point:
                        err(df_where, f"{k} comes from {best[0].file} (group {gname}) and is also an axis here")
                run = _resolve(sections, {**values, **point}, study, retries, name, err)
                source = {k: {"value": v, "file": best[0].file, "group": gname} for k, v in values.items()}
            if not included and not _constraints_hold(run, spec, where, err):
                continue  # a constraint on a value that no axis of this point set: checked once resolved
            if search is not None:
                for k in set(source) & set(search.params):
                    err(f"search.params.{k}", f"{k} is also taken from {best[0].file} by defaults_from")
                _check_search_point(search, sections, point, study, retries, name, run, err)
                gname = sch.group_name(name, point, study)
                if gname in search_groups and search_groups[gname].run.run_id != run.run_id:
                    err(where + "axes", f"two search groups would be named {gname!r}: give the grid groups names")
                search_groups.setdefault(gname, sch.SearchGroup(gname, point, run))
            runs.setdefault(run.run_id, run)  # identical training configs are one run
            if source:
                tuned[run.run_id] = source
    if not runs:
        err("axes", "the grid expands to no runs (check constraints / exclude)")
    return Grid(path=path, study=study, runs=list(runs.values()), raw=raw, search=search,
                search_groups=list(search_groups.values()), tuned=tuned)


def _check_search_point(search, sections: dict, point: dict, study: str, retries: int, group: str | None,
                        run: Run, err: _Err) -> None:
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
                _resolve(sections, {**point, k: v}, study, retries, group, err)
            except GridError as e:
                err(f"search.params.{k}", f"the value {_short(v)} gives an invalid run: {e}")


class _Err:
    def __init__(self, path: str):
        self.path = path

    def __call__(self, key: str, msg: str):
        raise GridError(_cut(f"{self.path}: key '{_cut(key, 200)}': {msg}"))


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 8, 120, 120


def _short(v: Any, limit: int = 300) -> str:
    """repr of a grid value for a message, a few hundred characters at most: a YAML alias bomb
    expands to megabytes, and reprlib never builds the whole repr."""
    return _cut(_REPR.repr(v), limit)


def _cut(text: str, limit: int = 1000) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit - 40]}... ({len(text):,} characters in all)"


def _bool_for_number(cls: type[BaseModel], d: dict, key: str, err: _Err) -> None:
    """pydantic reads `K: true` as K = 1: refuse a boolean wherever the field does not take booleans."""
    no_bool, subs = _bool_fields(cls)
    for name, v in d.items():
        if name in no_bool and (isinstance(v, bool) or (isinstance(v, list) and any(isinstance(x, bool) for x in v))):
            err(f"{key}.{name}", f"a number is meant here, not a boolean (got {_short(v)})")
        if name in subs and isinstance(v, dict):
            _bool_for_number(subs[name], v, f"{key}.{name}", err)


@functools.lru_cache(maxsize=None)
def _bool_fields(cls: type[BaseModel]) -> tuple[frozenset, dict]:
    """(fields that take no boolean, {field: nested model class}) of a config class."""
    no_bool = frozenset(k for k, f in cls.model_fields.items() if not _takes_bool(f.annotation))
    subs = {k: t for k, f in cls.model_fields.items() if (t := _model_type(f.annotation)) is not None}
    return no_bool, subs


def _leaves(ann: Any) -> list:
    args = typing.get_args(ann)
    if typing.get_origin(ann) is Literal:
        return [type(a) for a in args]
    return [x for a in args for x in _leaves(a)] if args else [ann]


def _takes_bool(ann: Any) -> bool:
    return any(t in (bool, Any, object) for t in _leaves(ann))


def _model_type(ann: Any):
    return next((t for t in _leaves(ann) if isinstance(t, type) and issubclass(t, BaseModel)), None)


def _mapping(v: Any, key: str, err: _Err) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        err(key, f"must be a mapping (got {type(v).__name__})")
    return copy.deepcopy(v)


def _check_keys(d: dict, allowed: set[str], where: str, err: _Err) -> None:
    for k in d:
        if k not in allowed:
            err(f"{where}{k}", f"unknown key; allowed: {', '.join(sorted(allowed))}")


def _deep_update(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = v


def _canon_key(key: str, where: str, err: _Err) -> str:
    if not isinstance(key, str):  # `axes: {1: [1]}`: YAML reads the key as a number
        err(where + _short(key), f"an axis key is a name ('section.field' or a short name such as K), "
                                 f"not {type(key).__name__} {_short(key)}")
    key = ALIASES.get(key, key)
    sec, _, fld = key.partition(".")
    if sec not in SECTIONS or not fld:
        err(where + key, f"axis keys are 'section.field' with section in {sorted(SECTIONS)} "
                         f"or one of the short names {sorted(ALIASES)}")
    if sec == "eval":
        err(where + key, "evaluation points are listed in the `eval` section (T, L_s, sampler), not as axes: "
                         "they do not define new runs")
    return key


def _point(d: Any, where: str, err: _Err) -> dict:
    if not isinstance(d, dict) or not d:
        err(where, "a point is a non-empty mapping of axis key -> value")
    out: dict = {}
    for k, v in d.items():
        ck = _canon_key(k, where + ".", err)
        if ck in out:  # `{L: 2, model.L: 3}`: one field given twice, one value would be dropped
            err(f"{where}.{k}", f"names {ck} again: give each field once")
        out[ck] = v
    return out


def _points(spec: dict, where: str, err: _Err) -> list[tuple[dict, bool]]:
    """(point, listed in `include`?): included points are taken as written, past the constraints."""
    axes = _mapping(spec.get("axes", {}), where + "axes", err)
    lists, named = [], {}
    for k, vals in axes.items():
        ck = _canon_key(k, where + "axes.", err)
        if ck in named:  # `L` and `model.L`: one axis would silently replace the other
            err(f"{where}axes.{k}", f"names the same field as axis {named[ck]!r} ({ck}): give it once")
        named[ck] = k
        if not isinstance(vals, list) or not vals:
            err(f"{where}axes.{k}", f"must be a non-empty list of values (got {_short(vals)})")
        lists.append([{ck: v} for v in vals])
    couple = spec.get("couple", [])
    if not isinstance(couple, list):
        err(where + "couple", "must be a list of lists of points, e.g. [[{K: 6, L: 5}, {K: 30, L: 1}]]")
    for i, fam in enumerate(couple):
        if not isinstance(fam, list) or not fam:
            err(f"{where}couple[{i}]", "must be a non-empty list of points")
        lists.append([_point(p, f"{where}couple[{i}][{j}]", err) for j, p in enumerate(fam)])
    points = [dict(kv for d in combo for kv in d.items()) for combo in itertools.product(*lists)] if lists else [{}]
    for i, c in enumerate(_as_list(spec.get("constraints", []), where + "constraints", err)):
        points = [p for p in points if _satisfies(p, c, f"{where}constraints[{i}]", err)]
    excl = [_point(p, f"{where}exclude[{i}]", err)
            for i, p in enumerate(_as_list(spec.get("exclude", []), where + "exclude", err))]
    points = [p for p in points if not any(all(p.get(k) == v for k, v in e.items()) for e in excl)]
    included = [_point(p, f"{where}include[{i}]", err)
                for i, p in enumerate(_as_list(spec.get("include", []), where + "include", err))]
    return [(p, False) for p in points] + [(p, True) for p in included]


def _constraints_hold(run: Run, spec: dict, where: str, err: _Err) -> bool:
    """The constraints on the resolved run: a key no axis sets takes its base (or default) value."""
    sections = {"task": run.task, "model": run.model, "train": run.train, "eval": run.eval,
                "resources": run.resources}
    for i, c in enumerate(spec.get("constraints", [])):
        cw = f"{where}constraints[{i}]"
        values = {}
        for k in c["product"]:
            ck = _canon_key(k, cw + ".product.", err)
            sec, fld = ck.split(".", 1)
            v = sections[sec]
            for part in fld.split("."):
                if part not in type(v).model_fields:
                    err(f"{cw}.product", f"{k}: no such field; {sec} has: {', '.join(sorted(type(v).model_fields))}")
                v = getattr(v, part)
            values[ck] = v
        if not _satisfies(values, c, cw, err):
            return False
    return True


def _as_list(v: Any, key: str, err: _Err) -> list:
    if not isinstance(v, list):
        err(key, "must be a list")
    return v


def _satisfies(point: dict, c: Any, where: str, err: _Err) -> bool:
    """Declarative constraint: {product: [keys], equals|max|min: number}."""
    if not isinstance(c, dict) or "product" not in c or not (set(c) - {"product"}) <= {"equals", "max", "min"} \
            or len(c) < 2:
        err(where, "a constraint is {product: [keys...], equals|min|max: number}")
    keys = [_canon_key(k, where + ".product.", err) for k in c["product"]]
    vals = [point.get(k) for k in keys]
    if any(v is None for v in vals):
        return True  # not decided by this point's axes: the base value applies; checked after resolve
    try:
        prod = math.prod(vals)
    except TypeError:
        err(where, f"product of non-numbers {vals}")
    return (("equals" not in c or prod == c["equals"]) and ("max" not in c or prod <= c["max"])
            and ("min" not in c or prod >= c["min"]))


def _task_config(d: dict, key: str, err: _Err) -> TaskConfig:
    name = d.get("name")
    if name not in TASKS:
        err(f"{key}.name", f"unknown task {_short(name)}; known tasks: {', '.join(sorted(TASKS))}")
    return _validate(TASKS[name][0], d, key, err)


def _validate(cls: type[BaseModel], d: dict, key: str, err: _Err):
    if isinstance(d, dict):
        _bool_for_number(cls, d, key, err)
    try:
        return cls.model_validate(d)
    except ValidationError as e:
        errs = e.errors()
        # a misspelt key first: it explains the 'Field required' pydantic reports beside it
        first = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])
        loc = ".".join(str(x) for x in first["loc"])
        full = f"{key}.{loc}" if loc else key
        if first["type"] == "extra_forbidden":
            owner = cls  # the (nested) model that holds the key, e.g. Adaptive for eval.adaptive.0.x
            for part in first["loc"][:-1]:
                f = owner.model_fields.get(part) if isinstance(part, str) else None
                owner = (_model_type(f.annotation) or owner) if f is not None else owner
            err(full, f"unknown key; allowed: {', '.join(sorted(owner.model_fields))}")
        err(full, f"{first['msg']} (got {_short(first.get('input'))})")


def _resolve(sections: dict, point: dict, study: str, retries: int, group: str | None, err: _Err) -> Run:
    s = copy.deepcopy(sections)
    for k, v in point.items():
        sec, fld = k.split(".", 1)
        cur = s[sec]
        parts = fld.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = v
    task = _task_config(s["task"], "task", err)
    model = _validate(ModelConfig, s["model"], "model", err)
    train = _validate(TrainConfig, s["train"], "train", err)
    ev = _validate(EvalConfig, s["eval"], "eval", err)
    res = _validate(Resources, s["resources"], "resources", err)
    if ev.adaptive and TASKS[task.name][1].eval_mode == "likelihood":
        err("eval.adaptive", f"task {task.name} is scored by its likelihood bound, not by sampling: "
                             "adaptive sampling depth does not apply (remove eval.adaptive)")
    if model.L == 1:  # one loop: every loss and schedule trains the same model, under one id
        train = single_loop(train)
    if train.loss == "weighted" and train.loss_weights is not None and len(train.loss_weights) != model.L:
        err("train.loss_weights", f"needs one weight per loop: {model.L} values for L={model.L} "
                                  f"(got {len(train.loss_weights)})")
    if train.loss == "truncated" and train.truncate_k > model.L:
        err("train.truncate_k", f"must be <= L ({model.L}) (got {train.truncate_k})")
    if train.min_depth > model.L:
        err("train.min_depth", f"must be <= L ({model.L}) (got {train.min_depth})")
    _check_bounds(task, model, train, ev, res, retries, err)  # before any model or data is built
    return Run(study=study, task=task, model=model, train=train, eval=ev, resources=res, retries=retries, group=group)


# ---- bounds --------------------------------------------------------------------------------
# Every size a grid sets is bounded here, before anything is built (a model of 100,000 layers, a
# width of 10^9 or a billion loops would take minutes to plan, or crash, or never finish): explicit
# caps far above any study this tool runs, and the estimate of a training step's peak memory
# (model/costs.train_step_memory with a lower bound of the parameters) against MAX_STEP_BYTES,
# more than any single device or host a trial runs on holds. Numbers must also be finite and fit
# a 64-bit integer (seeds are given to torch and numpy).
BOUNDS = {
    "model.K": 1024, "model.L": 1024, "model.d_model": 65536, "model.n_heads": 1024, "model.mlp_ratio": 64,
    "train.steps": 10_000_000, "train.batch_size": 1 << 20, "train.warmup": 10_000_000,
    "train.truncate_k": 1024, "train.min_depth": 1024, "train.checkpoint_every": 10_000_000,
    "train.log_every": 10_000_000, "eval.T": 65536, "eval.L_s": 1024, "eval.n_examples": 10_000_000,
    "eval.n_samples_kept": 10_000_000, "eval.adaptive.max_loops": 1024, "task.seq_len": 65536,
    "task.n_train": 100_000_000, "resources.cpu": 4096, "resources.gpu": 1024, "retries": 100,
}
MAX_STEP_BYTES = 1 << 40  # 1 TiB: a training step's estimated peak memory (weights, AdamW, activations)
MAX_SEQ_LEN = BOUNDS["task.seq_len"]


def _check_bounds(task: TaskConfig, model: ModelConfig, train: TrainConfig, ev: EvalConfig, res: Resources,
                  retries: int, err: _Err) -> None:
    sections = {"task": task, "model": model, "train": train, "eval": ev, "resources": res}
    for sec, cfg in sections.items():
        for key, v in _numbers(cfg.model_dump(), sec):
            if isinstance(v, float) and not math.isfinite(v):
                err(key, f"must be a finite number (got {v})")
            if isinstance(v, int) and abs(v) >= 1 << 63:
                err(key, f"must fit a 64-bit integer, |value| < 2^63 (got {_short(v)})")
            cap = BOUNDS.get(_unindexed(key))
            if cap is not None and isinstance(v, (int, float)) and v > cap:
                err(key, f"{_short(v)} is beyond the bound {cap:,} (study/grid.py BOUNDS: more than any "
                         f"study here can train or evaluate)")
    if retries > BOUNDS["retries"]:
        err("retries", f"{retries} is beyond the bound {BOUNDS['retries']}")
    seq_len, vocab = _task_shape(task.name, task.model_dump_json())
    if seq_len > MAX_SEQ_LEN:
        err("task", f"task {task.name} gives sequences of {seq_len:,} tokens; the bound is {MAX_SEQ_LEN:,} "
                    f"(study/grid.py BOUNDS)")
    from model.costs import train_step_memory

    d = model.d_model
    n_params = model.K * int((4 + 2 * model.mlp_ratio) * d * d) + (vocab + seq_len) * d  # a lower bound
    mem = train_step_memory(model, train, seq_len, vocab, n_params)["total"]
    if mem > MAX_STEP_BYTES:
        err("model", f"a training step needs about {mem / 2**30:,.0f} GiB (K={model.K}, L={model.L}, "
                     f"d_model={d}, batch_size={train.batch_size}, {seq_len} tokens; at least {n_params:,} "
                     f"parameters at 16 bytes each with AdamW, and the activations); the bound is "
                     f"{MAX_STEP_BYTES / 2**30:,.0f} GiB (study/grid.py MAX_STEP_BYTES)")


def _numbers(d: Any, key: str):
    """(dotted key, value) of every number in a dumped config, lists indexed (`eval.T[2]`)."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _numbers(v, f"{key}.{k}")
    elif isinstance(d, (list, tuple)):
        for i, v in enumerate(d):
            yield from _numbers(v, f"{key}[{i}]")
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        yield key, d


def _unindexed(key: str) -> str:
    import re

    return re.sub(r"\[\d+\]", "", key)


@functools.lru_cache(maxsize=256)
def _task_shape(task_name: str, task_json: str) -> tuple[int, int]:
    """(sequence length, vocabulary size) of a task, without its data (a text8 `seq_len` is checked
    before its position ids are built)."""
    cfg = TASKS[task_name][0].model_validate_json(task_json)
    declared = getattr(cfg, "seq_len", None)
    if isinstance(declared, int) and declared > MAX_SEQ_LEN:
        return declared, 1
    task = make_task(cfg)
    return len(task.pos_ids()), task.vocab_size


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
            raise GridError(_cut(f"{grid.path}: key '{e.key}': {e.msg}")) from None
