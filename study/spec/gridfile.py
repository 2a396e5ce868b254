"""A grid file (or a file read as one: a best-values file) read safely: a regular file within bounds, YAML
parsed with a safe loader that also refuses a key given twice; nothing in it is ever evaluated."""
from __future__ import annotations

from typing import Any

import yaml

from atomicio import open_regular
from study.spec.sections import GridError, cut, short


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
                        None, None, f"duplicate key {short(key)} (first at {where}): give each key once",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


# A grid file is read whole before parsing, within these bounds (a hostile or mistaken file -- a
# FIFO, /dev/zero, a 50 MB line, a structure nested thousands deep -- is refused in one line, never
# read without end): the largest grid shipped is a few kB.
MAX_GRID_BYTES = 1 << 20  # 1 MiB
MAX_GRID_LINE = 1 << 16  # characters a line
MAX_GRID_DEPTH = 32  # nested mappings / lists


def grid_file_text(path: str) -> str:
    """The text of grid file `path`, within MAX_GRID_BYTES and MAX_GRID_LINE (GridError otherwise)."""
    f = open_regular(path, "grid file", MAX_GRID_BYTES, GridError)
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


def read_yaml(path: str) -> Any:
    """The YAML of grid file `path` (or a best-values file): read within the bounds above, parsed by safe_yaml,
    nested at most MAX_GRID_DEPTH deep; GridError naming the file (and the line) otherwise."""
    try:
        raw = safe_yaml(grid_file_text(path))
    except RecursionError:
        raise GridError(f"{path}: nested too deeply to read (a grid nests a few levels; at most "
                        f"{MAX_GRID_DEPTH})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        raise GridError(cut(f"{where}: not valid YAML: {yaml_problem(e)}")) from None
    if too_deep(raw, MAX_GRID_DEPTH):
        raise GridError(f"{path}: nested deeper than {MAX_GRID_DEPTH} levels of mappings and lists; a grid nests "
                        f"a few")
    return raw


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


def safe_yaml(text: str):
    """Parse YAML text with GridLoader (a yaml.SafeLoader subclass that also refuses a key given twice):
    plain data only, nothing is constructed. Raises yaml.YAMLError, or RecursionError when nested too deeply."""
    loader = GridLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def yaml_problem(e: yaml.YAMLError) -> str:
    """What YAML expected and what it found, in one line."""
    what = "; ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
    return " ".join(what.split())
