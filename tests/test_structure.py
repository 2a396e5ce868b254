"""Where things live, checked: no import circle in the project (imports inside functions count), no
module reaches into another's private names, and the layers import only downwards (docs/DESIGN.md,
"Layers and their dependency rule")."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("study", "model", "tasks", "store", "stats", "analysis", "rmdm_study", "atomicio")
# what each layer may import besides itself (DESIGN.md): study on top, store and stats leaves
ALLOWED = {
    "rmdm_study": {"analysis", "store", "stats", "tasks", "study"},
    "study": {"analysis", "model", "tasks", "store", "stats"},
    "analysis": {"store", "stats", "tasks"},
    "model": set(),
    "tasks": {"stats"},
    "store": set(),
    "stats": set(),
    "atomicio": set(),
}
for _layer in ALLOWED:  # files written whole or not at all: the one leaf every layer may use
    if _layer != "atomicio":
        ALLOWED[_layer].add("atomicio")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """(imported project module, names taken from it, line) for every import statement, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    out.append((a.name, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] not in PACKAGES:
                continue
            names = [a.name for a in node.names]
            # `from pkg import submodule` imports the submodule
            subs = [n for n in names if f"{mod}.{n}" in known]
            out.append((mod, [n for n in names if n not in subs], node.lineno))
            out += [(f"{mod}.{n}", [], node.lineno) for n in subs]
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    g = {m: set() for m in known}
    for m, p in known.items():
        for target, _, _ in imports(m, p, known):
            while target not in known and "." in target:  # `import a.b.c` where c is a name
                target = target.rsplit(".", 1)[0]
            if target in known and target != m:
                g[m].add(target)
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def _is_parent(a: str, b: str) -> bool:
    """A package's __init__ importing its own submodules (and they the package) is how a package
    exposes its parts, not a circle between parts."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_no_import_circle():
    g = graph()
    # a package's __init__ re-exporting its submodules is not a circle between modules
    g = {m: {t for t in ts if not _is_parent(m, t)} for m, ts in g.items()}
    assert cycles(g) == [], "import circles (imports inside functions count)"


def test_no_module_imports_a_private_name():
    known = modules()
    bad = []
    for m, p in known.items():
        for target, names, line in imports(m, p, known):
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{p.relative_to(ROOT)}:{line}: {n} from {target}")
    assert bad == []


def test_layers_import_only_downwards():
    known = modules()
    bad = []
    for m, p in known.items():
        layer = m.split(".")[0]
        for target, _, line in imports(m, p, known):
            other = target.split(".")[0]
            if other != layer and other not in ALLOWED[layer]:
                bad.append(f"{p.relative_to(ROOT)}:{line}: {layer} imports {target}")
    assert bad == []


def test_the_checks_see_a_circle_and_a_private_import(tmp_path):
    """The graph code finds what it is meant to find (a circle through an import inside a function)."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    src = "def f():\n    from study.spec.grid import _hidden\n"
    p = tmp_path / "x.py"
    p.write_text(src)
    assert imports("study.x", p, {"study.spec.grid": p}) == [("study.spec.grid", ["_hidden"], 2)]


# ---- the task contract: study/ and analysis/ name no task --------------------------------------------
# what a module may import of one task (the figures read what a task declares: Task.figure_columns)
ONE_TASK_IMPORTS = {("study.cli.tools", "tasks.text8")}  # `study text8-download`: fetching one task's corpus


def task_words() -> dict[str, str]:
    """Every name a task owns (its name, run columns, short grid keys, its module) -> the task that owns it."""
    import tasks

    out = {}
    for name, (_, cls) in tasks.TASKS.items():
        out.update({w: name for w in (name, *cls.run_column_names, *cls.aliases, cls.__module__)})
    return out


def task_names_in(name: str, path: Path, words: dict[str, str], known: dict[str, Path]) -> list[str]:
    """'file:line: ...' for each string constant that is a task's own name, and each import of a task module."""
    bad, where = [], path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in words:
            bad.append(f"{where}:{node.lineno}: {node.value!r} (task {words[node.value]})")
    for target, _, line in imports(name, path, known):
        if target in words and (name, target) not in ONE_TASK_IMPORTS:
            bad.append(f"{where}:{line}: imports {target} (ask the registry, `tasks`)")
    return bad


def test_study_and_analysis_name_no_task():
    """Tasks own their names, run columns, aliases and metrics: nothing in study/ or analysis/ compares a
    task's name or keys a table by it."""
    known, words = modules(), task_words()
    assert {"sudoku", "text8", "countdown", "sudoku_n", "mask_rate"} <= set(words)
    bad = [b for m, p in known.items() if m.split(".")[0] in ("study", "analysis")
           for b in task_names_in(m, p, words, known)]
    assert bad == []


def test_the_task_name_check_sees_a_name_and_a_column(tmp_path):
    p = tmp_path / "x.py"
    p.write_text('d = agg[agg["task"] == "text8"]\nCOLS = ("sudoku_n",)\n"""text8 in a docstring"""\n'
                 "from tasks.sudoku import Sudoku\n")
    bad = task_names_in("analysis.x", p, task_words(), {"tasks.sudoku": p})
    assert sorted(bad) == ["x.py:1: 'text8' (task text8)", "x.py:2: 'sudoku_n' (task sudoku)",
                           "x.py:4: imports tasks.sudoku (ask the registry, `tasks`)"]


def test_describing_tasks_and_reading_results_import_no_torch_nor_ray():
    """In a fresh interpreter: every task describes itself (metrics, run columns, aliases, data bounds, split
    sizes, sequence) and the report and the Python API load, without torch or ray."""
    import json
    import subprocess
    import sys

    code = ("import json, sys, tasks\n"
            "for name, (cfg, cls) in tasks.TASKS.items():\n"
            "    t = tasks.make_task(cfg())\n"
            "    t.describe(), t.seq_len, t.vocab_size, t.free_positions(), t.max_examples(), cfg().split_size('val')\n"
            "    cls.metric_names_of(), cls.run_column_names, cls.likelihood_metrics(), tasks.metric('exact', name)\n"
            "tasks.run_column_names(), tasks.aliases()\n"
            "import analysis.report, analysis.load, analysis.tables, rmdm_study\n"
            "print(json.dumps(sorted(m for m in ('torch', 'ray', 'model', 'study') if m in sys.modules)))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == []


# study/'s own layers, bottom up (docs/DESIGN.md): a sub-package imports only those below it and itself
STUDY_LAYERS = ("study.spec", "study.engine", "study.commands", "study.cli")


def study_layer(module: str) -> int | None:
    """The index in STUDY_LAYERS of a study module (None for study/__init__ and modules outside study)."""
    return next((i for i, top in enumerate(STUDY_LAYERS) if module == top or module.startswith(top + ".")), None)


def upward_in_study(known: dict[str, Path]) -> list[str]:
    bad = []
    for m, p in known.items():
        mine = study_layer(m)
        if mine is None:
            continue
        for target, _, line in imports(m, p, known):
            theirs = study_layer(target)
            if theirs is not None and theirs > mine:
                bad.append(f"{m}:{line}: {STUDY_LAYERS[mine]} imports {target}")
    return bad


def test_study_sub_packages_import_only_downwards():
    assert upward_in_study(modules()) == []


def test_the_study_layer_check_sees_an_engine_reaching_up(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("def f():\n    from study.commands.status import LiveView\n")
    known = {"study.engine.x": p, "study.commands.status": p}
    assert upward_in_study(known) == ["study.engine.x:2: study.engine imports study.commands.status"]


MAX_FUNCTION_LINES = 80


def long_functions(paths) -> list[str]:
    """`path:line name (n lines)` of every function (methods and nested ones too) over MAX_FUNCTION_LINES."""
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(Path(p).read_text(), filename=str(p))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{Path(p).name}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_over_80_lines():
    """The project's modules and the benchmarks (benchmarks/train_throughput.py's main() was 101 lines)."""
    assert long_functions([*modules().values(), *sorted((ROOT / "benchmarks").glob("*.py"))]) == []


def test_the_length_check_sees_a_long_function(tmp_path):
    p = tmp_path / "x.py"
    body = lambda n: "    x = 1\n" * (n - 1)  # a function of n lines with its def line
    p.write_text(f"def ok():\n{body(MAX_FUNCTION_LINES)}\nclass C:\n    def long(self):\n{'    ' + body(81).replace(chr(10), chr(10) + '    ')}")
    assert long_functions([p]) == [f"x.py:{MAX_FUNCTION_LINES + 3} long (81 lines)"]
# ---- module sizes -------------------------------------------------------------------------------------------
MAX_MODULE_LINES = 600
# modules allowed over the limit while another hand splits them (none now: every split of round 5 has landed)
OVER_SIZE_BEING_SPLIT: set[str] = set()


def over_size(known: dict[str, Path], limit: int = MAX_MODULE_LINES) -> list[str]:
    """'path: N lines' for every module of the project's packages longer than `limit` lines."""
    out = []
    for p in known.values():
        n = len(p.read_text().splitlines())
        if n > limit:
            out.append(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p.name}: {n} lines")
    return sorted(out)


def test_no_module_over_600_lines():
    bad = [b for b in over_size(modules()) if b.split(":")[0] not in OVER_SIZE_BEING_SPLIT]
    assert bad == [], f"split them by job (at most {MAX_MODULE_LINES} lines a module)"


def test_the_size_check_sees_a_long_module(tmp_path):
    p = tmp_path / "long.py"
    p.write_text("x = 1\n" * 601)
    (tmp_path / "short.py").write_text("x = 1\n" * 600)
    assert over_size({"a.long": p, "a.short": tmp_path / "short.py"}) == ["long.py: 601 lines"]


def test_no_product_module_reads_a_fault_variable():
    """Faults are the tests' to inject (tests/faults/faultplug.py): no product module names an RMDM_FAULT_*
    variable, nor any code of the fault plugin."""
    bad = [str(p.relative_to(ROOT)) for p in modules().values()
           if any(w in p.read_text(encoding="utf-8") for w in ("RMDM_FAULT_", "faultplug"))]
    assert bad == []
