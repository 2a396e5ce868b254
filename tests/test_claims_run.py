"""A real claims run end to end (tiny 4x4 Sudoku, 20 steps, a real local Ray): seeds on demand, the claims
table in the terminal and the store, and a driver killed between two batches of seeds resuming to the same
decisions as a run never killed. Slow: each round starts a local Ray."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from analysis.claims import claims_table
from analysis.load import load_study
from store import Store
from tests.helpers import ROOT, descendants, kill_driver, study, study_cmd, tiny_grid

GRID = tiny_grid("clrun", retries=None, axes=None, extra="""couple:
  - [{K: 1, L: 2}, {K: 1, L: 1}]
seeds: {min: 2, max: 3, batch: 1}
claims:
  - {pair: iso-param, T: [1, 2], metric: cell_acc, claim: matches, margin: 0.5}""")
# 20 steps teach no model to solve a puzzle (VPR 0 on every seed: a constant claim stops at its first look),
# but cell accuracy differs from seed to seed: a matches claim with a wide margin is undecided at 2 seeds
# (c_2 = 110) and within reach at 3, so the run takes a second round


def decisions(results: str):
    t = claims_table(load_study(results, "clrun"))
    return t[["claim", "seeds", "decision", "difference"]].to_dict("records")


@pytest.mark.slow
def test_claims_run_and_resume_after_kill_between_batches(tmp_path):
    import os

    g = tmp_path / "g.yaml"
    g.write_text(GRID)
    ref = str(tmp_path / "ref")
    r = study("run", str(g), "--results", ref, "--num-cpus", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "claims round 2" in r.stdout and "(1 x 2) matches (1 x 1) at T=1" in r.stdout, r.stdout
    spec = json.loads(Store(ref, "clrun").read_bytes(Store(ref, "clrun").path("claims.json")))
    assert len(spec["claims"]) == 2 and len(spec["claims"][0]["A"]["runs"]) == 3
    want = decisions(ref)
    assert all(d["seeds"] >= 2 for d in want)

    res = str(tmp_path / "res")
    out = tmp_path / "out.txt"
    drv = subprocess.Popen(study_cmd("run", str(g), "--results", res, "--num-cpus", "2"), cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": ROOT}, start_new_session=True,
                           stdout=open(out, "w"), stderr=subprocess.STDOUT)
    tree: list[int] = []
    deadline = time.time() + 500
    while "claims round 2" not in out.read_text() and time.time() < deadline and drv.poll() is None:
        tree = sorted(set(tree) | set(descendants(drv.pid)))
        time.sleep(0.2)
    assert "claims round 2" in out.read_text(), out.read_text()
    kill_driver(drv, tree)  # between the batches: round 1's seeds done, round 2's not begun
    done_before = len(Store(res, "clrun").read("runs"))
    r = study("run", str(g), "--results", res, "--num-cpus", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{done_before} done" in r.stdout  # round 1 found its runs done, trained nothing again
    assert decisions(res) == want
    v = study("verify", "--study", "clrun", "--results", res)
    assert v.returncode == 0, v.stdout + v.stderr
