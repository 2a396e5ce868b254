"""The Python API (rmdm_study): the guide's example (docs/guide/api.md) runs as written and gives the numbers `study report`
prints; figures come back as matplotlib Figures with nothing written; a shadowing package is named.
Run: .venv/bin/python -m pytest tests/test_api.py -q
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, study
from test_analysis_data import write_paper


def readme_example() -> str:
    text = open(os.path.join(ROOT, "docs", "guide", "api.md"), encoding="utf-8").read()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results directory holding a hand-made study under the example's name (demo_sudoku)."""
    base = tmp_path_factory.mktemp("api")
    root = str(base / "results")
    store = write_paper(root)
    shutil.copytree(store.dir, os.path.join(root, "demo_sudoku"))
    shutil.rmtree(store.dir)
    return base


def test_readme_example_runs_and_matches_study_report(results):
    code = readme_example()
    env = {**os.environ, "PYTHONPATH": ROOT, "MPLBACKEND": "Agg"}
    run = subprocess.run([sys.executable, "-c", code], cwd=results, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert "['demo_sudoku']" in run.stdout
    assert os.path.getsize(results / "iso_param.png") > 5000
    # the same numbers as the report: the API's comparisons against the lines `study report` prints
    import rmdm_study as rs

    s = rs.open(str(results / "results")).study("demo_sudoku")
    api = s.compare()
    # a verdict from one seed of a model names that seed (issue 29): "ahead on seed 0 only (one seed pair; ...)"
    words = ("ahead", "behind", "no detectable difference")
    # and where a model's seed interval was declined (its seeds agree exactly), there is no verdict at all
    from stats import NO_VERDICT

    assert len(api) > 0 and all(v in words or v == NO_VERDICT
                                or (v.split(" on ", 1)[0] in words and "not a claim about the recipe" in v)
                                for v in api["verdict"]), set(api["verdict"])
    assert set(api["verdict"]) - {NO_VERDICT}, "every comparison declined"
    runs = sorted(s.runs["run_id"])
    rep = study("report", "--results", str(results / "results"), "--study", "demo_sudoku", "--figure", "iso-param",
                "--out", str(results / "fig"), "--compare", f"{runs[0]}:{runs[1]}")
    assert rep.returncode == 0, rep.stderr
    from tests.helpers import unwrapped

    assert max(map(len, rep.stdout.splitlines())) <= 100, rep.stdout  # fits a terminal (issue 44: ~200)
    printed = [l.strip() for l in unwrapped(rep.stdout.splitlines()) if l.startswith("  ") and " vs " in l]
    mine = [l for l in printed if not l.startswith("named")]
    assert len(mine) == len(api)
    for line, r in zip(mine, api.itertuples(index=False)):
        assert f"{r.A} vs {r.B}" in line and f"T={r.T}:" in line, (line, r)
        assert f"difference {r.difference:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]" in line and line.endswith(r.verdict)
    # the aggregated table is the report's (analysis.tables.aggregate of the rows load_study reads)
    from analysis.load import load_study
    from analysis.tables import aggregate

    agg = aggregate(load_study(str(results / "results"), "demo_sudoku").evals)
    t = s.table()
    assert len(t) == (agg["split"] == "test").sum()
    assert t["value"].tolist() == agg[agg["split"] == "test"]["value"].tolist()
    assert "ci_method" in t


def test_the_readmes_example_shows_one_metric_by_short_model_name_and_L_s(results, tmp_path):
    """README's Python block on a store holding `first_study` (issue 44: it printed every metric, no L_s, models
    only as their 600-character model_key): one metric, the (K x L) name compare() uses, L_s, T as compare()'s."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    code = re.search(r"<!-- doc-test: python -->\n```python\n(.*?)```", text, re.S).group(1)
    shutil.copytree(results / "results" / "demo_sudoku", tmp_path / "results" / "first_study")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    head, *rows = run.stdout.splitlines()
    assert head.split() == ["model", "L_s", "T", "value", "ci_low", "ci_high"], run.stdout
    assert rows and all(re.match(r"\d+\s+\(\d+ x \d+\)", r) for r in rows), run.stdout
    import rmdm_study as rs

    s = rs.open(str(tmp_path / "results")).study("first_study")
    t, c = s.table(), s.compare()
    assert len(rows) == (t.metric == "vpr").sum() and t["T"].dtype == c["T"].dtype
    assert set(c["A"]) | set(c["B"]) <= set(t["model"])


def test_figures_come_back_as_figures_and_nothing_is_written(results):
    from matplotlib.figure import Figure

    import rmdm_study as rs

    s = rs.open(str(results / "results")).study()
    before = sorted(os.listdir(s.data.dir))
    for name in ("iso-param", "pareto", "training-curves"):
        fig = s.figure(name)
        assert isinstance(fig, Figure) and fig.axes, name
    assert sorted(os.listdir(s.data.dir)) == before
    with pytest.raises(ValueError, match="unknown figure 'nope'; known: iso-param"):
        s.figure("nope")
    assert len(s.samples()) >= 0 and set(s.runs["run_id"]) == set(s.evals["run_id"])


def test_a_package_shadowing_one_of_ours_is_named(tmp_path):
    fake = tmp_path / "stats"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "-c", "import rmdm_study"], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "the module 'stats' is" in r.stderr and "shadows it" in r.stderr
    ok = subprocess.run([sys.executable, "-c", "import rmdm_study; print(rmdm_study.PACKAGES)"], cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "'analysis'" in ok.stdout, ok.stderr


def test_a_local_file_shadowing_one_of_ours_is_named_with_how_to_run_there(tmp_path):
    """A research folder with its own model.py (issue 44): the error names that file and the way out (-P),
    and `python -P` there imports rmdm_study."""
    (tmp_path / "model.py").write_text("x = 1\n")
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-c", "import rmdm_study"], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"the local file {tmp_path / 'model.py'} shadows it" in r.stderr and "-P" in r.stderr, r.stderr
    ok = subprocess.run([sys.executable, "-P", "-c", "import rmdm_study"], cwd=str(tmp_path), env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr


def test_the_api_uses_the_stores_names_and_no_join_leaves_x_or_y(results):
    """One set of names, the store's (docs/guide/schema.md): in history `loss` is the training loss (a number),
    `L_t` that step's depth and `lr` that step's learning rate, as in the Parquet files; the run's loss
    variant, depth and configured lr are the runs table's `loss`, `L_t`, `lr`. No column ends in _x or _y."""
    import pandas as pd

    import rmdm_study as rs
    from store import Store

    s = rs.open(str(results / "results")).study("demo_sudoku")
    for name in ("runs", "evals", "history"):
        cols = list(getattr(s, name).columns)
        assert not [c for c in cols if c.endswith(("_x", "_y"))], (name, cols)
        assert len(cols) == len(set(cols)), (name, cols)
    h = s.history
    stored = Store(str(results / "results"), "demo_sudoku").read("history")
    assert len(h) == len(stored) > 0
    assert {"loss", "L_t", "lr", "step", "model_key", "seed", "task_variant"} <= set(h.columns)
    assert "train_loss" not in h and "depth" not in h
    assert pd.api.types.is_float_dtype(h["loss"])  # the value, not the variant
    mine = h.sort_values(["run_id", "step"]).reset_index(drop=True)
    theirs = stored.sort_values(["run_id", "step"]).reset_index(drop=True)
    for c in ("loss", "L_t", "lr"):
        assert mine[c].tolist() == theirs[c].tolist(), c
    assert all(isinstance(v, str) for v in s.runs["loss"])  # the runs table's loss: the variant's name
