"""Command-line overrides of a grid, Hydra-style: `study run g.yaml train.steps=10 axes.L=[1,2] ~eval.adaptive`
(`KEY=VALUE`, `+KEY=VALUE`, `~KEY`: docs/guide/grids.md, "Overrides"). Applied in order to the file's mapping,
then validated and expanded exactly as a file (study/spec/grid.py load_grid): an error is the file's own one line,
naming the override as its source. Nothing here imports torch, nor study/spec/grid.py.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import re
from dataclasses import dataclass
from typing import Any, Sequence

import yaml

MAX_OVERRIDES = 256
MAX_OVERRIDE_CHARS = 1 << 16  # a grid file's line bound (study/spec/gridfile.py MAX_GRID_LINE)
_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)((?:\[\d+\])*)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class OverrideError(ValueError):
    """One line naming the override (study/cli/ turns it into exit 2)."""


@dataclass
class Override:
    text: str  # as given on the command line
    op: str  # "set" | "add" | "del"
    path: list  # str keys and int list indices, before axis / alias handling
    value: Any = None


def parse(texts: Sequence[str]) -> list[Override]:
    """Parse the override strings (no grid needed). OverrideError on a malformed one."""
    if len(texts) > MAX_OVERRIDES:
        raise OverrideError(f"{len(texts)} overrides; at most {MAX_OVERRIDES}: put them in the grid file")
    return [_parse_one(t) for t in texts]


def _parse_one(text: str) -> Override:
    def bad(msg: str):
        raise OverrideError(f"override {show(text)}: {msg}")

    if len(text) > MAX_OVERRIDE_CHARS:
        bad(f"{len(text):,} characters; an override is at most {MAX_OVERRIDE_CHARS:,}")
    if _CONTROL.search(text):
        bad("contains a control character (a newline, a tab...): give one line")
    if text.startswith("~"):
        if "=" in text:
            bad("`~KEY` deletes KEY and takes no value")
        return Override(text, "del", _path(text[1:], bad))
    op = "set"
    body = text
    if text.startswith("++"):
        bad("`++KEY=VALUE` is not supported: `KEY=VALUE` sets a key whether the file has it or not")
    if text.startswith("+"):
        op, body = "add", text[1:]
    key, eq, vtext = body.partition("=")
    if not eq:
        bad("expected KEY=VALUE, +KEY=VALUE or ~KEY (e.g. train.steps=10, axes.L=[1,2])")
    path = _path(key, bad)
    from study.spec.gridfile import MAX_GRID_DEPTH, safe_yaml, too_deep, yaml_problem

    try:
        value = safe_yaml(vtext)
    except RecursionError:
        bad(f"the value nests more than {MAX_GRID_DEPTH} levels")
    except yaml.YAMLError as e:
        bad(f"the value is not valid YAML: {yaml_problem(e)}")
    if too_deep(value, MAX_GRID_DEPTH):
        bad(f"the value nests more than {MAX_GRID_DEPTH} levels")
    return Override(text, op, path, value)


def _path(key: str, bad) -> list:
    if not key:
        bad("no key before '='")
    parts: list = []
    for seg in key.split("."):
        if seg.isdigit():
            parts.append(int(seg))
            continue
        m = _SEGMENT.match(seg)
        if not m:
            bad(f"{show(key)} is not a key: dotted names (train.steps), list indices as .0 or [0]")
        parts.append(m.group(1))
        parts += [int(i) for i in re.findall(r"\[(\d+)\]", m.group(2))]
    if not isinstance(parts[0], str):
        bad(f"{show(key)} is not a key: a grid is a mapping; its keys are names")
    return parts


def show(text: str, limit: int = 200) -> str:
    """`text` for a one-line message: control characters escaped, at most `limit` characters."""
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _dotted(path: list) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


# ---- applying -----------------------------------------------------------------------------
def apply(raw: dict, overrides: Sequence[Override], source: str = "the grid file") -> tuple[dict, list[tuple]]:
    """A copy of `raw` with `overrides` applied in order, and per override the keys it claims (for
    naming it in a validation error): [(override, {"train.steps", ...}), ...]. OverrideError on a
    structural problem (a `+` key present, a `~` key absent, a path through a non-mapping)."""
    from study.spec.sections import SECTIONS, TOP_KEYS, aliases

    short_keys = aliases()
    raw = copy.deepcopy(raw)
    claims: list[tuple] = []
    seen: dict[str, str] = {}
    for ov in overrides:
        def bad(msg: str, ov=ov):
            raise OverrideError(f"override {show(ov.text)} (on {source}): {msg}")

        path = list(ov.path)
        if isinstance(path[0], str) and path[0] not in TOP_KEYS and path[0] in short_keys:
            path = short_keys[path[0]].split(".") + path[1:]  # `L=...` is model.L, `steps=...` train.steps
        keys = set()
        # an axis key is one (possibly dotted) name: axes.model.L is the axis `model.L`
        ax = _axes_at(path)
        section_field = len(path) >= 2 and path[0] in SECTIONS and all(isinstance(p, str) for p in path)
        axis = (_key_for(raw["axes"], ".".join(path)) if section_field and ov.op != "del"
                and isinstance(raw.get("axes"), dict) else None)
        if ax is not None:
            head, name = path[:ax], ".".join(str(p) for p in path[ax:])
            container = _walk(raw, head, bad, create=ov.op != "del")
            if not isinstance(container, dict):
                bad(f"{_dotted(head)} is not a mapping in {source}")
            field = _canon(name)
            existing = _key_for(container, field)
            target = head + [existing if existing is not None else name]
            keys |= {_dotted(target), field}
            _change(container, existing if existing is not None else name, existing is not None, ov, target,
                    source, bad)
        elif axis is not None:  # a field the grid varies: the axis would win over the section value
            raw["axes"][axis] = ov.value if isinstance(ov.value, list) else [ov.value]
            keys |= {f"axes.{axis}", ".".join(path), _dotted(path)}
        else:
            container = _walk(raw, path[:-1], bad, create=ov.op != "del")
            last = path[-1]
            if isinstance(container, dict):
                present = last in container
            elif isinstance(container, list) and isinstance(last, int):
                present = last < len(container)
                if not present and ov.op != "del":
                    bad(f"{_dotted(path[:-1])} has {len(container)} item(s); index {last} is past its end")
            else:
                bad(f"{_dotted(path[:-1])} is {show(repr(container), 60)} in {source}, not a mapping: "
                    f"{_dotted(path)} cannot be set")
            keys.add(_dotted(path))
            sec = path[2:] if len(path) >= 4 and path[0] == "groups" and isinstance(path[1], int) else path
            if len(sec) >= 2 and sec[0] in SECTIONS and all(isinstance(p, str) for p in sec):
                keys.add(".".join(sec))  # a group's sections are validated merged, as `train.x`
            _change(container, last, present, ov, path, source, bad)
            if ov.op != "del" and section_field:
                _refuse_bad_value(SECTIONS[path[0]], path, ov.value, bad)  # named first, before who shadows it
                _refuse_shadowed(raw, ".".join(path), bad)
        claims.append((ov, keys))
        _once(seen, keys, ov, bad)
    return raw, claims


def _once(seen: dict, keys: set, ov: Override, bad) -> None:
    """The same key set twice on one command line (one value would be dropped) is refused, as in a file."""
    for k in keys:
        if k in seen and seen[k] != ov.text:
            bad(f"sets {k} again (also set by {show(seen[k])}): give each key once")
    for k in keys:
        seen[k] = ov.text


def _axes_at(path: list) -> int | None:
    """Index just past `axes` in `path` (top level or groups[i]), when the path goes into an axes mapping."""
    if len(path) >= 2 and path[0] == "axes":
        return 1
    if len(path) >= 4 and path[0] == "groups" and isinstance(path[1], int) and path[2] == "axes":
        return 3
    return None


def _canon(key: str) -> str:
    from study.spec.sections import aliases

    return aliases().get(key, key)


def _key_for(mapping: dict, field: str):
    """The key of `mapping` that names `field` however it is spelt (`L` or `model.L`), or None."""
    return next((k for k in mapping if isinstance(k, str) and _canon(k) == field), None)


def _walk(raw: dict, head: list, bad, create: bool):
    cur: Any = raw
    for i, p in enumerate(head):
        where = _dotted(head[:i + 1])
        if isinstance(cur, dict):
            if isinstance(p, int):
                bad(f"{_dotted(head[:i]) or 'the grid'} is a mapping, not a list: {where} is no key")
            if p not in cur or cur[p] is None:
                if not create:
                    bad(f"the grid does not set {where}")
                if i + 1 < len(head) and isinstance(head[i + 1], int):
                    bad(f"the grid has no list {where}: {_dotted(head[:i + 2])} cannot be set")
                cur[p] = {}
            cur = cur[p]
        elif isinstance(cur, list):
            if not isinstance(p, int):
                bad(f"{_dotted(head[:i]) or 'the grid'} is a list: index it with a number ({_dotted(head[:i])}.0)")
            if p >= len(cur):
                bad(f"{_dotted(head[:i])} has {len(cur)} item(s); index {p} is past its end")
            cur = cur[p]
        else:
            bad(f"{_dotted(head[:i])} is {show(repr(cur), 60)}, not a mapping: {where} cannot be set")
    return cur


def _change(container, key, present: bool, ov: Override, path: list, source: str, bad) -> None:
    where = _dotted(path)
    if ov.op == "add" and present:
        bad(f"{source} already sets {where} (to {show(repr(container[key]), 80)}): "
            f"`+` adds a key the file lacks; give {where}=VALUE to change it")
    if ov.op == "del":
        if not present:
            bad(f"{source} does not set {where}: nothing to delete")
        del container[key]
    else:
        container[key] = ov.value


def _refuse_bad_value(section, path: list, value, bad) -> None:
    """A section field's value of the wrong type (`model.K=abc`), named as validation would name it."""
    from pydantic import TypeAdapter, ValidationError

    field = section.model_fields.get(path[1]) if section is not None and len(path) == 2 else None
    if field is None or isinstance(value, list):  # a list asks for a sweep: who sets it (a couple, an axis) says more
        return
    try:
        TypeAdapter(field.annotation).validate_python(value)
    except ValidationError as e:
        bad(f"key {'.'.join(path)!r}: {e.errors()[0]['msg']} (got {value!r})")


def _refuse_shadowed(raw: dict, field: str, bad) -> None:
    """A top-level section value that a group, a couple or include point would set again (and win) is
    refused: the override would not apply to those runs, silently."""
    def point_sets(points, where):
        for i, fam in enumerate(points if isinstance(points, list) else []):
            for j, p in enumerate(fam if isinstance(fam, list) else [fam]):
                if isinstance(p, dict) and _key_for(p, field) is not None:
                    return f"{where}[{i}]" + (f"[{j}]" if isinstance(fam, list) else "")
        return None

    places = [("", raw)]
    groups = raw.get("groups")
    if isinstance(groups, list):
        places += [(f"groups[{i}].", g) for i, g in enumerate(groups) if isinstance(g, dict)]
    for where, spec in places:
        if where:
            sec, _, rest = field.partition(".")
            cur: Any = spec.get(sec)
            for part in rest.split("."):
                cur = cur.get(part, _MISSING) if isinstance(cur, dict) else _MISSING
            if cur is not _MISSING:
                bad(f"{where}{field} sets it again for that group (and wins there): override "
                    f"groups.{where[7:-2]}.{field} instead")
            axis = _key_for(spec["axes"], field) if isinstance(spec.get("axes"), dict) else None
            if axis is not None:
                bad(f"{where}axes.{axis} varies it in that group (and wins there): override "
                    f"groups.{where[7:-2]}.axes.{axis}=[...] instead")
        for kind in ("couple", "include"):
            hit = point_sets(spec.get(kind), f"{where}{kind}")
            if hit:
                bad(f"{hit} sets {field} in a {kind} point (and wins there): override {where}{kind} instead, "
                    f"the whole list as YAML ({where}{kind}='[[{{K: 1, L: 1}}, {{K: 1, L: 2}}]]' for a couple)")


_MISSING = object()


def attribute(msg: str, path: str, texts: Sequence[str], claims: list | None = None) -> str:
    """`PATH: key 'K': ...` (a grid error) with the override that set K named as its source."""
    if not texts:
        return msg
    if claims is None:
        try:
            _, claims = apply({}, parse(texts))
        except Exception:
            claims = []
    prefix = f"{path}: "
    if not msg.startswith(prefix):
        return msg
    rest = msg[len(prefix):]
    m = re.match(r"key '(.*?)': ", rest)
    if m:
        ek = m.group(1)
        for ov, keys in reversed(claims):
            if any(ek == k or ek.startswith(k + ".") or ek.startswith(k + "[") or k.startswith(ek + ".")
                   for k in keys):
                return f"override {show(ov.text)} (on {path}): {rest}"
    return f"{path} with overrides {' '.join(show(t, 80) for t in texts)}: {rest}"


def grid_text(grid) -> str:
    """The text a study stores as its grid (grid.yaml, grids/<sha>.yaml): the grid as expanded --
    after any overrides -- as YAML, with the overrides, in the order applied, in a comment header."""
    body = yaml.safe_dump(grid.raw, sort_keys=False)
    texts = getattr(grid, "overrides", None) or []
    if not texts:
        return body
    head = [f"# {grid.path} with command-line overrides (study/spec/overrides.py), applied in this order:"]
    head += [f"#   {t}" for t in texts]
    return "\n".join(head) + "\n" + body


def study_name(raw: Any, texts: Sequence[str]) -> Any:
    """The `study:` value after `texts` (for the lease check before a grid is validated); a best effort:
    the full checks follow."""
    name = raw.get("study") if isinstance(raw, dict) else None
    for t in texts:
        key, eq, v = t.lstrip("+").partition("=")
        if t == "~study":
            name = None
        elif eq and key == "study":
            with contextlib.suppress(yaml.YAMLError):
                name = yaml.safe_load(v)
    return name


def recorded(text: str | None) -> list[str] | None:
    """The overrides named in the header of a stored grid text (grid_text); None when it names none."""
    lines = (text or "").splitlines()
    if not lines or "with command-line overrides (study/spec/overrides.py)" not in lines[0]:
        return None
    return [ln[4:] for ln in itertools.takewhile(lambda ln: ln.startswith("#   "), lines[1:])]


def change_note(store, grid) -> str | None:
    """One line when the study's stored grid.yaml was run with other overrides than `grid` carries now
    (a rerun without an override is not silent: its runs are the file's own, by their ids)."""
    try:
        raw = store.read_bytes(store.path("grid.yaml"))
    except Exception:
        return None
    if raw is None:
        return None
    before = recorded(raw.decode(errors="replace")) or []
    now = list(getattr(grid, "overrides", None) or [])
    if before == now:
        return None
    said = " ".join(show(t, 80) for t in before) if before else "none"
    return (f"note: the study's grid.yaml was last run with overrides: {said}; now: "
            f"{' '.join(show(t, 80) for t in now) if now else 'none'} (runs are matched by config: "
            f"a changed training field names other runs)")
