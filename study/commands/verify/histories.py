"""The training histories."""
from __future__ import annotations

from study.commands.verify.context import Context


def check_histories(c: Context) -> None:
    """Each history file holds rows of its own run, monotone in step and time within an attempt."""
    v, tables = c.v, c.tables
    for (table, rel), t in sorted(tables.items()):
        if table != "history":
            continue
        v.add("histories")
        last: dict = {}
        for r in t.to_pylist():
            a = r["attempt"]
            prev = last.get(a)
            if prev is not None and (r["step"] <= prev["step"] or (
                    r["seconds"] is not None and prev["seconds"] is not None and r["seconds"] < prev["seconds"])):
                v.problems.append(f"history/{rel[0]}: attempt {a}: step {r['step']} (at {r['seconds']} s) "
                                  f"after step {prev['step']} (at {prev['seconds']} s): not monotone")
                break
            last[a] = r
