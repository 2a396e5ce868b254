"""The README and the guide (docs/guide/*.md) cannot drift from the code: every fenced bash, python or yaml block on
them carries a `<!-- doc-test: MODE -->` marker and is checked by it:
- `run`: run by bash on the one-minute study (README's first block builds its store; the guide's run after it);
- `parse`: needs a long run, a cluster, a network or another study's store, so each `study ...` line goes through the
  command line's own parser (every command, option and value type; placeholders such as GRID stand for values), and
  every grid file it names exists; a `study plan` (no --measure) runs in seconds and is never only parsed;
- `grid`: a grid, expanded and validated as `study plan` does;
- `python`: run in Python on the one-minute study's store;
- `install` (the README's set-up, tests/test_install.py) and `test_api` (the API example, tests/test_api.py).
Each guide page starts with an example. About 2 minutes on an idle 2-core CPU (one real `study run`).
Run: .venv/bin/python -m pytest tests/test_docs.py -q
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.helpers import ROOT

PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "guide", "*.md")))
BLOCK = re.compile(r"(?:<!-- doc-test: (?P<mode>[\w-]+) -->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)\n```", re.S)
MODES = {"run", "parse", "grid", "python", "install", "test_api"}


def blocks(page: str) -> list[tuple[str | None, str, str]]:
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    return [(m["mode"], m["lang"], m["body"]) for m in BLOCK.finditer(text)]


def of_mode(mode: str) -> list[tuple[str, int, str]]:
    return [(page, i, body) for page in PAGES for i, (m, _, body) in enumerate(blocks(page)) if m == mode]


def _lines(body: str) -> list[list[str]]:
    """The block's commands, continuation lines joined, comments dropped, split as the shell would."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def test_every_block_is_marked_and_every_page_starts_with_an_example():
    assert len(PAGES) >= 12, PAGES  # README + the guide's index and its eleven pages
    for page in PAGES:
        bl = blocks(page)
        for mode, lang, body in bl:
            assert lang in ("bash", "python", "yaml"), (page, lang, body[:60])
            assert mode in MODES, f"{page}: a {lang} block without a doc-test marker: {body[:60]!r}"
        if page.startswith("docs/guide/") and not page.endswith("README.md"):
            text = open(os.path.join(ROOT, page), encoding="utf-8").read()
            first = [line for line in text.splitlines()[1:] if line.strip()][0]
            assert first.startswith("<!-- doc-test:"), f"{page} does not start with an example: {first!r}"
    assert os.path.getsize(os.path.join(ROOT, "README.md")) and \
        len(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().splitlines()) <= 150


def test_api_example_is_the_one_test_api_runs():
    from test_api import readme_example

    (page, _, body), = of_mode("test_api")
    assert readme_example().strip() == body.strip(), page


def _synopsis(words: list[str]) -> list[str]:
    """A synopsis line as arguments: brackets dropped, '...' dropped, the first of `a|b` alternatives."""
    out = []
    for w in words:
        w = w.strip("[]")
        if w in ("", "...") or w.endswith("..."):
            continue
        out.append(w.split("|")[0] if w.startswith("-") or "|" in w and "=" not in w else w)
    return out


def _parse(args: list[str]) -> None:
    """`study ARGS` through the CLI's parser only: the command, every option and each value's type (nothing runs)."""
    from typer.main import get_command

    from study.cli import app

    cli = get_command(app)
    if args == ["--install-completion"]:  # the option exists; parsing it would install completion here
        assert any("--install-completion" in p.opts for p in cli.params)
        return
    with cli.make_context("study", list(args)) as ctx:
        rest = ctx._protected_args + ctx.args
        if not rest:
            return
        name, cmd, sub = cli.resolve_command(ctx, rest)
        with cmd.make_context(name, sub, parent=ctx):
            pass


def _commands(body: str) -> list[list[str]]:
    cmds = []
    for words in _lines(body):
        for i, w in enumerate(words):  # `a || true`, `a && b`: each study command of the line
            if os.path.basename(w) == "study" and (i == 0 or words[i - 1] in ("&&", "||", ";")):
                end = next((j for j in range(i + 1, len(words)) if words[j] in ("&&", "||", ";")), len(words))
                cmds.append(words[i + 1:end])
    return cmds


@pytest.mark.parametrize("page, i, body", of_mode("parse") + of_mode("run"),
                         ids=lambda v: str(v)[:40] if isinstance(v, str) else str(v))
def test_commands_parse(page, i, body):
    cmds = _commands(body)
    assert cmds, (page, body)
    for args in cmds:
        args = _synopsis(args)
        try:
            _parse(args)
        except SystemExit as e:  # an eager option (--version) ends the parse itself
            assert e.code in (0, None), (page, args)
        except Exception as e:
            if type(e).__name__ == "Exit" and getattr(e, "exit_code", 1) == 0:
                continue
            raise AssertionError(f"{page}: `study {' '.join(args)}` does not parse: {e}") from None
        for a in args:
            if re.fullmatch(r"grids/\S+\.yaml", a):
                assert os.path.isfile(os.path.join(ROOT, a)), f"{page}: {a} does not exist"


def test_no_command_that_runs_in_seconds_is_only_parsed():
    """`parse` is for commands that need a long run, a cluster, a network or a store the test has not built: a
    `study plan` (no --measure: it trains) reads grid files only and runs in seconds, so it is run. (Three were
    parsed only: concepts.md's, grids.md's narrowed axes and running.md's --mfu estimate.)"""
    parsed = [(page, args) for page, _, body in of_mode("parse") for args in _commands(body)
              if args[:1] == ["plan"] and "--measure" not in args and not any(a.isupper() for a in args[1:2])]
    assert parsed == [], "run these (`<!-- doc-test: run -->`): they need no store and run in seconds"


@pytest.mark.parametrize("page, i, body", of_mode("grid"), ids=lambda v: str(v)[:40])
def test_grid_blocks_expand(page, i, body, tmp_path):
    from study.spec.grid import check_data, load_grid

    path = tmp_path / "grid.yaml"
    path.write_text(body + "\n")
    g = load_grid(str(path))
    check_data(g)
    assert g.runs, page


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A directory like a checkout after the README's first study: grids/, example_tasks/ and .venv linked, the store built by
    running the README's first `run` block as written."""
    base = tmp_path_factory.mktemp("docs")
    os.symlink(os.path.join(ROOT, "grids"), base / "grids")
    os.symlink(os.path.join(ROOT, "example_tasks"), base / "example_tasks")  # docs/guide/new-task.md's task
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), base / ".venv")
    (page, _, first), *_ = of_mode("run")
    assert page == "README.md" and "study run grids/first_study.yaml" in first
    out = _bash(first, base)
    assert os.path.isfile(base / "results" / "first_study" / "figures" / "iso_param.png"), out
    assert "2 done, 0 failed" in out, out
    return base


def _env() -> dict:
    bindir = os.path.dirname(sys.executable)
    return {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": ROOT,
            "MPLBACKEND": "Agg"}


def _bash(body: str, cwd) -> str:
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=cwd, env=_env(), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, f"exit {run.returncode}\n{body}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout + run.stderr


@pytest.mark.parametrize("page, i, body", of_mode("run")[1:], ids=lambda v: str(v)[:40])
def test_run_blocks(work, page, i, body):
    out = _bash(body, work)
    if "study run grids/first_study.yaml" in body:
        assert "0 to run" in out, out
    if "study predict --study first_study" in body:
        assert "error:" in out, out


@pytest.mark.parametrize("page, i, body", of_mode("python"), ids=lambda v: str(v)[:40])
def test_python_blocks(work, page, i, body):
    run = subprocess.run([sys.executable, "-c", body], cwd=work, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"{page}\n{body}\n{run.stderr[-3000:]}"
    assert run.stdout.strip(), page


def test_schema_page_names_every_column_and_no_other():
    from store import SCHEMAS

    text = open(os.path.join(ROOT, "docs", "guide", "schema.md"), encoding="utf-8").read()
    for table, schema in SCHEMAS.items():
        section = text.split(f"\n## {table}:", 1)[1].split("\n## ", 1)[0]
        named = re.findall(r"^\| `(\w+)` \|", section, re.M)
        assert named == schema.names, (table, set(named) ^ set(schema.names))


def test_the_first_studys_text_matches_its_grid_and_no_guide_grid_takes_a_projects_study():
    """README's "N steps each" is grids/first_study.yaml's; a guide grid copied as written never adds runs
    to a study of the project's grids (grids.md's first one named demo_sudoku's study)."""
    import yaml

    from study.spec.grid import load_grid

    steps = {r.train.steps for r in load_grid(os.path.join(ROOT, "grids", "first_study.yaml")).runs}
    assert len(steps) == 1 and f"{steps.pop()} steps each" in open(os.path.join(ROOT, "README.md")).read()
    ours = set()
    for path in glob.glob(os.path.join(ROOT, "grids", "**", "*.yaml"), recursive=True):
        with open(path) as f:
            ours.add((yaml.safe_load(f) or {}).get("study") or os.path.splitext(os.path.basename(path))[0])
    for page, i, body in of_mode("grid"):
        assert (yaml.safe_load(body) or {}).get("study") not in ours, (page, i)
