"""The command line's values without pydantic: typer (0.29) turns each argument and option into its Python value
through a pydantic TypeAdapter, and importing pydantic to build them is a sixth of a cold `study status` or
`study verify` on a 2-core machine (benchmarks/cli_latency.py) for values that are plain strings and numbers.

PlainValues stands in for typer's coercion of a parameter (its RuntimeParam): a value whose result is not in
doubt (a str for a str; a decimal integer in range for an int; a plain decimal in range for a float; a list of
those) is converted here, to what the TypeAdapter returns for it; anything else (a value out of range, text
that is not a number, an annotation not listed) goes to typer's own coercion, built then, so that every message
a mistake gets is typer's own. tests/test_cli_coerce.py holds both equal, value by value. Where typer has no
such layer (another version), nothing is replaced.
"""
from __future__ import annotations

import re
from typing import Any, get_args, get_origin

try:
    from typer._coercion import RuntimeParam, build_runtime_param
except ImportError:  # a typer without the pydantic layer: its own coercion is left as it is
    RuntimeParam = build_runtime_param = None

NOT_PLAIN = object()  # plain() could not tell: typer's coercion decides
# what int("...") and float("...") read exactly as pydantic does (no sign, spaces, underscores, exponents)
_INT = re.compile(r"0|[1-9][0-9]{0,17}")
_FLOAT = re.compile(r"[0-9]{1,15}(\.[0-9]{1,15})?")


def plain(annotation: Any, info, value: Any) -> Any:
    """The value typer's coercion gives `value` for a parameter of `annotation` and ParameterInfo `info`, or
    NOT_PLAIN where it is not certain (then typer's own coercion runs)."""
    if info.parser is not None or info.clamp:
        return NOT_PLAIN
    if get_origin(annotation) is list and isinstance(value, (list, tuple)):
        (item,) = get_args(annotation) or (None,)
        got = [plain(item, info, v) for v in value]
        return NOT_PLAIN if any(g is NOT_PLAIN for g in got) else got
    if annotation is str:
        return value if type(value) is str else NOT_PLAIN
    if annotation is int:
        n = int(value) if type(value) is str and _INT.fullmatch(value) else value
        return n if type(n) is int and _in_range(n, info) else NOT_PLAIN
    if annotation is float:
        x = float(value) if type(value) is str and _FLOAT.fullmatch(value) else value
        return x if type(x) is float and _in_range(x, info) else NOT_PLAIN
    return NOT_PLAIN


def _in_range(x, info) -> bool:
    return (info.min is None or x >= info.min) and (info.max is None or x <= info.max)


if RuntimeParam is not None:
    class PlainValues(RuntimeParam):
        """A parameter's coercion: plain() where it can tell, else typer's own (built once it is needed)."""

        def _coerce_value(self, value: Any, param, ctx) -> Any:
            got = plain(self.annotation, self.parameter_info, value)
            if got is not NOT_PLAIN:
                return got
            return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)


def plain_values(params) -> None:
    """Give each of a command's parameters PlainValues in place of typer's coercion (not yet built: typer
    builds it on first use); nothing where this typer has no such layer."""
    if RuntimeParam is None:
        return
    for p in params:
        desc = getattr(p, "type_descriptor", None)
        if desc is not None and getattr(p, "_runtime_param", False) is None and desc.file_annotation is None:
            p._runtime_param = PlainValues(parameter_info=desc.parameter_info, annotation=desc.annotation)
