"""The install the README describes is the one CI runs and tests: the test command is .ci/run's, both
set-up commands use constraints.txt, and the installed versions are the pinned ones.
Run: .venv/bin/python -m pytest tests/test_install.py -q
"""
from __future__ import annotations

import os
import re
from importlib import metadata

from tests.helpers import ROOT


def _blocks() -> list[str]:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    setup = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", setup, re.S)


def _one_line(cmd: str) -> str:
    """A command shown over several lines (`\\` continuations) as the one line the shell runs."""
    return " ".join(cmd.replace("\\\n", " ").split())


def test_readme_test_command_is_ci_run_and_both_use_the_constraints():
    demo, tests = _blocks()[:2]
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert tests in ci  # exactly as written, over the same lines
    start = ci.index(tests)
    assert ci[:start].endswith("\n") and ci[start + len(tests)] == "\n"  # whole lines, none of them a comment
    assert not any(line.lstrip().startswith("#") for line in tests.splitlines())
    assert "\\\n" in tests and len(tests.splitlines()) > 1  # shown over lines
    for cmd in (demo, tests):
        assert "pip install torch==2.13.0 && .venv/bin/pip install -c constraints.txt -e " in _one_line(cmd)
    assert _one_line(tests).endswith("&& .venv/bin/python -m pytest")
    assert _one_line(demo).endswith("&& .venv/bin/study report --study demo_sudoku --figure all")


def test_installed_versions_are_the_constrained_ones():
    pins = {}
    for line in open(os.path.join(ROOT, "constraints.txt"), encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name] = version
    assert {"ray", "optuna", "pandas", "pyarrow", "matplotlib", "seaborn", "pydantic"} <= set(pins)
    assert "torch" not in pins  # a GPU machine installs its own build
    wrong = {n: (v, metadata.version(n)) for n, v in pins.items() if metadata.version(n) != v}
    assert not wrong, f"installed versions differ from constraints.txt (pinned, installed): {wrong}"


def test_python_version_of_readme_matches_pyproject():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    pyproject = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    assert "## Set-up (fresh machine, Python 3.11)" in readme and 'requires-python = ">=3.11"' in pyproject


def test_version_and_figure_help():
    from tests.helpers import study

    v = study("--version")
    assert v.returncode == 0 and re.fullmatch(r"rmdm-study \S+\n", v.stdout), v.stdout
    h = study("report", "--help")
    assert "training-curves" in h.stdout and "default: iso-param" in h.stdout


def test_a_license_and_a_changelog_are_there_and_the_readme_names_them():
    """What a user of any package expects to find (issue 33): a LICENSE (MIT), a CHANGELOG with an
    Unreleased section, both linked from the README."""
    license_text = open(os.path.join(ROOT, "LICENSE")).read()
    assert license_text.startswith("MIT License") and "Permission is hereby granted" in license_text
    changelog = open(os.path.join(ROOT, "CHANGELOG.md")).read()
    assert changelog.startswith("# Changelog") and "\n## Unreleased" in changelog
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "(CHANGELOG.md)" in readme and "(LICENSE)" in readme


def test_every_package_the_product_imports_is_declared_in_pyproject():
    """Each third-party package a product module imports (at its top or inside a function) is one that
    pyproject.toml declares (dependencies, or an extra other than `test`): an install as the README's first
    command makes it has it (issue 43: scipy was imported and not declared)."""
    import ast
    import importlib.metadata as md
    import re
    import sys
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    specs = project["dependencies"] + [d for k, v in project["optional-dependencies"].items() if k != "test" for d in v]
    declared = {re.split(r"[\[<>=!~ ;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in specs}
    ours = {"study", "model", "tasks", "analysis", "stats", "store", "atomicio", "rmdm_study"}
    dists = md.packages_distributions()
    OPTIONAL = {"threadpoolctl"}  # analysis/ladder/loss.py: a speed-up, imported under `except ImportError`
    missing = {}
    for top in sorted(ours):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(dirpath, name)
                for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                    if isinstance(node, ast.Import):
                        mods = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        mods = [node.module]
                    else:
                        continue
                    for mod in (m.split(".")[0] for m in mods):
                        if mod in ours or mod in sys.stdlib_module_names or mod in OPTIONAL:
                            continue
                        names = {d.lower().replace("_", "-") for d in dists.get(mod, [mod])}
                        if not names & declared:
                            missing.setdefault(mod, os.path.relpath(path, ROOT))
    assert not missing, f"imported by the product but not declared in pyproject.toml: {missing}"
