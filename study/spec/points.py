"""The points of a grid: its `axes`, `couple`, `constraints`, `include` and `exclude` as the (canonical key
-> value) mappings each run is resolved from (study/spec/grid.py expand), every malformed part an error
naming its key."""
from __future__ import annotations

import copy
import itertools
import math
from typing import Any

from study.spec.sections import Err, canon_key, short


def mapping(v: Any, key: str, err: Err) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        err(key, f"must be a mapping (got {type(v).__name__})")
    return copy.deepcopy(v)


def check_keys(d: dict, allowed: set[str], where: str, err: Err) -> None:
    for k in d:
        if k not in allowed:
            err(f"{where}{k}", f"unknown key; allowed: {', '.join(sorted(allowed))}")


def deep_update(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            deep_update(dst[k], v)
        else:
            dst[k] = v


def point_of(d: Any, where: str, err: Err) -> dict:
    if not isinstance(d, dict) or not d:
        err(where, "a point is a non-empty mapping of axis key -> value")
    out: dict = {}
    for k, v in d.items():
        ck = canon_key(k, where + ".", err)
        if ck in out:  # `{L: 2, model.L: 3}`: one field given twice, one value would be dropped
            err(f"{where}.{k}", f"names {ck} again: give each field once")
        out[ck] = v
    return out


def count_points(spec: dict, where: str, err: Err) -> int:
    """How many points points would make of `spec` at most (before constraints and exclude): the product
    of the axes' and couple lists' lengths, plus the include list; malformed parts are left to points."""
    n = 1
    axes = spec.get("axes", {})
    for vals in (axes.values() if isinstance(axes, dict) else ()):
        n *= len(vals) if isinstance(vals, list) and vals else 1
    couple = spec.get("couple", [])
    for fam in (couple if isinstance(couple, list) else ()):
        n *= len(fam) if isinstance(fam, list) and fam else 1
    inc = spec.get("include", [])
    return n + (len(inc) if isinstance(inc, list) else 0)


def points(spec: dict, where: str, err: Err) -> list[tuple[dict, bool]]:
    """(point, listed in `include`?): included points are taken as written, past the constraints."""
    axes = mapping(spec.get("axes", {}), where + "axes", err)
    lists, named = [], {}
    for k, vals in axes.items():
        ck = canon_key(k, where + "axes.", err)
        if ck in named:  # `L` and `model.L`: one axis would silently replace the other
            err(f"{where}axes.{k}", f"names the same field as axis {named[ck]!r} ({ck}): give it once")
        named[ck] = k
        if not isinstance(vals, list) or not vals:
            err(f"{where}axes.{k}", f"must be a non-empty list of values (got {short(vals)})")
        lists.append([{ck: v} for v in vals])
    couple = spec.get("couple", [])
    if not isinstance(couple, list):
        err(where + "couple", "must be a list of lists of points, e.g. [[{K: 6, L: 5}, {K: 30, L: 1}]]")
    for i, fam in enumerate(couple):
        if not isinstance(fam, list) or not fam:
            err(f"{where}couple[{i}]", "must be a non-empty list of points")
        lists.append([point_of(p, f"{where}couple[{i}][{j}]", err) for j, p in enumerate(fam)])
    points = [dict(kv for d in combo for kv in d.items()) for combo in itertools.product(*lists)] if lists else [{}]
    for i, c in enumerate(as_list(spec.get("constraints", []), where + "constraints", err)):
        points = [p for p in points if satisfies(p, c, f"{where}constraints[{i}]", err)]
    excl = [point_of(p, f"{where}exclude[{i}]", err)
            for i, p in enumerate(as_list(spec.get("exclude", []), where + "exclude", err))]
    points = [p for p in points if not any(all(p.get(k) == v for k, v in e.items()) for e in excl)]
    included = [point_of(p, f"{where}include[{i}]", err)
                for i, p in enumerate(as_list(spec.get("include", []), where + "include", err))]
    return [(p, False) for p in points] + [(p, True) for p in included]


def as_list(v: Any, key: str, err: Err) -> list:
    if not isinstance(v, list):
        err(key, "must be a list")
    return v


def satisfies(point: dict, c: Any, where: str, err: Err) -> bool:
    """Declarative constraint: {product: [keys], equals|max|min: number}."""
    if not isinstance(c, dict) or "product" not in c or not (set(c) - {"product"}) <= {"equals", "max", "min"} \
            or len(c) < 2:
        err(where, "a constraint is {product: [keys...], equals|min|max: number}")
    keys = [canon_key(k, where + ".product.", err) for k in c["product"]]
    vals = [point.get(k) for k in keys]
    if any(v is None for v in vals):
        return True  # not decided by this point's axes: the base value applies; checked after resolve
    try:
        prod = math.prod(vals)
    except TypeError:
        err(where, f"product of non-numbers {vals}")
    return (("equals" not in c or prod == c["equals"]) and ("max" not in c or prod <= c["max"])
            and ("min" not in c or prod >= c["min"]))
