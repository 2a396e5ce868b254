"""The claims table where a user reads it (issue 31, "Report"), on a synthetic store (no training): the terminal of
`study report`, report.md and report.html, the Python API's `claims()`, each with the sequential interval, the
decision and the fixed-seed interval beside; and `study plan --results` reading the store's seeds as its pilot.
Run: .venv/bin/python -m pytest tests/test_claims_report.py -q
"""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.helpers import full_row, unwrapped

GRID_CLAIMS = "claims:\n  - {pair: iso-param, T: [1], claim: beats}\n"
DIFFS = [0.30, 0.32, 0.29, 0.31]  # A better than B by a large, steady gain on each of four seeds


@pytest.fixture
def claims_store(tmp_path):
    """The grid of tests/test_claims.py (study `cl`) with four seeds of its iso-parameter pair in a store, A's vpr
    0.4 + DIFFS[i] and B's 0.4 at T = 1, and the claims.json a claims run writes."""
    import datetime as dt

    from store import Store
    from study.engine.claims import write_spec
    from test_analysis_data import _write, run_row
    from test_claims import BASE, grid_of

    grid = tmp_path / "cl.yaml"
    grid.write_text(BASE + GRID_CLAIMS)
    spec = grid_of(BASE + GRID_CLAIMS).claims.spec()
    store = Store(str(tmp_path / "results"), "cl")
    (c,) = spec["claims"]
    for seed, d in enumerate(DIFFS):
        for side, (K, L), value in (("A", (1, 2), 0.4 + d), ("B", (1, 1), 0.4)):
            s = c[side]
            run = {**run_row("cl", "sudoku", {"n": 4, "mask_rate": 0.4}, K, L, seed=seed), "run_id": s["runs"][seed]}
            ev = full_row("evals", run_id=run["run_id"], eval_key=s["eval_key"], T=1, L_s=s["L_s"],
                          sampler=s["sampler"], split=s["split"], n_examples=100, metric="vpr", value=value,
                          forward_passes=L, eval_flops=L * 1000 * 16, eval_seconds=0.1,
                          created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
            _write(store, run, [ev])
    write_spec(store, spec)
    return grid, str(tmp_path / "results")


def test_claims_table_in_the_api_the_terminal_and_the_report(claims_store, tmp_path):
    import rmdm_study as rs
    from study.cli import app

    grid, results = claims_store
    t = rs.open(results).study("cl").claims()
    r = t.iloc[0]
    assert r["claim"] == "(1 x 2) beats (1 x 1) at T=1" and r["kind"] == "beats" and r["T"] == 1
    assert (r["A"], r["B"]) == ("(1 x 2)", "(1 x 1)")  # named as compare() names them (issue 44: a run id)
    assert r["decision"] == "supported" and 2 < r["seeds"] <= 4 and r["seq_low"] > 0
    assert r["fixed_says"] == "supported" and r["seq_low"] < r["fixed_low"] < r["fixed_high"] < r["seq_high"]
    assert r["difference"] == pytest.approx(sum(DIFFS[:r["seeds"]]) / r["seeds"])

    out = tmp_path / "figures"
    rep = CliRunner().invoke(app, ["report", "--figure", "all", "--results", results, "--study", "cl", "--out",
                                   str(out), "--jobs", "1"])
    assert rep.exit_code == 0, rep.output
    said = rep.output.split("claims (", 1)[1]  # the terminal's claims table: sequential and fixed intervals
    assert "sequential 95%" in said and "fixed-seed 95% says" in said and "(1 x 2) beats (1 x 1) at T=1" in said
    row = next(line for line in said.splitlines() if "(1 x 2) beats (1 x 1) at T=1" in line)
    assert "supported" in row and f"{r['seeds']:>5}" in row and "+0.3" in row, row  # in the stored unit (issue 44)
    md = (out / "report.md").read_text()
    claims = md.split("Claims", 1)[1]
    for col in ("seq_low", "seq_high", "decision", "fixed_low", "fixed_high", "fixed_says", "margin", "seeds"):
        assert col in claims, (col, claims[:800])
    assert "(1 x 2) beats (1 x 1) at T=1" in claims and "supported" in claims
    html = (out / "report.html").read_text()
    assert "Claims" in html and "fixed_says" in html and "(1 x 2) beats (1 x 1) at T=1" in html


def test_plan_reads_the_stores_seeds_as_its_pilot(claims_store):
    from study.cli import app

    grid, results = claims_store
    r = CliRunner().invoke(app, ["plan", str(grid), "--results", results])
    assert r.exit_code == 0, r.output
    line = next(x for x in unwrapped(r.output.splitlines()) if "(1 x 2) beats (1 x 1) at T=1:" in x)
    claims = r.output.split("\nclaims: ", 1)[1].splitlines()
    assert max(map(len, claims)) <= 100, claims  # the claims lines fit 100 columns
    assert "pilot of 4 seeds: difference +0.305" in line and "expected seeds" in line, line
    assert "P(decided within 4)" in line
    none = CliRunner().invoke(app, ["plan", str(grid), "--results", str(grid.parent / "empty")])
    assert none.exit_code == 0 and "no pilot" in none.output and "assumed difference" in none.output, none.output
