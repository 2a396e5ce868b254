"""What the terminal and `study status` say, read from the captured output of real runs of a tiny grid:
one clean progress line per update (no Ray box, one ETA, sane from the first line), on a pipe and on a
terminal (a pty); `study tune` shows the same progress; a failed run's root cause in one plain line;
a Ctrl-C of a `--retry-failed` run is "interrupted"; `study prune` sets aside what no grid asks for.

Run: pytest tests/test_terminal.py   (the rest: pytest -m slow tests/test_terminal.py)
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from store import Store
from tests.helpers import ROOT, ctrl_c_when, faulty, study, study_cmd, tiny_grid

DUR = r"(?:\d+h\d\dm|\d+m\d\ds)"
PROGRESS = (rf"\[{DUR}\] done \d+/\d+  running \d+  pending \d+(?: \([^)]*\))?(?:  interrupted \d+)?  "
            rf"failed \d+(?:  eta (?:\?|{DUR}))?")  # no ETA once nothing is left (issue 44: "eta ?")
LINE = re.compile(rf"^{PROGRESS}$")
BAR_LINE = re.compile(rf"^{PROGRESS} \|[^|]*\|$")  # on a terminal: the line, then a bar of training steps done
# what Ray or Tune print on their own, which must never reach the terminal of `study run` / `study tune`
RAY_TEXT = ("Configuration for experiment", "╭", "╰", "│", "View detailed results", "Trial status",
            "tensorboard --logdir", "Training started", "Training finished", "(pid=", "Traceback",
            "RayTaskError", "ImplicitFunc", "Current time:", "Logical resource usage", "INFO ", "WARNING ")
OTHER = ("study ", "ray: ", "  failed ", "interrupted: ", "lease: ", "group ", "best values: ", "  trial ")
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def seconds(d: str) -> float:
    if d == "?":
        return 0.0
    a, b = re.fullmatch(r"(\d+)[hm](\d+)[ms]", d).groups()
    return int(a) * (3600 if "h" in d else 60) + int(b) * (60 if "h" in d else 1)


def check_lines(lines: list[str], wall_s: float, pattern=LINE) -> list[str]:
    """Every progress line matches one pattern with one ETA no longer than a few times the whole run;
    every other line is one of the tool's own; no Ray text anywhere. Returns the progress lines."""
    progress = []
    for line in lines:
        for text in RAY_TEXT:
            assert text not in line, f"Ray's {text!r} in {line!r}"
        if "eta" in line or " done " in line and "running" in line:
            assert pattern.match(line), f"not one clean progress line: {line!r}"
            assert line.count("eta") == 1 or " running 0  pending 0 " in line, line
            eta = seconds(line.rsplit("eta ", 1)[1].split(" |")[0]) if "eta " in line else 0.0
            assert eta <= max(120.0, 5 * wall_s), f"an ETA of {eta:.0f}s for a {wall_s:.0f}-s run: {line!r}"
            progress.append(line)
        else:
            assert line.startswith(OTHER), f"a line that is not the tool's own: {line!r}"
    return progress


# slow set (14 s of the default suite, measured under load); the default suite keeps test_eta and test_ray_start's progress-line tests
@pytest.mark.slow
def test_run_prints_one_clean_progress_line_per_update(tmp_path):
    g = tmp_path / "g.yaml"
    g.write_text(tiny_grid("termrun", steps=40))
    t0 = time.time()
    r = study("run", str(g), "--results", str(tmp_path / "res"), "--num-cpus", "2", "--progress-every", "0.5",
              cwd=str(tmp_path))
    wall = time.time() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    at = next(i for i, ln in enumerate(lines) if ln.startswith("result of study termrun (test split; "))
    lines, result = lines[:at], lines[at:]
    progress = check_lines(lines, wall)
    assert len(progress) >= 3, out  # one per trial started or ended at least
    assert "done 2/2" in progress[-1], out
    assert lines[-1].startswith("study termrun: 2 done, 0 failed, 0 incomplete"), out
    check_result(result, "termrun", str(tmp_path / "res"))
    # Tune's trial folders: <run_id>_<trial id>, not the whole config strung together
    folders = [p for p in (tmp_path / "res" / "termrun" / ".ray").glob("*/*") if p.is_dir()]
    assert sorted(p.name.split("_")[0] for p in folders) == sorted(Store(str(tmp_path / "res"), "termrun")
                                                                 .read("runs")["run_id"]), folders
    assert all(len(p.name) <= 40 for p in folders), folders
    etas = [p.rsplit("eta ", 1)[1] for p in progress if "eta " in p]
    assert etas[0] == "?", out  # no pace measured before the first trial reported twice


def check_result(result: list[str], name: str, results: str) -> None:
    """The lines `study run` ends with for tiny_grid's (1 x 1) and (1 x 2), one seed each: the headline table
    (vpr at T = 1 and 2, each value with its interval, each interval's method named), the verdicts it
    supports (none: one matched seed) and the report's command (lines wrapped at 100 columns joined back)."""
    from tests.helpers import unwrapped

    result = unwrapped(result)
    assert result[1] == "  sudoku 4x4, 40% masked: vpr" and result[2].split() == ["T=1", "T=2"], result
    cell = r"\d\.\d{3} \[(?:\d\.\d{3}, \d\.\d{3}|not estimable)\](?: \([a-z]\))?"
    for row, shape in zip(result[3:5], ("(1 x 1)", "(1 x 2)")):
        assert re.fullmatch(rf"    {re.escape(shape)}  \S+ params, 1 seed\(s\)  {cell}  {cell}", row), result
    methods = result[5:-2]  # one seed: that evaluation's own interval (named once per method)
    assert methods and all(re.fullmatch(r"    interval(?: \([a-z]\))?: \S.*", m) for m in methods), result
    assert result[-2] == ("  2 of 2 comparisons have fewer than 2 matched seeds: no verdict about the recipes (train "
                          "more seeds of both models)"), result
    assert result[-1] == f"report: study report --study {name} --results {results} --figure all", result


def run_in_pty(cmd: list[str], cwd, env: dict, timeout: float = 600) -> tuple[int, str]:
    """`cmd` with stdin, stdout and stderr on a pseudo-terminal 160 columns wide; (exit code, all it wrote).
    The process is killed (by its handle) if it outlives `timeout`."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    chunks, deadline, idle_since = [], time.time() + timeout, None
    try:
        while time.time() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: every process holding the terminal has closed it
                    break
                if not data:
                    break
                chunks.append(data)
                idle_since = None
            elif p.poll() is not None:  # ended, and nothing more to read for a while (Ray's helpers may hold it)
                idle_since = idle_since or time.time()
                if time.time() - idle_since > 3:
                    break
        else:
            p.kill()
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        os.close(master)
    return p.returncode, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_terminal_shows_one_line_redrawn_and_nothing_inside_it(tmp_path):
    """On a terminal the live line is redrawn in place (carriage returns): each drawing is the one line
    and its bar, with one ETA; the lines after it start on a line of their own.
    Run: pytest -m slow tests/test_terminal.py -k terminal_shows"""
    g = tmp_path / "g.yaml"
    g.write_text(tiny_grid("termtty", steps=40))
    t0 = time.time()
    code, out = run_in_pty(study_cmd("run", str(g), "--results", str(tmp_path / "res"), "--num-cpus", "2"),
                           tmp_path, {**os.environ, "PYTHONPATH": ROOT})
    wall = time.time() - t0
    assert code == 0, out
    drawn = [s.strip() for s in re.split(r"[\r\n]", ANSI.sub("", out)) if s.strip()]
    at = next(i for i, ln in enumerate(drawn) if ln.startswith("result of study termtty (test split; "))
    drawn, result = drawn[:at], drawn[at:]  # the result: each line of its own, after the live line ended
    assert [r.split("  ")[0] for r in result[3:5]] == ["(1 x 1)", "(1 x 2)"], result
    assert result[-1].startswith("report: study report --study termtty"), result
    progress = check_lines(drawn, wall, BAR_LINE)
    assert progress and "done 2/2" in progress[-1], out
    assert "study termtty: 2 done, 0 failed, 0 incomplete; results in" in " ".join(drawn), out
    assert not any("s/run" in s or "run/s" in s for s in drawn), out  # tqdm's own rate and ETA: not shown


@pytest.mark.slow
def test_tune_prints_progress_between_its_header_and_its_result(tmp_path):
    """Run: pytest -m slow tests/test_terminal.py -k tune_prints"""
    import yaml

    g = tmp_path / "s.yaml"
    g.write_text(yaml.safe_dump({
        "study": "termtune", "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 30, "n_test": 16},
        "model": {"d_model": 16, "n_heads": 2},
        "train": {"steps": 12, "batch_size": 8, "warmup": 2, "checkpoint_every": 6, "log_every": 4},
        "eval": {"T": [2], "L_s": ["train"], "n_examples": 16},
        "search": {"n_trials": 2, "metric": "val_loss", "mode": "min", "max_concurrent": 2, "seed": 3,
                   "params": {"lr": {"dist": "loguniform", "low": 1e-4, "high": 1e-1}}}}, sort_keys=False))
    t0 = time.time()
    r = study("tune", str(g), "--results", str(tmp_path / "res"), "--num-cpus", "2", cwd=str(tmp_path))
    wall = time.time() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    progress = check_lines(lines, wall)
    head = next(i for i, ln in enumerate(lines) if ln.startswith("study termtune:"))
    best = next(i for i, ln in enumerate(lines) if " best " in ln)
    inside = [ln for ln in lines[head + 1:best] if LINE.match(ln)]
    assert len(inside) >= 2 and inside == progress, out  # each trial started and ended, before the result
    assert "done 2/2" in inside[-1], out


@pytest.mark.slow
def test_root_cause_interrupted_retry_and_prune(tmp_path):
    """A run fails (a NaN loss, injected): its row and `study status` give the root cause in one plain
    line. A `--retry-failed` of it stopped by Ctrl-C is "interrupted", without the old error. A grid that
    asks for neither run: `study prune` lists the failed one (dry run: nothing moves), never the done one
    an earlier grid asks for; `--apply` moves its files aside, after which status and the report's data
    no longer hold it. Run: pytest -m slow tests/test_terminal.py -k prune"""
    from analysis.load import load_study
    from study.spec.grid import load_grid

    res = str(tmp_path / "res")
    store = Store(res, "termfail")
    g0 = tmp_path / "g0.yaml"  # an earlier grid of the study: its run is done
    g0.write_text(tiny_grid("termfail", axes="seed: [0]"))
    good = load_grid(str(g0)).runs[0]
    r = study("run", str(g0), "--results", res, "--num-cpus", "2", cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    g = tmp_path / "g.yaml"  # a long run that fails at step 3 (its retry is long enough to be stopped)
    g.write_text(tiny_grid("termfail", steps=3000, retries=0, axes="seed: [1]")
                 .replace("checkpoint_every: 10, log_every: 5", "checkpoint_every: 500, log_every: 50"))
    bad = load_grid(str(g)).runs[0]
    env = faulty(nan={bad.run_id: 3})
    r = study("run", str(g), "--results", res, "--num-cpus", "2", cwd=str(tmp_path), env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and f"failed {bad.run_id}: FloatingPointError: non-finite loss nan at step 3" in out, out
    row = store.run_row(bad.run_id)
    assert row["status"] == "failed" and row["error"] == "FloatingPointError: non-finite loss nan at step 3", row
    assert "\x1b" not in row["error"] and "\n" not in row["error"]
    log = (tmp_path / "res" / "termfail" / "logs" / f"{bad.run_id}.log").read_text()
    assert "Traceback" in log and "RayTaskError" in log  # the whole story stays in the run's log
    st = study("status", str(g), "--results", res, cwd=str(tmp_path))
    line = next(ln for ln in st.stdout.splitlines() if bad.run_id in ln)
    assert " failed " in line and line.endswith("error: FloatingPointError: non-finite loss nan at step 3"), st.stdout
    assert "RayTaskError" not in st.stdout and "\x1b" not in st.stdout, st.stdout

    # --retry-failed, stopped by a real Ctrl-C once the retry's trial has started (attempt 2)
    attempts = tmp_path / "res" / "termfail" / "logs" / f"{bad.run_id}.attempts"
    code, out = ctrl_c_when(study_cmd("run", str(g), "--results", res, "--num-cpus", "2", "--retry-failed"),
                            tmp_path, {**os.environ, "PYTHONPATH": ROOT},
                            lambda: attempts.read_text().count("\n") >= 2)
    assert code != 0 and "interrupted: 1 run(s) not finished" in out, out
    assert f"failed {bad.run_id}" not in out, out
    st = study("status", str(g), "--results", res, cwd=str(tmp_path))
    line = next(ln for ln in st.stdout.splitlines() if bad.run_id in ln)
    assert " interrupted " in line and "error" not in line, st.stdout
    assert "failed 0" in st.stdout.splitlines()[0] and "interrupted 1" in st.stdout.splitlines()[0], st.stdout

    # a grid of the study that asks for neither run: the failed one goes, the done one stays
    g3 = tmp_path / "g3.yaml"
    g3.write_text(g0.read_text().replace("seed: [0]", "seed: [2]"))
    def files():  # the study's files (not the read index, a cache that any read may refresh)
        return sorted(str(p) for p in (tmp_path / "res" / "termfail").rglob("*") if p.is_file() and "_index" not in p.parts)

    files_before = files()
    r = study("prune", str(g3), "--results", res, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert bad.run_id in r.stdout and good.run_id not in r.stdout and "dry run" in r.stdout, r.stdout
    assert files() == files_before
    r = study("prune", str(g3), "--results", res, "--apply", cwd=str(tmp_path))
    assert r.returncode == 0 and "moved " in r.stdout, r.stdout + r.stderr
    pruned = list((tmp_path / "res" / "termfail" / "pruned").rglob(f"{bad.run_id}*"))
    assert any(p.parent.name == "runs" for p in pruned) and any(p.parent.name == "logs" for p in pruned), pruned
    assert store.run_row(bad.run_id) is None and store.run_row(good.run_id)["status"] == "done"
    assert (tmp_path / "res" / "termfail" / "weights" / f"{good.run_id}.pt").is_file()
    assert set(load_study(res, "termfail").runs.run_id) == {good.run_id}  # what the report reads
    st = study("status", str(g0), "--results", res, cwd=str(tmp_path))
    assert "done 1/1" in st.stdout, st.stdout
    st = study("status", str(g), "--results", res, cwd=str(tmp_path))  # the pruned run: as if never run
    assert "done 0/1" in st.stdout and "pending 1" in st.stdout and "failed 0" in st.stdout, st.stdout
    said = st.stdout.split("): ", 1)[1]  # after the store's path (the test's directory names "interrupted")
    assert "interrupted" not in said and "error" not in said, st.stdout
    r = study("prune", str(g3), "--results", res, cwd=str(tmp_path))
    assert r.returncode == 0 and "no run to prune" in r.stdout, r.stdout
