"""The figures' names and what the report needs to know of each, read from their files, not imported.

The CLI's help lists the figures, and a report's main process orders, keys and captions them, without
importing the figure modules (matplotlib: about a second of every `study` command, and of a large
report's critical path while its drawing workers import it themselves); analysis.figures loads the same
modules to draw them.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
import pkgutil
from dataclasses import dataclass

PACKAGE = "analysis.figures"


def _where() -> list[str]:
    return list(importlib.util.find_spec(PACKAGE).submodule_search_locations)


def figure_names() -> list[str]:
    """Every figure's name, sorted: a module iso_param.py is the figure `iso-param`."""
    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(_where()) if not m.name.startswith("_"))


def module_name(figure: str) -> str:
    """The module that draws `figure`: iso-param -> analysis.figures.iso_param."""
    return f"{PACKAGE}.{figure.replace('-', '_')}"


@dataclass(frozen=True)
class Info:
    """What analysis/figures/__init__.py's contract declares of one figure, read from its module's source:
    ORDER, COST, READS (None where the module declares none: every input) and its docstring's caption."""

    name: str
    path: str  # the module's file
    order: int
    cost: int
    reads: tuple | None
    doc: str

    @property
    def caption(self) -> str:
        """The first paragraph of the module's docstring, on one line."""
        return (self.doc or self.name).strip().split("\n\n")[0].replace("\n", " ")


@functools.lru_cache(maxsize=None)
def figures() -> dict[str, Info]:
    """{name: Info} of every figure, in the report's order (ORDER). The constants are literals (a module
    whose ORDER, COST or READS is not one fails here, naming it; tests/test_catalog.py holds each equal to
    the imported module's)."""
    found = []
    for name in figure_names():
        path = os.path.join(_where()[0], name.replace("-", "_") + ".py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        consts = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id in ("ORDER", "COST", "READS"):
                try:
                    consts[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError as e:
                    raise ValueError(f"{path}: {node.targets[0].id} must be a literal ({e})") from None
        reads = consts.get("READS")
        found.append(Info(name, path, consts["ORDER"], consts["COST"], tuple(reads) if reads is not None else None,
                          ast.get_docstring(tree, clean=False) or ""))
    return {i.name: i for i in sorted(found, key=lambda i: i.order)}
