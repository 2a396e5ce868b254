"""What `study report` leaves in its figures folder: every figure drawn from the study as it is now (a figure
is never served from an earlier report, whatever it reads), the same bytes each time, the other figures' files
kept, and no staging folder of a killed report left behind.

Run: .venv/bin/python -m pytest tests/test_report_files.py -q   (the analysis tests' store, real Parquet)
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from store import Store
from tests.test_analysis_data import TS, _write, eval_row, run_row, write_all

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def results(tmp_path):
    root = str(tmp_path / "results")
    write_all(root)
    return root


def report(results: str, out, *extra: str, figure: str = "all") -> str:
    from study.cli import app

    r = CliRunner().invoke(app, ["report", "--study", "ablation", "--figure", figure, "--results", results,
                                 "--out", str(out), "--jobs", "1", *extra])
    assert r.exit_code == 0, r.output
    return r.output


def files(folder) -> dict[str, bytes]:
    """Every file of the folder, the reports' minute of writing masked (the only thing two reports may differ by)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        out[name] = re.sub(rb"\d{4}-\d\d-\d\d \d\d:\d\d UTC", b"<time>", data) if name.startswith("report.") else data
    return out


def test_a_figure_whose_inputs_change_is_drawn_again_whatever_it_declares(results, tmp_path, monkeypatch):
    """losses draws from the aggregated rows; here it also draws from the history (nothing declares that): a
    history row added between two reports is in the second figure (a report that keyed figures by a declared
    list of inputs served the first one again)."""
    from analysis.figures import FIGURES

    module = FIGURES["losses"].module
    draw, seen = module.draw, []

    def draw_with_history(data, derived, opts):
        drawing = draw(data, derived, opts)
        seen.append(int(data.history["step"].max()))
        drawing.fig.suptitle(f"last step {seen[-1]}")
        return drawing

    monkeypatch.setattr(module, "draw", draw_with_history)
    out = tmp_path / "figs"
    assert "1 figure: 1 drawn" in report(results, out, figure="losses")
    first = (out / "losses.png").read_bytes()
    from tests.helpers import full_row

    rid = run_row("ablation", "sudoku", {"n": 9, "mask_rate": 0.25}, 1, 3, loss="final")["run_id"]
    rows = [full_row("history", run_id=rid, step=s, loss=3.0 / (1 + s / 50), loop_losses=[0.1] * 3, L_t=3, lr=1e-3,
                     seconds=s / 10) for s in (0, 100, 5000)]
    Store(results, "ablation").write_rows("history", rows, f"{rid}.parquet")  # the run's history, trained on
    assert "1 figure: 1 drawn" in report(results, out, figure="losses")
    assert seen == [100, 5000] and (out / "losses.png").read_bytes() != first


def test_a_report_again_writes_the_same_bytes_and_a_changed_file_is_written_anew(results, tmp_path):
    out, full = tmp_path / "figs", tmp_path / "full"
    line = re.search(r"^13 figures: (\d+) drawn, (\d+) not drawn$", report(results, out), re.M)
    assert line and int(line[1]) >= 5, "figure line"
    before = files(out)
    (out / "losses.png").write_bytes(before["losses.png"][:-10] + b"edited...!")  # same size, other bytes
    (out / "text8_table.csv").unlink()
    report(results, out)
    assert files(out) == before
    report(results, full, "--redraw")  # kept for scripts that pass it: the same report
    assert files(full) == before
    # one figure drawn again into the folder: the others' files stay
    report(results, out, figure="losses")
    assert files(out) == before


def test_a_new_run_is_in_the_next_report(results, tmp_path):
    out = tmp_path / "figs"
    report(results, out)
    before = files(out)
    run = run_row("ablation", "sudoku", {"n": 9, "mask_rate": 0.25}, 1, 3, loss="all", seed=1)
    _write(Store(results, "ablation"), run, [eval_row(run, T, 3, "vpr", v) for T, v in zip(TS, [0.62, 0.82, 0.9, 0.96])])
    report(results, out)
    after = files(out)
    assert after["losses.png"] != before["losses.png"] and after["text8_nll.png"] == before["text8_nll.png"]


def test_a_killed_reports_staging_folder_is_removed_by_the_next_and_a_live_ones_is_kept(results, tmp_path):
    out = tmp_path / "figs"
    cmd = [sys.executable, "-m", "study.cli", "report", "--study", "ablation", "--figure", "all", "--results",
           results, "--out", str(out), "--jobs", "1"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not [n for n in os.listdir(tmp_path) if n.startswith(".figs.partial-")] and p.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)  # this test's own child, by its PID
    p.wait()
    killed = [n for n in os.listdir(tmp_path) if n.startswith(".figs.partial-")]
    assert killed, "the report ended before it staged anything"
    # a live report's folder: locked as staged() locks its own
    import fcntl

    live = tmp_path / ".figs.partial-live"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        report(results, out, figure="losses")
    finally:
        os.close(fd)
    assert [n for n in os.listdir(tmp_path) if n.startswith(".figs.partial-")] == [live.name]


def test_the_pngs_own_name_is_the_figure(results, tmp_path):
    out = report(results, tmp_path / "figs", figure="training_curves")  # training_curves.png is training-curves
    assert "1 figure: 1 drawn" in out and (tmp_path / "figs" / "training_curves.png").is_file()


def test_memory_running_out_is_one_line_and_exit_1(results, tmp_path, monkeypatch):
    from analysis import load
    from study.cli import app

    def out_of_memory(*args, **kwargs):
        raise ImportError("pandas/_libs/index.so: failed to map segment from shared object")  # as under ulimit -v

    monkeypatch.setattr(load, "load_study", out_of_memory)
    r = CliRunner().invoke(app, ["report", "--study", "ablation", "--results", results, "--out", str(tmp_path)])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "error: out of memory" in r.output, r.output
    monkeypatch.setattr(load, "load_study", lambda *args, **kwargs: bytearray(1 << 62))  # a MemoryError of its own
    r = CliRunner().invoke(app, ["report", "--study", "ablation", "--results", results, "--out", str(tmp_path)])
    assert r.exit_code == 1 and "raise the limit or free memory" in r.output and "Traceback" not in r.output
