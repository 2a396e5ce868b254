"""`study --help` and every command's `--help` read as plain text: no typer type tags (`<bool>`, `<str>`), no line
over 80 columns and no text cut with '...'/'…' in an 80-column terminal; shell completion is on
(`--install-completion`, `--show-completion`, and the completion protocol answers); `study plan --resolved` prints
each run's resolved configuration, the one its run id hashes and the store keeps.
Run: .venv/bin/python -m pytest tests/test_cli_help.py -q
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.helpers import ROOT, study, tiny_grid

COMMANDS = ["plan", "run", "status", "prune", "tune", "report", "verify", "backfill", "predict", "eval",
            "migrate", "text8-download"]
TAG = re.compile(r"<(str|bool|int|float|path|list\[[^\]]*\]|[a-z]+ range)>")
NARROW = {"COLUMNS": "80", "TERMINAL_WIDTH": "80"}


def _study_exe() -> str:
    return os.path.join(os.path.dirname(sys.executable), "study")


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_plain_within_80_columns_and_never_cut(command):
    args = ("--help",) if command is None else (command, "--help")
    h = study(*args, env=NARROW)
    assert h.returncode == 0, h.stderr
    text = h.stdout
    assert not TAG.search(text), TAG.search(text).group(0)
    assert not any(ch in text for ch in "╭╰│…"), "a rich box or a cut line"
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, long
    assert "Usage: " in text
    if command is None:  # the command list: each command's first sentence, whole
        rows = text.split("Commands:", 1)[1]
        assert not re.search(r"\.\.\.\s*$", rows, re.M), rows
        for c in COMMANDS:
            assert re.search(rf"^  {re.escape(c)}\s", rows, re.M), c
    else:  # a value option shows a metavar named for it, not its type
        assert re.search(r"--results RESULTS|--study STUDY|--dest DEST|--puzzles PUZZLES|--figure FIGURE", text) \
            or command in ("plan", "tune", "prune", "status", "run"), text


def test_every_command_of_the_app_is_checked():
    """COMMANDS is every command `study` has (`migrate` was missing: its --help went unchecked)."""
    from typer.main import get_command

    from study.cli import app

    assert sorted(get_command(app).commands) == sorted(COMMANDS)


def test_run_help_keeps_the_whole_mlflow_default():
    h = study("run", "--help", env=NARROW)
    assert "sqlite:///<results>/<study>/.ray/mlflow.db" in h.stdout.replace("\n", "").replace(" ", ""), h.stdout


def test_shell_completion_is_offered_and_answers():
    h = study("--help", env=NARROW)
    assert "--install-completion" in h.stdout and "--show-completion" in h.stdout
    env = {**os.environ, "PYTHONPATH": ROOT}
    # typer detects the shell from the process's parents (none is a shell under a background job or a CI
    # runner that execs directly); its own test switch makes the option take the shell named here
    script = subprocess.run([_study_exe(), "--show-completion", "bash"], capture_output=True, text=True,
                            env={**env, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}, timeout=120)
    assert script.returncode == 0 and "_STUDY_COMPLETE=complete_bash" in script.stdout, script.stdout + script.stderr
    comp = subprocess.run([_study_exe()], capture_output=True, text=True, timeout=120,
                          env={**env, "_STUDY_COMPLETE": "complete_bash", "COMP_WORDS": "study pl", "COMP_CWORD": "1"})
    assert comp.returncode == 0 and comp.stdout.split() == ["plan"], comp.stdout + comp.stderr
    opt = subprocess.run([_study_exe()], capture_output=True, text=True, timeout=120,
                         env={**env, "_STUDY_COMPLETE": "complete_bash", "COMP_WORDS": "study report --fig",
                              "COMP_CWORD": "2"})
    assert opt.stdout.split() == ["--figure"], opt.stdout + opt.stderr


def test_plan_resolved_prints_the_config_each_run_hashes(tmp_path):
    from study.spec.grid import config_hash, load_grid

    gpath = tmp_path / "g.yaml"
    gpath.write_text(tiny_grid("resolved_demo"))
    out = study("plan", str(gpath), "train.steps=7", "--resolved")
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    g = load_grid(str(gpath), ["train.steps=7"])
    assert [d["run_id"] for d in docs] == [r.run_id for r in g.runs] and len(docs) == 2
    for d, r in zip(docs, g.runs):
        assert d["train"]["steps"] == 7 and d["model"]["L"] == r.model.L
        assert d["model"]["n_heads"] == 2 and "mlp_ratio" in d["model"]  # defaults filled in
        assert config_hash({k: d[k] for k in ("task", "model", "train")}) == d["run_id"]
        assert d == json.loads(json.dumps(r.resolved(), default=str))
    js = study("plan", str(gpath), "--resolved", "--json")
    rows = [json.loads(line) for line in js.stdout.splitlines()]
    assert [r["run_id"] for r in rows] == [r.run_id for r in load_grid(str(gpath)).runs]
    assert all(r["train"]["steps"] == 20 for r in rows)
