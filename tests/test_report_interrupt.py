"""`study report` stopped by Ctrl-C or a SIGTERM (a real process, a real signal, sent while it draws): one
line, exit 130 (as an interrupted `study tune` or cluster join), and no half-written figure folder: nothing
is written into it (here: empty, as the check of --out made it) and no staging folder is left beside it.

Run: pytest tests/test_report_interrupt.py -q   (the analysis tests' store, real Parquet; ~1 min)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.helpers import study_cmd  # noqa: E402
from tests.test_analysis_data import write_all  # noqa: E402


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("results"))
    write_all(root)
    return root


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_report_leaves_no_half_written_folder(results, tmp_path, sig):
    out = tmp_path / "figs"
    p = subprocess.Popen(study_cmd("report", "--study", "paper", "--results", results, "--figure", "all",
                                   "--out", str(out), "--jobs", "1"), cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.time() + 300
        # the first figure file is written (into the staging folder; before: into the folder itself)
        while time.time() < deadline and p.poll() is None and not any(f.is_file() for d in tmp_path.iterdir()
                                                                       for f in (d.iterdir() if d.is_dir() else ())):
            time.sleep(0.02)
        assert p.poll() is None, p.communicate()
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, (p.returncode, stdout, stderr)
    assert stderr.strip().splitlines() == [f"interrupted: nothing written to {out} (it is as it was); "
                                           "`study report` again draws it all"], stderr
    # figs/ as --out's check left it (made, empty: nothing in it), no staging folder beside it
    assert [d.name for d in tmp_path.iterdir()] == ["figs"] and list(out.iterdir()) == [], list(tmp_path.rglob("*"))


# slow set (13 s of the default suite under load); the default suite keeps the interrupted reports and test_report_files' writes)
@pytest.mark.slow
def test_a_finished_report_moves_every_file_into_the_folder(results, tmp_path):
    """An existing folder keeps its other files; the report's files replace theirs; nothing is left beside it."""
    out = tmp_path / "figs"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    (out / "iso_param.png").write_bytes(b"old")
    r = subprocess.run(study_cmd("report", "--study", "paper", "--results", results, "--figure", "all",
                                 "--out", str(out)), cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["figs"]
    assert (out / "mine.txt").read_text() == "kept" and (out / "iso_param.png").read_bytes()[:4] == b"\x89PNG"
    printed = [ln for ln in r.stdout.splitlines() if ln.startswith(str(out))]
    assert printed and all(os.path.isfile(p) for p in printed), r.stdout
    assert str(out / "report.html") in printed and str(out / "report.md") in printed
