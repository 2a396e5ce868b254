"""The sections of a grid file, the keys that name their fields, and how a mapping is validated into a
section: the vocabulary study/spec/grid.py, study/spec/search.py and study/spec/overrides.py share.

An error names the file, the key and the allowed values in one line (GridError, raised through `Err`).
"""
from __future__ import annotations

import functools
import reprlib
import typing
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from model.config import ModelConfig, Strict, TrainConfig


class GridError(ValueError):
    """A grid that cannot be run, with file and key in the message."""


class Adaptive(Strict):
    """An adaptive-depth sampling point: loop until the predictions settle (argmax over the masked
    positions unchanged since the previous loop, confidence at each >= threshold), at most
    `max_loops` a denoising step (model/rmdm.py)."""

    max_loops: int | Literal["train"] = Field(description="the cap L_s: an integer >= 2, or 'train' (L_t; "
                                                          "no adaptive point for a run trained at L = 1)")
    threshold: float = Field(gt=0, le=1, description="confidence (max softmax probability) every masked "
                                                     "position must reach")

    @field_validator("max_loops")
    @classmethod
    def _cap(cls, v: int | str) -> int | str:
        if v != "train" and v < 2:
            raise ValueError("must be an integer >= 2 or 'train': one loop leaves nothing to compare")
        return v


N_GENERATE = 16  # the most unconditional generations a likelihood point draws (fewer if fewer are kept)


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
    at_checkpoints: int = Field(0, ge=0, description="validation examples scored at every checkpoint and at the "
                                                     "end of training, at each T with L_s = L_t (the training "
                                                     "curves' metric, reported to Tune and the --log loggers); "
                                                     "0: none")

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
ALIASES = {  # short grid keys of any task; a task adds its own (Task.aliases): see aliases()
    "K": "model.K", "L": "model.L", "d_model": "model.d_model", "seed": "train.seed", "lr": "train.lr",
    "loss": "train.loss", "schedule": "train.schedule", "steps": "train.steps",
}


def aliases() -> dict[str, str]:
    """Every short grid key: the generic ones above, then the registered tasks' (`mask_rate`: task.mask_rate)."""
    import tasks

    own = tasks.aliases()
    clash = sorted(set(own) & set(ALIASES))
    if clash:
        raise ValueError(f"task aliases {clash} clash with the generic short names {sorted(ALIASES)}")
    return {**ALIASES, **own}
TOP_KEYS = {"study", "description", "retries", "axes", "couple", "constraints", "include", "exclude", "groups",
            "search", "defaults_from", "claims", "seeds", "claims_alpha", *SECTIONS}  # search / defaults_from:
# study/spec/search.py; claims / seeds / claims_alpha: study/spec/claims.py
GROUP_KEYS = {"name", "axes", "couple", "constraints", "include", "exclude", "defaults_from", *SECTIONS}
TRAIN_BOOKKEEPING = {"checkpoint_every", "log_every"}  # do not change the trained weights
LOOP_ONLY_TRAIN = ("loss", "loss_weights", "truncate_k", "schedule", "min_depth")  # shape only the loop


class Err:
    """Raises the GridError of grid file `path`: `err(key, msg)` -> "PATH: key 'KEY': MSG", in one line."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self, key: str, msg: str):
        raise GridError(cut(f"{self.path}: key '{cut(key, 200)}': {msg}"))


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 8, 120, 120


def short(v: Any, limit: int = 300) -> str:
    """repr of a grid value for a message, a few hundred characters at most: a YAML alias bomb
    expands to megabytes, and reprlib never builds the whole repr."""
    return cut(_REPR.repr(v), limit)


def cut(text: str, limit: int = 1000) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit - 40]}... ({len(text):,} characters in all)"


def _bool_for_number(cls: type[BaseModel], d: dict, key: str, err: Err) -> None:
    """pydantic reads `K: true` as K = 1: refuse a boolean wherever the field does not take booleans."""
    no_bool, subs = _bool_fields(cls)
    for name, v in d.items():
        if name in no_bool and (isinstance(v, bool) or (isinstance(v, list) and any(isinstance(x, bool) for x in v))):
            err(f"{key}.{name}", f"a number is meant here, not a boolean (got {short(v)})")
        if name in subs and isinstance(v, dict):
            _bool_for_number(subs[name], v, f"{key}.{name}", err)
        for i, x in enumerate(v if name in subs and isinstance(v, list) else ()):  # eval.adaptive.0.threshold
            if isinstance(x, dict):
                _bool_for_number(subs[name], x, f"{key}.{name}.{i}", err)


@functools.lru_cache(maxsize=None)
def _bool_fields(cls: type[BaseModel]) -> tuple[frozenset, dict]:
    """(fields that take no boolean, {field: nested model class}) of a config class."""
    no_bool = frozenset(k for k, f in cls.model_fields.items()
                        if not any(t in (bool, Any, object) for t in _leaves(f.annotation)))
    subs = {k: t for k, f in cls.model_fields.items() if (t := _model_type(f.annotation)) is not None}
    return no_bool, subs


def _leaves(ann: Any) -> list:
    args = typing.get_args(ann)
    if typing.get_origin(ann) is Literal:
        return [type(a) for a in args]
    return [x for a in args for x in _leaves(a)] if args else [ann]


def _model_type(ann: Any):
    return next((t for t in _leaves(ann) if isinstance(t, type) and issubclass(t, BaseModel)), None)


def validate(cls: type[BaseModel], d: dict, key: str, err: Err):
    """`d` as a `cls` (a section, or a part of one, found at `key`); the first problem raised through `err`."""
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
        if first["type"] == "grid_refused":  # raised by `refuse`: said as written, at its own key
            at = first["ctx"]["at"]
            err(full + ("" if not at or at.startswith("[") else ".") + at, first["ctx"]["msg"])
        if first["type"] == "extra_forbidden":
            owner = cls  # the (nested) model that holds the key, e.g. Adaptive for eval.adaptive.0.x
            for part in first["loc"][:-1]:
                f = owner.model_fields.get(part) if isinstance(part, str) else None
                owner = (_model_type(f.annotation) or owner) if f is not None else owner
            err(full, f"unknown key; allowed: {', '.join(sorted(owner.model_fields))}")
        msg = first["msg"].removeprefix("Value error, ")  # pydantic's prefix to a validator's ValueError
        err(full, msg if "(got " in msg else f"{msg} (got {short(first.get('input'))})")  # "got" said once


def refuse(msg: str, at: str = "") -> PydanticCustomError:
    """A validation error that `validate` reports as written (no "(got ...)" added), at key `at` below the
    field or model that raises it ("T", "params.lr.dist", "[0].train.lr")."""
    return PydanticCustomError("grid_refused", "{msg}", {"msg": msg, "at": at})


class BadKey(ValueError):
    """A key that names no field: `key` as shown in the message, `msg` why."""

    def __init__(self, key: str, msg: str):
        super().__init__(f"{key}: {msg}")
        self.key, self.msg = key, msg


def canonical(key: Any) -> str:
    """The 'section.field' a key names (an alias such as K or lr, or 'section.field' itself); BadKey otherwise.
    Evaluation points are not keys: they are listed in the `eval` section."""
    if not isinstance(key, str):  # `axes: {1: [1]}`: YAML reads the key as a number
        raise BadKey(short(key), f"an axis key is a name ('section.field' or a short name such as K), "
                                 f"not {type(key).__name__} {short(key)}")
    names = aliases()
    key = names.get(key, key)
    sec, _, fld = key.partition(".")
    if sec not in SECTIONS or not fld:
        raise BadKey(key, f"axis keys are 'section.field' with section in {sorted(SECTIONS)} "
                          f"or one of the short names {sorted(names)}")
    if sec == "eval":
        raise BadKey(key, "evaluation points are listed in the `eval` section (T, L_s, sampler), not as axes: "
                          "they do not define new runs")
    return key


def canon_key(key: Any, where: str, err: Err) -> str:
    """canonical(key), a BadKey raised through `err` at `where` + the key."""
    try:
        return canonical(key)
    except BadKey as e:
        err(where + e.key, e.msg)


def field_of(run, key: str):
    """The value of 'section.field' `key` in a resolved run (study/spec/grid.py Run); None for no such field."""
    sec, fld = key.split(".", 1)
    return getattr(getattr(run, sec), fld, None)
