"""A stand-in for the few pydantic features model/config.py and tasks/ use, for machines without
pydantic (a GPU box with torch, numpy, pandas, pyarrow and pyyaml only). benchmarks/gpu_check.py
installs it as `pydantic` only when `import pydantic` fails; the project itself always uses pydantic.

It keeps what a config needs at run time: fields with defaults, keyword construction that refuses
unknown keys, `field_validator` / `model_validator(mode="after" or "before")`, frozen instances, `model_dump`,
`model_validate`. It does not check types or the numeric bounds of `Field` (ge, gt, ...): the
configs gpu_check builds are fixed in its source.
"""
from __future__ import annotations

import copy
import sys
import types

_MISSING = object()


class FieldInfo:
    def __init__(self, default=_MISSING, **constraints):
        self.default, self.constraints = default, constraints


def Field(default=_MISSING, **kw):  # noqa: N802 (pydantic's name)
    return FieldInfo(default, **kw)


def ConfigDict(**kw):  # noqa: N802
    return dict(kw)


def field_validator(*names, **_kw):
    def deco(f):
        f = f.__func__ if isinstance(f, classmethod) else f
        f._lite_fields = names
        return f
    return deco


def model_validator(mode: str = "after"):
    if mode not in ("after", "before"):
        raise NotImplementedError("pydantic_lite supports model_validator(mode='after' or 'before') only")

    def deco(f):
        if mode == "before":  # a classmethod given the raw keyword dict, returning the dict to build from
            f = f.__func__ if isinstance(f, classmethod) else f
            f._lite_before = True
        else:
            f._lite_model = True
        return f
    return deco


class ValidationError(ValueError):
    pass


class BaseModel:
    _lite_defaults: dict = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        fields = {}
        for base in reversed(cls.__mro__[1:]):
            fields.update(getattr(base, "_lite_defaults", {}))
        for name in cls.__dict__.get("__annotations__", {}):
            if name == "model_config" or name.startswith("_"):
                continue
            v = cls.__dict__.get(name, _MISSING)
            fields[name] = v.default if isinstance(v, FieldInfo) else v
        cls._lite_defaults = fields

    def __init__(self, **kw):
        cls = type(self)
        for c in reversed(cls.__mro__):
            for f in vars(c).values():
                if getattr(f, "_lite_before", False):
                    kw = f(cls, kw)
        unknown = set(kw) - set(cls._lite_defaults)
        if unknown:
            raise ValidationError(f"{cls.__name__}: unknown keys {sorted(unknown)}")
        funcs = [f for c in reversed(cls.__mro__) for f in vars(c).values() if callable(f)]
        for name, default in cls._lite_defaults.items():
            v = kw.get(name, default)
            if v is _MISSING:
                raise ValidationError(f"{cls.__name__}: missing {name}")
            v = copy.deepcopy(v)
            for f in funcs:
                if name in getattr(f, "_lite_fields", ()):
                    v = f(cls, v)
            object.__setattr__(self, name, v)
        for f in funcs:
            if getattr(f, "_lite_model", False):
                f(self)

    def __setattr__(self, name, value):
        raise TypeError(f"{type(self).__name__} is frozen")

    def __eq__(self, other):
        return type(self) is type(other) and self.model_dump() == other.model_dump()

    def __hash__(self):
        return hash(repr(sorted(self.model_dump().items())))

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.model_dump().items())})"

    def model_dump(self, exclude=None, **_kw) -> dict:
        ex = set(exclude or ())
        return {k: copy.deepcopy(getattr(self, k)) for k in type(self)._lite_defaults if k not in ex}

    @classmethod
    def model_validate(cls, d: dict):
        return cls(**d)

    def model_copy(self, update: dict | None = None):
        return type(self)(**{**self.model_dump(), **(update or {})})


def install() -> bool:
    """Make `import pydantic` give this module when pydantic is not installed. Returns whether it did."""
    try:
        import pydantic  # noqa: F401
        return False
    except ImportError:
        mod = types.ModuleType("pydantic")
        for name in ("BaseModel", "ConfigDict", "Field", "FieldInfo", "ValidationError", "field_validator",
                     "model_validator"):
            setattr(mod, name, globals()[name])
        sys.modules["pydantic"] = mod
        return True
