"""What every check of `study verify` shares: the verdict it adds to, and one Context of what the store holds
(read once by `verify_study`, filled as the checks go) instead of the same arguments threaded through each."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from store import Store
from tasks import TASKS, make_task

TOL = 1e-9  # scores are means of 0/1 or of floats computed the same way: equal up to rounding


@dataclass
class Verdict:
    study: str
    dir: str
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why (not failures)
    underived: set[str] = field(default_factory=set)  # kinds of numbers that could not be re-derived here
    owed: list[str] = field(default_factory=list)  # runs a grid lists that have no row yet: status, not damage

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        c = self.counts
        lines = [f"study {self.study} ({self.dir}): {c.get('runs', 0)} runs ({c.get('done', 0)} done), "
                 f"{c.get('eval_files', 0)} eval points, "
                 + (f"{c['nll_files']} continuous-quantity points (nll-test, nll-val; "
                    f"{c.get('nll_recomputed', 0)} values recomputed), " if c.get("nll_files") else "")
                 + f"{c.get('samples', 0)} samples re-scored, "
                 f"{c.get('scores_as_stored', 0)} per-example scores taken as stored (outputs not kept), "
                 f"{c.get('metrics_recomputed', 0)} metric values recomputed, {c.get('configs', 0)} configs "
                 f"re-hashed, {c.get('grids', 0)} grids, {c.get('index_entries', 0)} index entries checked, "
                 f"{c.get('histories', 0)} histories, {c.get('weights', 0)} weights files; not re-derived: "
                 + "; ".join([*sorted(self.underived), UNDERIVED])]
        lines += [f"  note: {n}" for n in self.notes] + [f"  owed by a grid, not yet run: {o}" for o in self.owed]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines.append(f"{len(self.problems)} problem(s): the store disagrees with itself" if self.problems
                     else "OK: every check agrees")
        return "\n".join(lines)


# measurements: recorded as they happened, nothing in the store determines them
UNDERIVED = ("measured times and places (train_seconds, eval_seconds, created_at, attempts, node, node_id, node_ip, "
             "device, gpu_ids, attention, precision, code_version)")


def stem(name: str) -> str:
    return name[: -len(".parquet")]


def flat(d, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for k, x in d.items():
        out.update(flat(x, f"{prefix}{k}.") if isinstance(x, dict) else {f"{prefix}{k}": x})
    return out


def diff(a: dict, b: dict) -> list[str]:
    fa, fb = flat(a), flat(b)
    return [k for k in sorted(set(fa) | set(fb)) if not equal(fa.get(k), fb.get(k))]


def equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return a == b
    return a == b and type(a) is type(b) or (a is None and b is None)


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=TOL, abs_tol=TOL)


@dataclass
class Context:
    """The store under check and what the checks learn of it, in the order `verify_study` fills it."""
    store: Store
    v: Verdict
    files: dict = field(default_factory=dict)  # (table, path parts inside the table) -> path of every Parquet file
    tables: dict = field(default_factory=dict)  # (table, path parts) -> pyarrow table of every readable file
    runs: dict = field(default_factory=dict)  # run_id -> its runs row
    grids: list = field(default_factory=list)  # (sha, path, its runs or None) of every grid recorded
    rebuilt: dict = field(default_factory=dict)  # run_id -> the Run its config describes (configs agree)
    owed: dict = field(default_factory=dict)  # run_id -> eval keys owed
    unrun: set = field(default_factory=set)  # run ids a grid lists that have no runs row yet (owed, not damage)
    known: dict = field(default_factory=dict)  # run_id -> {eval key: EvalPoint} known
    tasks: dict = field(default_factory=dict)  # (task, task_params) -> the task, built once
    points: dict = field(default_factory=dict)  # (run_id, eval key) -> (its kind, its EvalPoint or None) checked

    def task_of(self, row: dict):
        """The task of a runs row (its task and task_params), built once."""
        name = row["task"]
        key = (name, row["task_params"])
        if key not in self.tasks:
            if name not in TASKS:
                raise ValueError(f"task {name!r} unknown here; known: {', '.join(sorted(TASKS))}")
            self.tasks[key] = make_task(TASKS[name][0].model_validate(json.loads(row["task_params"])))
        return self.tasks[key]
