"""study/cli/coerce.py: every parameter of every `study` command converts a value as typer's own (pydantic)
coercion does: the same value, or the same error message; and the plain values (a path, a number in range)
never reach typer's coercion.
Run: .venv/bin/python -m pytest tests/test_cli_coerce.py -q
"""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

coercion = pytest.importorskip("typer._coercion")  # typer 0.29's pydantic layer: nothing is replaced without it

from typer._click import Context  # noqa: E402
from typer._click.exceptions import BadParameter  # noqa: E402
from typer.main import get_command  # noqa: E402

from study.cli import app  # noqa: E402
from study.cli.coerce import NOT_PLAIN, PlainValues, plain  # noqa: E402

VALUES = ["0", "1", "7", "12", "49", "50", "20000", "20001", "007", "-1", "+3", " 4", "4 ", "1_000", "1.5", "0.95",
          "1.0", "0.0", "2.", ".5", "1e3", "nan", "inf", "abc", "", "x y", "ünï", "99999999999999999999",
          "123456789012345678", 3, 0.5, 1.0, True]


def params():
    group = get_command(app)
    for name, cmd in sorted(group.commands.items()):
        ctx = Context(cmd, info_name=name)
        for p in cmd.get_params(ctx):
            if getattr(p, "type_descriptor", None) is not None:
                yield name, ctx, p


def outcome(runtime, value, p, ctx):
    try:
        return "value", runtime._coerce_value(value, param=p, ctx=ctx)
    except BadParameter as e:
        return "error", e.format_message()


def test_every_parameter_converts_a_value_as_typers_coercion_does():
    seen = set()
    for name, ctx, p in params():
        desc = p.type_descriptor
        ours = PlainValues(parameter_info=desc.parameter_info, annotation=desc.annotation)
        theirs = coercion.build_runtime_param(desc)
        values = [tuple(VALUES[i:i + 3]) for i in range(0, len(VALUES), 3)] if p.multiple or p.nargs == -1 \
            else VALUES
        for v in values:
            want, got = outcome(theirs, v, p, ctx), outcome(ours, v, p, ctx)
            assert repr(got) == repr(want) and type(got[1]) is type(want[1]), (name, p.name, v, got, want)  # nan
            if plain(desc.annotation, desc.parameter_info, v) is not NOT_PLAIN:
                seen.add(str(desc.annotation))
    assert {"<class 'str'>", "<class 'int'>", "<class 'float'>", "list[str]"} <= seen, seen  # the fast path ran


def test_plain_values_are_converted_without_typers_coercion(monkeypatch):
    def refuse(desc):
        raise AssertionError(f"typer's coercion built for {desc.annotation}")

    monkeypatch.setattr(coercion, "build_runtime_param", refuse)
    monkeypatch.setattr("study.cli.coerce.build_runtime_param", refuse)
    for name, ctx, p in params():
        desc = p.type_descriptor
        v = {str: "results", int: "50", float: "0.95"}.get(desc.annotation)
        if v is not None and plain(desc.annotation, desc.parameter_info, v) is not NOT_PLAIN:
            assert isinstance(p.get_runtime_param(), PlainValues), (name, p.name)
            assert p.get_runtime_param()._coerce_value(v, param=p, ctx=ctx) == desc.annotation(v), (name, p.name)
