"""Paired comparisons at their edges (issue 29): matched seeds whose differences are all equal stay paired
over the examples; a verdict from one seed says it is about that seed pair; the report's headline
verdicts need two matched seeds; a sampler that stops early (two T at one forward-pass count) is drawn;
failed and pruned runs are never averaged in and are listed.
Run: .venv/bin/python -m pytest tests/test_paired_comparisons.py -q
"""
from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis.compare import compare
from analysis.load import load_study
from stats import paired_difference, verdict, wilson
from tests.helpers import full_row

ONE = "(one seed pair; not a claim about the recipe)"


def _store(root: str, solved: dict[int, tuple[int, int]], n: int = 24, study: str = "pairs"):
    """(1 x 2) vs its iso-parameter partner (1 x 1) at T = 1, real Parquet with every example's score:
    solved[seed] = (A's count, B's count), A solving the first examples B solves and more."""
    from store import Store
    from test_analysis_data import eval_row, run_row

    store = Store(root, study)
    for seed, counts in solved.items():
        for (K, L), k in zip([(1, 2), (1, 1)], counts):
            run = run_row(study, "sudoku", {"n": 9, "mask_rate": 0.3}, K, L, seed=seed)
            store.write_rows("runs", [run], f"{run['run_id']}.parquet")
            store.write_config(run["run_id"], {"run_id": run["run_id"], "model": {"K": K, "L": L}})
            y = [1.0 if j < k else 0.0 for j in range(n)]
            lo, hi = wilson(k, n)
            ev = {**eval_row(run, 1, L, "vpr", k / n), "n_examples": n, "ci_low": lo, "ci_high": hi}
            store.write_rows("evals", [ev], run["run_id"], f"{ev['eval_key']}.parquet")
            store.write_rows("samples", [full_row("samples", run_id=run["run_id"], eval_key=ev["eval_key"], T=1, L_s=L,
                                                   example=j, score=v, scores=json.dumps({"vpr": v}))
                                         for j, v in enumerate(y)], run["run_id"], f"{ev['eval_key']}.parquet")
    return store


def _report_md(root, study: str, tmp_path, *extra: str) -> tuple[str, object]:
    from study.cli import app

    out = tmp_path / f"rep-{study}"
    r = CliRunner().invoke(app, ["report", "--figure", "all", "--results", str(root), "--study", study,
                                 "--out", str(out), "--jobs", "1", *extra])
    assert r.exit_code == 0, r.output
    return (out / "report.md").read_text(), r


# ---- 1. matched seeds with identical differences: paired over the examples, never the unpaired fallback
def test_identical_seed_differences_are_paired_over_the_examples(tmp_path):
    """Three seeds, A solving one more of 24 examples than B in each: the per-seed differences are all
    1/24 (no spread for a t), so the per-example scores are read and paired (Agresti-Min per seed pair,
    pooled over the three): [-0.022, +0.099]. Was: scores not read, the unpaired [-0.397, +0.481]
    labelled "no per-example scores stored"."""
    _store(str(tmp_path), {0: (7, 6), 1: (13, 12), 2: (19, 18)})
    c = compare(load_study(str(tmp_path), "pairs"))
    assert len(c) == 1
    r = c.iloc[0]
    assert r.method.startswith("paired over test examples"), r.method
    assert r.difference == pytest.approx(1 / 24)
    assert (r.ci_low, r.ci_high) == pytest.approx((-0.022, 0.099), abs=1e-3)
    assert r.seeds == "3 / 3 (3 paired)" and r.matched_seeds == 3
    assert r.verdict == "no detectable difference"  # three seeds: a claim about the recipe, worded as one


def test_needs_examples_agrees_with_paired_difference():
    """compare reads the samples files exactly when paired_difference would use them."""
    from stats import needs_examples

    cases = [({0: 0.5, 1: 0.6}, {0: 0.4, 1: 0.5}), ({0: 0.5, 1: 0.6}, {0: 0.4, 1: 0.3}), ({0: 0.5}, {0: 0.4}),
             ({0: 0.5}, {1: 0.4}), ({0: 0.5, 1: 0.6}, {2: 0.4, 3: 0.5}), ({0: 0.5, 1: 0.6, 2: 0.7}, {5: 0.4})]
    for a, b in cases:
        scores = lambda d: {s: [1.0, 0.0, 1.0, 0.0] for s in d}
        how = paired_difference(a, b, True, scores(a), scores(b), (0.3, 0.8), (0.2, 0.7))[3]
        assert needs_examples(a, b) == (how == "examples"), (a, b, how)


# ---- 2. one seed: the verdict is about that seed pair -------------------------------------------------
def test_verdict_words_name_the_seed_pair():
    assert verdict(0.01, 0.2, on="seed 0") == f"ahead on seed 0 only {ONE}"
    assert verdict(-0.2, -0.01, on="seeds 0 / 1") == f"behind on seeds 0 / 1 only {ONE}"
    assert verdict(-0.1, 0.2, on="seed 3") == f"no detectable difference on seed 3 {ONE}"
    assert verdict(0.01, 0.2) == "ahead"


def test_one_seed_verdict_is_about_that_seed_pair_in_table_report_and_api(tmp_path):
    """One seed each, A solving 20 of 24 and B 2: the paired interval lies above 0, and the verdict says it
    is about seed 0 only, in compare's table, the terminal, report.md and the API; the report gives no
    headline verdict and says what is missing (was: "ahead", as a claim about the recipe)."""
    import rmdm_study as rs

    _store(str(tmp_path), {0: (20, 2)})
    want = f"ahead on seed 0 only {ONE}"
    assert compare(load_study(str(tmp_path), "pairs"))["verdict"].tolist() == [want]
    assert rs.open(str(tmp_path)).study("pairs").compare()["verdict"].tolist() == [want]
    md, r = _report_md(tmp_path, "pairs", tmp_path)
    from tests.helpers import unwrapped

    assert "\n".join(unwrapped(r.output.splitlines())).count(want) == 1  # the terminal line (wrapped at 100)
    assert want in md.split("## Tables", 1)[1]
    head = md.split("## Headline verdicts", 1)[1].split("\n## ", 1)[0]
    assert "1 of 1 comparisons have fewer than 2 matched seeds" in head and "ahead" not in head


def test_two_matched_seeds_give_headline_verdicts(tmp_path):
    """Two seeds each, A well ahead in both: the headline table holds the comparison, worded as a recipe claim."""
    _store(str(tmp_path), {0: (20, 2), 1: (21, 1)})
    md, _ = _report_md(tmp_path, "pairs", tmp_path)
    head = md.split("## Headline verdicts", 1)[1].split("\n## ", 1)[0]
    rows = [l for l in head.splitlines() if l.startswith("| iso-parameter")]
    assert len(rows) == 1 and "| ahead |" in rows[0] and "2 / 2 (2 paired)" in rows[0], head
    assert "fewer than 2 matched seeds" not in head


def test_one_seed_of_either_model_scopes_the_verdict():
    """Which intervals rest on one seed of a model: one matched seed, one seed each (not matched), and one seed
    of B against three of A (the unpaired fallback combines B's one-seed interval)."""
    from analysis.compare import one_seed_scope

    three = {0: 0.5, 1: 0.6, 2: 0.7}
    assert one_seed_scope(three, {5: 0.4}, "unpaired", 1) == ("B's seed 5", "(one seed of B; not a claim about "
                                                                            "the recipe)")
    assert one_seed_scope({0: 0.5}, {1: 0.4}, "examples", 1) == ("seeds 0 / 1", ONE)
    assert one_seed_scope(three, {0: 0.4}, "examples", 1) == ("seed 0", ONE)
    assert one_seed_scope(three, {0: 0.4, 1: 0.5, 2: 0.6}, "examples", 3) == (None, "")  # equal differences
    assert one_seed_scope({0: 0.5, 1: 0.6}, {2: 0.4, 3: 0.5}, "welch", 2) == (None, "")
    assert one_seed_scope(three, {0: 0.4, 1: 0.2}, "seeds", 2) == (None, "")


# ---- 3. a sampler that stops early: two T at one forward-pass count ----------------------------------
@pytest.fixture(scope="module")
def early_store(tmp_path_factory):
    """A real tiny study (4x4 Sudoku, 6 blanks, (1 x 1) and (1 x 2), 10 steps, trained and evaluated by the
    trial itself) evaluated at T = 1, 2, 6, 8: T = 8 stops after 6 steps, as T = 6 does."""
    import yaml

    from store import Store
    from study.engine.trial import execute
    from study.engine.options import TrialOptions
    from study.spec.grid import expand
    from tests.helpers import tiny_grid

    root = str(tmp_path_factory.mktemp("early"))
    raw = yaml.safe_load(tiny_grid("early", steps=10, n_test=8, T="[1, 2, 6, 8]", axes="L: [1, 2]"))
    for run in expand(raw).runs:
        execute(run, Store(root, "early"), TrialOptions("test"))
    return root


def test_report_all_draws_a_sampler_that_stops_early(early_store, tmp_path):
    """Was: exit 2, "a line was given two rows at one forward_passes", no report.md. Now every figure is drawn
    and the compute figure keeps the smallest T of each forward-pass count."""
    import rmdm_study as rs

    ev = load_study(early_store, "early").evals
    fp = ev[ev["metric"] == "vpr"].groupby(["L_t", "T"])["forward_passes"].first().to_dict()
    assert fp[(1, 6)] == fp[(1, 8)] == 6 and fp[(2, 6)] == fp[(2, 8)] == 12  # the case at hand
    md, r = _report_md(early_store, "early", tmp_path)
    assert "![compute](compute.png)" in md and "two rows at one" not in r.output
    fig = rs.open(early_store).study("early").figure("compute")
    xs = sorted(tuple(map(float, l.get_xdata())) for l in fig.axes[0].get_lines() if l.get_marker() not in ("None", ""))
    assert xs == [(1.0, 2.0, 6.0), (2.0, 4.0, 12.0)]  # (1 x 1) and (1 x 2), T = 8 drawn as T = 6


# ---- 4. only done runs are analysed; the others are listed ---------------------------------------------
@pytest.mark.parametrize("status", ["failed", "pruned"])
def test_failed_and_pruned_runs_are_left_out_and_listed(tmp_path, status):
    """Seeds 0 and 1 of (1 x 3) done (VPR 0.5, 0.7), seed 2 `status` with an evaluation at 0.0 (a checkpoint
    scored before it stopped): the table and the API average the two done seeds (0.6, was 0.4 over three);
    the run is listed in report.md and on the terminal."""
    import rmdm_study as rs
    from store import Store
    from test_analysis_data import _write, eval_row, run_row

    store = Store(str(tmp_path), "st")
    for seed, v in [(0, 0.5), (1, 0.7), (2, 0.0)]:
        run = run_row("st", "sudoku", {"n": 9, "mask_rate": 0.3}, 1, 3, seed=seed)
        if seed == 2:
            run.update(status=status, error="stopped at step 40")
        _write(store, run, [eval_row(run, T, 3, "vpr", v) for T in (1, 2)])
    s = rs.open(str(tmp_path)).study("st")
    t = s.table()
    assert t["value"].tolist() == pytest.approx([0.6, 0.6]) and t["n_seeds"].tolist() == [2, 2]
    assert (s.runs["status"] == "done").all() and len(s.runs) == 2
    gone = s.not_done
    assert gone["status"].tolist() == [status] and gone["run_id"].iloc[0].endswith("s2")
    md, r = _report_md(tmp_path, "st", tmp_path, "--threshold", "0.5")
    left = md.split("## Left out", 1)[1].split("\n## ", 1)[0]
    assert gone["run_id"].iloc[0] in left and status in left and "stopped at step 40" in left
    assert f"left out, not finished: 1 {status}: {gone['run_id'].iloc[0]}" in r.output
    assert pd.read_csv(tmp_path / "rep-st" / "threshold_crossings.csv")["best"].tolist() == pytest.approx([0.6])


def test_the_run_ends_with_the_headline_table_and_verdicts(tmp_path):
    """What `study run` prints at its end (analysis.summary, from the report's own tables): each model's vpr at
    T = 1 with its interval and the interval's method, and the headline verdict of two matched seeds."""
    from analysis.load import load_study
    from analysis.summary import result_lines

    _store(str(tmp_path), {0: (20, 2), 1: (21, 1)})
    from tests.helpers import unwrapped

    wrapped = result_lines(load_study(str(tmp_path), "pairs"))
    assert max(map(len, wrapped)) <= 100, wrapped  # fits a terminal (issue 44: 118-123)
    lines = unwrapped(wrapped)
    assert lines[:2] == ["result of study pairs (test split; mean over seeds [95% interval]):",
                         "  sudoku 9x9, 30% masked: vpr"], lines
    assert lines[2].split() == ["T=1"], lines
    rows = lines[3:5]
    assert rows[0].startswith("    (1 x 1) ") and rows[1].startswith("    (1 x 2) "), lines  # by K, then L
    assert all(" 2 seed(s)  " in r and re.search(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]$", r) for r in rows), lines
    assert lines[5] == "    interval: t over seed logit rates (n_seeds - 1 df), mapped to the mean rate", lines
    assert lines[6].startswith("  verdicts (") and len(lines) == 8, lines
    assert re.fullmatch(r"    iso-parameter sudoku 9x9, 30% masked: \(1 x 2\) vs \(1 x 1\), vpr T=1: 0\.854 vs 0\.062, "
                        r"difference \+0\.792 \[\+\d\.\d{3}, \+\d\.\d{3}\] seeds 2 / 2 \(2 paired\): ahead", lines[7]), lines


def test_the_end_of_run_result_fits_100_columns_with_four_Ts_and_long_notes(tmp_path):
    """The paper-like store (seven models, T = 1, 2, 4, 8, intervals of three methods): every line of what
    `study run` prints at its end fits 100 columns (issue 44: 118-140 wide), the T columns in blocks, and
    every model's every T is still there."""
    from analysis.load import load_study
    from analysis.summary import result_lines
    from test_analysis_data import write_paper
    from tests.helpers import unwrapped

    store = write_paper(str(tmp_path))
    lines = result_lines(load_study(str(tmp_path), store.study))
    assert max(map(len, lines)) <= 100, [l for l in lines if len(l) > 100]
    heads = [l.split() for l in lines if l.strip().startswith("T=")]
    assert [t for h in heads[:2] for t in h] == ["T=1", "T=2", "T=4", "T=8"], heads  # the first variant's blocks
    first = lines[2:next(i for i, l in enumerate(lines) if l.strip().startswith("interval"))]
    assert sum(l.startswith("    (1 x 3) ") for l in first) == 2  # the model in each block of Ts
    assert any("comparisons have fewer than 2 matched seeds: no verdict about the recipes (train more seeds" in l
               for l in unwrapped(lines))
