"""Every user mistake is one line of message and exit code 2, never a traceback: the real CLI
(typer's CliRunner on `study.cli.app`), real files, a real tiny trained 4x4 Sudoku run for `eval`.
Run: pytest tests/test_cli_errors.py"""
from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from store import Store
from study.cli import app
from tests.helpers import TINY

TASK = "task: {name: sudoku, n: 4, mask_rate: 0.4, n_train: 40, n_test: 8}\nmodel: {d_model: 16, n_heads: 2}\n"
SOL = "1234341221434321"  # a valid 4x4 grid
QUIZ = "1.3.3.1.2.4.4.2."


def cli(*args: str):
    r = CliRunner().invoke(app, list(args))
    # exceptions CliRunner caught would have been a traceback for the user
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output, r.output
    return r


def fails(code: int, *args: str, words: tuple[str, ...]) -> str:
    r = cli(*args)
    assert r.exit_code == code, (r.exit_code, r.output)
    for w in words:
        assert w in r.output, (w, r.output)
    return r.output


@pytest.fixture
def grid(tmp_path) -> str:
    p = tmp_path / "g.yaml"
    p.write_text("study: g\n" + TASK + "train: {steps: 2, batch_size: 4}\neval: {T: [1], n_examples: 4}\n")
    return str(p)


# ---- grid files --------------------------------------------------------------------------
def test_binary_grid_file(tmp_path):
    p = tmp_path / "bin.yaml"
    p.write_bytes(bytes(range(256)) * 4)
    fails(2, "plan", str(p), words=(str(p), "not a YAML text file"))


def test_grid_path_is_a_directory(tmp_path):
    fails(2, "plan", str(tmp_path), words=(str(tmp_path), "is a directory"))


def test_duplicate_key_is_refused_naming_key_and_lines(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("study: dup\n" + TASK + "train:\n  steps: 5\n  lr: 0.01\n  steps: 50\n")
    fails(2, "plan", str(p), words=("duplicate key 'steps'", "line 5", "line 7"))


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    p = tmp_path / "merge.yaml"
    p.write_text("study: merge\n" + TASK + "base: &b {steps: 5, lr: 0.01}\n".replace("base", "description")
                 + "train: {<<: *b, steps: 7}\n")
    assert cli("plan", str(p)).exit_code == 0


@pytest.mark.parametrize("body, key", [
    ("axes:\n  K: [true]\n", "model.K"),
    ("train: {lr: true}\n", "train.lr"),
    ("eval: {T: [1, false]}\n", "eval.T"),
    ("resources: {cpu: true}\n", "resources.cpu"),
    ("couple:\n  - [{K: 1, L: true}]\n", "model.L"),
])
def test_booleans_are_not_numbers(tmp_path, body, key):
    p = tmp_path / "b.yaml"
    p.write_text("study: b\n" + TASK + body)
    fails(2, "plan", str(p), words=(key, "boolean"))


def test_booleans_stay_allowed_where_meant(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("study: ok\n" + TASK.replace("n_heads: 2}", "n_heads: 2, reinject_input: true}"))
    assert cli("plan", str(p)).exit_code == 0


def test_alias_bomb_value_is_cut_in_the_message(tmp_path):
    lines = ["description:", '  - &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  - &{chr(97 + i)} [" + ",".join(["*" + chr(96 + i)] * 9) + "]" for i in range(1, 8)]
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(lines) + "\n" + TASK.replace("d_model: 16", "d_model: *h"))  # 9**8 leaves
    out = fails(2, "plan", str(p), words=("model.d_model",))
    assert len(out) < 1500


# ---- results and output paths ------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["run", "status"])
def test_results_pointing_to_a_file(tmp_path, grid, cmd):
    f = tmp_path / "afile"
    f.write_text("x")
    fails(2, cmd, grid, "--results", str(f), words=("--results", str(f), "is a file"))


def test_report_results_pointing_to_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    fails(2, "report", "--results", str(f), words=("--results", "is a file"))


@pytest.fixture(scope="module")
def trained(tiny_run, tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("results"))  # conftest.py: this module's copy of the session's run


def test_report_out_unwritable(trained, tmp_path):
    root, _ = trained
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a directory below a file cannot exist (root or not)
    fails(2, "report", "--results", root, "--out", str(blocker / "figs"), words=("--out", "cannot create"))


def test_report_unknown_split_names_the_allowed_ones(trained, tmp_path):
    root, _ = trained
    fails(2, "report", "--results", root, "--split", "vall", "--out", str(tmp_path / "figs"),
          words=("--split", "'vall'", "test, val"))
    assert not (tmp_path / "figs").exists()  # refused before any work


def _external_evals(root: str, run_id: str) -> int:
    evals = Store(root, TINY).read("evals", run_id)
    return int(evals["split"].str.startswith("external:").sum())


def test_eval_puzzles_is_a_directory(trained, tmp_path):
    root, run_id = trained
    fails(2, "eval", run_id, "--puzzles", str(tmp_path), "--results", root, words=("--puzzles", "is a directory"))


def test_eval_out_unwritable_writes_nothing_to_the_store(trained, tmp_path):
    root, run_id = trained
    src = tmp_path / "p.txt"
    src.write_text(QUIZ + "\n")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    before = _external_evals(root, run_id)
    fails(2, "eval", run_id, "--puzzles", str(src), "--results", root, "--out", str(blocker / "out.txt"),
          words=("--out", "no such directory"))
    fails(2, "eval", run_id, "--puzzles", str(src), "--results", root, "--out", str(tmp_path),
          words=("--out", "is a directory"))
    assert _external_evals(root, run_id) == before  # checked before any row was written


@pytest.mark.parametrize("opt", ["--T", "--L-s"])
def test_eval_zero_steps_or_loops_are_refused(trained, tmp_path, opt):
    root, run_id = trained
    src = tmp_path / "p.txt"
    src.write_text(QUIZ + "\n")
    fails(2, "eval", run_id, "--puzzles", str(src), "--results", root, opt, "0",
          words=(f"Invalid value for '{opt}'", "greater than or equal to 1"))


@pytest.mark.parametrize("text, words", [
    (f"{QUIZ}\n1123{QUIZ[4:]}\n", (":2:", "contradict", "digit 1 is given twice in row 1")),
    (f"quiz,solution\n{QUIZ},{SOL}\n", (":1:", "CSV header", "'quiz,solution'")),
    (f"{QUIZ},{SOL}\n", (":1:", "header")),
])
def test_eval_bad_puzzle_files(trained, tmp_path, text, words):
    root, run_id = trained
    src = tmp_path / "bad.txt"
    src.write_text(text)
    fails(2, "eval", run_id, "--puzzles", str(src), "--results", root, words=(str(src), *words))


def test_eval_utf8_bom_is_no_cell(trained, tmp_path):
    root, run_id = trained
    src = tmp_path / "bom.csv"
    src.write_bytes(b"\xef\xbb\xbf" + f"quizzes,solutions\n{QUIZ},{SOL}\n".encode())
    out = tmp_path / "solved.csv"
    r = cli("eval", run_id, "--puzzles", str(src), "--results", root, "--out", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_text().splitlines()[0] == "quizzes,solutions"


def test_unexpected_errors_are_one_line_unless_debug(tmp_path, monkeypatch):
    import study.spec.grid

    def boom(path, *args, **kwargs):  # load_grid(path, overrides)
        raise RuntimeError("something broke")

    monkeypatch.setattr(study.spec.grid, "load_grid", boom)
    r = cli("plan", "x.yaml")
    assert r.exit_code == 1 and "internal error (RuntimeError: something broke)" in r.output
    r = CliRunner().invoke(app, ["--debug", "plan", "x.yaml"])
    assert isinstance(r.exception, RuntimeError)  # --debug lets the traceback through
    assert os.environ.get("RMDM_DEBUG") is None


# ---- usage mistakes (issue 33): one line, exit 2, never click's boxed usage text ----------------------------
@pytest.mark.parametrize("args,words", [
    ((), ("give a command: plan, run, status", "study --help")),
    (("run",), ("study run: Missing argument 'GRID'", "study run --help")),
    (("frobnicate",), ("study: No such command 'frobnicate'",)),
    (("--bogus",), ("study: No such option: --bogus",)),
    (("run", "g.yaml", "--num-cpus", "-1"), ("study run: Invalid value for '--num-cpus'",)),
    (("report", "--jobs", "0"), ("study report: Invalid value for '--jobs'",)),
    (("report", "--T", "-1"), ("study report: Invalid value for '--T'",)),
    (("predict", "--boot", "1000000000"), ("study predict: Invalid value for '--boot'",)),
])
def test_usage_mistakes_are_one_line_exit_2(args, words):
    r = cli(*args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert len(r.output.strip().splitlines()) == 1 and r.output.startswith("error: "), r.output
    assert "╭" not in r.output and "Usage:" not in r.output
    for w in words:
        assert w in r.output, (w, r.output)


def test_help_and_version_still_exit_0():
    r = cli("run", "--help")
    assert r.exit_code == 0 and "Usage" in r.output
    assert cli("--version").exit_code == 0


def test_a_validator_message_says_got_once_and_a_coupled_override_names_file_and_syntax(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("study: c\n" + TASK + "train: {steps: 2, batch_size: 4}\neval: {T: [1], n_examples: 4}\n"
                 "couple:\n  - [{K: 1, L: 2}, {K: 1, L: 1}]\n")
    out = fails(2, "plan", str(p), "task.n=5", words=("n must be one of 4, 9, 16, 25 (got 5)",))
    assert out.count("(got") == 1 and "Value error" not in out, out
    out = fails(2, "plan", str(p), "L=[1,2]", words=(f"override L=[1,2] (on {p})", "couple[0][0] sets model.L",
                                                      "couple='[[{K: 1, L: 1}, {K: 1, L: 2}]]'"))
    assert len(out.strip().splitlines()) == 1


# ---- where a command looked (issue 33) ------------------------------------------------------------------
def test_status_from_elsewhere_names_where_it_looked(tmp_path, grid, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # a grid that has not run is a fair question (exit 0, every run pending); the note says where it looked
    r = cli("status", grid)
    assert r.exit_code == 0 and "pending 1" in r.output, r.output
    assert (f"note: --results 'results' ({elsewhere}/results): no such directory, so study 'g' has not run there"
            in r.output), r.output
    (tmp_path / "results" / "g" / "runs").mkdir(parents=True)  # the grid's own directory holds the study
    r = cli("status", grid)
    assert r.exit_code == 0 and f"the grid's directory has it: --results {tmp_path}/results" in r.output, r.output
    (elsewhere / "results" / "other" / "runs").mkdir(parents=True)
    (elsewhere / "results" / "other" / "runs" / "x.parquet").write_text("")
    r = cli("status", grid)
    assert r.exit_code == 0 and "pending 1" in r.output
    assert f"note: no study 'g' under 'results' ({elsewhere}/results) yet" in r.output and "studies there: other" in r.output


def test_report_with_an_unknown_study_lists_the_studies_there(tmp_path):
    for name in ("alpha", "beta"):
        (tmp_path / name / "runs").mkdir(parents=True)
        (tmp_path / name / "runs" / "x.parquet").write_text("")
    fails(2, "report", "--study", "nope", "--results", str(tmp_path),
          words=(f"no study 'nope' under '{tmp_path}'; studies there: alpha, beta",))
    fails(2, "verify", "--study", "nope", "--results", str(tmp_path), words=("studies there: alpha, beta",))


def test_a_closed_pipe_prints_nothing(tmp_path, grid):
    """`study status GRID | head -1`, made certain: the reading end of a real pipe is closed before `study`
    writes, so its first write meets EPIPE (no timing involved)."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    (tmp_path / "results" / "g").mkdir(parents=True)
    r_fd, w_fd = os.pipe()
    os.close(r_fd)
    try:
        p = subprocess.run([sys.executable, "-m", "study.cli", "status", grid, "--results", str(tmp_path / "results")],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, stdout=w_fd, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    finally:
        os.close(w_fd)
    assert p.stderr == "" and p.returncode == 141, (p.returncode, p.stderr)


def test_run_from_another_directory_finds_the_projects_store_and_says_where_it_writes(tmp_path):
    """`study run` elsewhere than the project (issue 44: it made ./results and retrained from zero): a grid
    under a project's grids/ whose results/ holds the study is refused naming that store; otherwise the
    store is named (new or not) before anything is trained."""
    from tests.helpers import study, tiny_grid

    project, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    (project / "grids").mkdir(parents=True)
    (project / "results" / "away").mkdir(parents=True)
    elsewhere.mkdir()
    grid = project / "grids" / "away.yaml"
    grid.write_text(tiny_grid("away", steps=2))
    r = study("run", str(grid), cwd=str(elsewhere))
    assert r.returncode == 2 and not (elsewhere / "results").exists(), r.stderr
    assert f"its project's store has it: {project / 'results' / 'away'}; run from {project}" in r.stderr, r.stderr
    # --results given: the user's choice, named before any work (here a bad --address stops it)
    r = study("run", str(grid), "--results", str(elsewhere / "results"), "--address", "bad addr", cwd=str(elsewhere))
    assert r.returncode == 2 and f"study away: store {elsewhere / 'results' / 'away'} (new" in r.stdout, r.stdout
    r = study("run", str(grid), "--address", "bad addr", cwd=str(project))
    assert r.returncode == 2 and f"study away: store {project / 'results' / 'away'}\n" in r.stdout, r.stdout
