"""Analysis: the numbers behind the figures, checked on hand-made Parquet stores, and each figure
drawn or refused with a reason. Run: .venv/bin/python -m pytest tests/test_analysis.py -q
"""
from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis.derived import Derived
from analysis.figures import FIGURES, Options
from analysis.load import MissingData, latest_study, load_study
from analysis.tables import (aggregate, heatmap_matrix, iso_flop_pairs, pareto_front, select, text8_table,
                             threshold_crossings)
from test_analysis_data import CROSS, TEXT8_NLL, write_all


def crossings_table(data, opts):
    return Derived(data).crossings(opts.threshold, opts.pareto_x, opts.split)


@pytest.fixture(scope="module")
def store_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("results"))
    write_all(root)
    return root


@pytest.fixture(scope="module")
def paper(store_root):
    return load_study(store_root, "paper")


@pytest.fixture(scope="module")
def ablation(store_root):
    return load_study(store_root, "ablation")


def _by_model(df: pd.DataFrame, col: str) -> dict:
    return {(r.K, r.L_t): getattr(r, col) for r in df.itertuples()}


def test_default_study_is_newest_and_unknown_study_is_named(store_root):
    assert latest_study(store_root) == "ablation"
    with pytest.raises(MissingData, match="nope.*studies with runs: .*paper"):
        load_study(store_root, "nope")


def test_seeds_aggregated_with_t_over_seed_means_and_spread(paper):
    agg = select(aggregate(paper.evals), "vpr")
    row = agg[(agg.K == 1) & (agg.L_t == 3) & (agg.L_s == 3) & (agg["T"] == 2)
              & (agg.task_variant == "sudoku 9x9, 25% masked")].iloc[0]
    assert row.n_seeds == 2 and row.n_examples == 200
    assert row.value == pytest.approx(0.94)
    assert row.seed_sd == pytest.approx(np.std([0.96, 0.92], ddof=1))
    assert (row.seed_min, row.seed_max) == pytest.approx((0.92, 0.96))
    # t over the two seed logit rates, by hand: log(96.5 / 4.5) = 3.0654 and log(92.5 / 8.5) = 2.3872, centre
    # 2.7263 +- 12.7062 * 0.47965 / sqrt(2) = 2.7263 +- 4.3095; the mean rate E expit(m + tau Z) over that m
    # and tau in [0.47965, 0.47965 / sqrt(chi2_{0.15, 1} = 0.035766) = 2.5362]: [0.18064, 0.99901] (numerical
    # integral over Z). Two seeds near the ceiling say little: the raw-scale t, [0.68588, 1], covered 81-91%
    # there; the pooled Wilson of 188 / 200, [0.8981, 0.9654], treated seeds x puzzles as independent trials
    assert (row.ci_low, row.ci_high) == pytest.approx((0.18064, 0.99901), abs=1e-4)
    assert row.ci_method == "t over seed logit rates (n_seeds - 1 df), mapped to the mean rate"
    one = agg[(agg.K == 2) & (agg.L_t == 1) & (agg["T"] == 4) & (agg.task_variant == "sudoku 9x9, 25% masked")].iloc[0]
    assert one.n_seeds == 1 and one.seed_sd == 0
    assert (one.ci_low, one.ci_high) == pytest.approx((0.8882, 0.9785), abs=1e-4)  # 95 / 100, by hand
    assert set(agg["sampler"]) == {"confidence"}  # the random-sampler row is not mixed in


def test_threshold_crossing_is_smallest_T_reaching(paper):
    agg = aggregate(paper.evals)
    c = threshold_crossings(agg[agg.task_variant == "sudoku 9x9, 25% masked"], 0.95, "vpr", x="T")
    got = _by_model(c, "crossing")
    # (1 x 3): seed 0 alone reaches at T = 2 but the seed mean (0.94) does not: 4. (2 x 1) reaches exactly 0.95.
    expected = {(1, 1): None, (1, 3): 4, (1, 5): 2, (2, 1): 4, (2, 3): 1, (3, 1): 4, (6, 1): 2}
    assert set(got) == set(expected)
    for k, v in expected.items():
        assert (math.isnan(got[k]) if v is None else got[k] == v), (k, got[k])
    assert not _by_model(c, "reached")[(1, 1)] and _by_model(c, "best")[(1, 1)] == pytest.approx(0.93)
    # a dip after reaching does not matter: (1 x 3) seed 0 alone: 0.70, 0.96, 0.94, 0.98 -> 2
    seed0 = aggregate(paper.evals[paper.evals.seed == 0])
    c0 = threshold_crossings(seed0[seed0.task_variant == "sudoku 9x9, 25% masked"], 0.95, "vpr")
    assert _by_model(c0, "crossing")[(1, 3)] == 2
    # never reached anywhere at 50% masked
    c50 = threshold_crossings(agg[agg.task_variant == "sudoku 9x9, 50% masked"], 0.95, "vpr")
    assert not c50["reached"].any() and c50["crossing"].isna().all()
    # in forward passes T * L_s over every L_s: (1 x 3) at T=4, L_s=3 (12); (1 x 5) at T=2, L_s=5 (10)
    cf = threshold_crossings(agg[agg.task_variant == "sudoku 9x9, 25% masked"], 0.95, "vpr", x="forward_passes")
    f = {k: (r.crossing, r.T, r.L_s) for k, r in zip(zip(cf.K, cf.L_t), cf.itertuples())}
    assert f[(1, 3)] == (12, 4, 3) and f[(1, 5)] == (10, 2, 5)


def test_pareto_front_hand_computed(paper):
    df = pd.DataFrame({"n_params": [10, 10, 20, 20, 30, 5, 40],
                       "crossing": [4, 2, 1, 1, 1, np.nan, 0.5]})
    # (10, 4) dominated by (10, 2); (20, 1) twice: equal points dominate neither; (30, 1) dominated;
    # NaN never on the front; (40, 0.5) has the fewest steps
    assert pareto_front(df).tolist() == [False, True, True, True, False, False, True]
    c = crossings_table(paper, Options())
    front = {(r.K, r.L_t) for r in c[c.pareto].itertuples()}
    assert front == {(1, 5), (2, 3)}


def test_iso_flop_pairs_matched_by_KL(paper):
    pairs = iso_flop_pairs(paper.runs)
    got = {(r.task_variant, r.K, r.L, r.KL) for r in pairs.itertuples()}
    # (1 x 5) has no (5 x 1); at 50% masked the (3 x 1) has another width than the (1 x 3)
    assert got == {("sudoku 9x9, 25% masked", 1, 3, 3), ("sudoku 9x9, 25% masked", 2, 3, 6)}
    assert (pairs["flops_recursive"] == pairs["flops_single"]).all()
    row = pairs[pairs.K == 2].iloc[0]
    assert (row.params_recursive, row.params_single) == (250, 650)


def test_param_table_one_row_per_model(paper):
    from analysis.tables import param_table

    t = param_table(paper.runs)
    assert len(t) == 10  # 7 models at 25% masked, 3 at 50%; the two seeds of (1 x 3) are one model
    row = t[(t.model == "(1 x 3)") & (t.task_variant == "sudoku 9x9, 25% masked")].iloc[0]
    assert (row.seeds, row.status, row.n_params, row.flops_per_forward) == (2, "done 2", 150, 3000)


def test_heatmap_cells_equal_table_values(paper):
    agg = aggregate(paper.evals)
    fam = agg[(agg.task_variant == "sudoku 9x9, 25% masked") & (agg.K == 1)]
    m = heatmap_matrix(fam, 4, "vpr")
    assert list(m.index) == [1, 3, 5] and list(m.columns) == [1, 2, 3, 4, 5, 6]
    expected = {(1, 1): 0.80, (3, 3): 0.96, (5, 5): 0.98}  # the diagonal, from VPR_25 at T = 4 (seed mean for 1x3)
    for (lt, ls), v in CROSS.items():
        expected[(lt, ls)] = v + (0.01 if lt == 3 else 0)  # (1 x 3): mean of seeds v and v + 0.02
    for (lt, ls), v in expected.items():
        assert m.loc[lt, ls] == pytest.approx(v), (lt, ls)
    assert m.notna().sum().sum() == len(expected)  # every other cell empty
    with pytest.raises(MissingData, match="T = 3"):
        heatmap_matrix(fam, 3, "vpr")


def test_text8_table_from_nll(ablation):
    t = text8_table(aggregate(ablation.evals))
    got = {(r.K, r.L_t): (r.nll, r.bpc, r.ppl) for r in t.itertuples()}
    assert set(got) == set(TEXT8_NLL)
    for k, nll in TEXT8_NLL.items():
        assert got[k] == pytest.approx((nll, nll / math.log(2), math.exp(nll)))
    assert t["nll"].is_monotonic_increasing  # sorted best first


def test_tables_written_beside_figures(paper, tmp_path):
    paths = FIGURES["pareto"](paper, str(tmp_path), Options(threshold=0.9))
    t = pd.read_csv([p for p in paths if p.endswith("threshold_crossings.csv")][0])
    assert (t["threshold"] == 0.9).all()
    paths = FIGURES["iso-flop"](paper, str(tmp_path), Options(fmt="pdf"))
    assert any(p.endswith(".pdf") for p in paths)
    assert len(pd.read_csv([p for p in paths if p.endswith("iso_flop_params.csv")][0])) == 2


@pytest.mark.parametrize("name,reason", [("losses", "two or more loss values"),
                                         ("schedules", "two or more schedule values"),
                                         ("tuning", "no Optuna study at .*optuna")])
def test_unsupported_figures_say_what_is_missing(paper, tmp_path, name, reason):
    with pytest.raises(MissingData, match=reason):
        FIGURES[name](paper, str(tmp_path / name), Options())
    assert not os.path.exists(tmp_path / name)  # nothing written


@pytest.mark.parametrize("name,reason", [("iso-flop", "KL x 1"), ("mask-rate", r"two or more mask rates .*25%"),
                                         ("cross-depth", "two or more sampling depths L_s"),
                                         ("pareto", "no model reaches")])
def test_ablation_study_refuses_paper_figures(ablation, tmp_path, name, reason):
    with pytest.raises(MissingData, match=reason):
        FIGURES[name](ablation, str(tmp_path / name), Options(threshold=0.99))
    assert not os.path.exists(tmp_path / name)


@pytest.mark.parametrize("name", ["losses", "schedules", "text8"])
def test_ablation_figures_drawn(ablation, tmp_path, name):
    paths = FIGURES[name](ablation, str(tmp_path), Options())
    assert any(p.endswith(".png") for p in paths)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_tuning_figure_from_optuna_storage(tmp_path, kind):
    import optuna

    from analysis.tuning import importances_table, load_searches
    from test_analysis_data import write_paper

    store = write_paper(str(tmp_path))
    if kind == "sqlite":  # what `study tune` writes: results/<study>/optuna.db
        storage = f"sqlite:///{os.path.join(store.dir, 'optuna.db')}"
    else:
        storage = optuna.storages.journal.JournalStorage(
            optuna.storages.journal.JournalFileBackend(os.path.join(store.dir, "optuna.journal")))
    st = optuna.create_study(study_name="lr_search", storage=storage, direction="maximize",
                             sampler=optuna.samplers.RandomSampler(seed=0))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # the objective depends on lr only; noise_param does nothing
    st.optimize(lambda t: -(math.log10(t.suggest_float("lr", 1e-4, 1e-1, log=True)) + 2.5) ** 2
                + 0 * t.suggest_float("noise_param", 0, 1), n_trials=24)
    data = load_study(str(tmp_path), "paper")
    searches = load_searches(data.dir)
    assert len(searches) == 1 and len(searches[0][1]) == 24
    df = searches[0][1]
    assert (df["best_so_far"] == df["value"].cummax()).all()
    imp = importances_table(searches).set_index("parameter")["importance"]
    assert imp["lr"] > imp["noise_param"]
    paths = FIGURES["tuning"](data, str(tmp_path / "fig"), Options())
    assert any(p.endswith("tuning.png") for p in paths)


def test_cli_report_all_writes_html_and_markdown(store_root, tmp_path):
    from study.cli import app

    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["report", "--figure", "all", "--results", store_root, "--study", "paper",
                                 "--out", str(out), "--threshold", "0.95"])
    assert r.exit_code == 0, r.output
    html = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    for name in ("iso_param", "iso_flop", "pareto", "compute", "cross_depth", "mask_rate", "training_curves",
                 "effective_params"):
        for ext in ("png", "svg"):
            assert (out / f"{name}.{ext}").stat().st_size > 5000, name
        assert f"({name}.png)" in md
    # 7 figures + text8's training curves (no text8 table here); losses, schedules, tuning refused
    assert html.count("<img src='data:image/png;base64,") == 8
    assert "src='http" not in html and "href='http" not in html
    for text in ("Parameter counts", "Threshold crossings", "Iso-FLOP pairs", "Effective parameters",
                 "What a loop is worth", "Provenance", "abc123",
                 "study: paper", "Not drawn: losses needs"):
        assert text in html and text.replace("Not drawn:", "*Not drawn:*") in md, text
    # default --study is the newest (ablation); an unknown figure and a bad format fail clearly
    r = CliRunner().invoke(app, ["report", "--figure", "losses", "--results", store_root, "--out", str(tmp_path / "a")])
    assert r.exit_code == 0 and (tmp_path / "a" / "losses.png").exists()
    r = CliRunner().invoke(app, ["report", "--figure", "nope", "--results", store_root])
    assert r.exit_code == 2 and "known: iso-param" in r.output
    r = CliRunner().invoke(app, ["report", "--format", "gif", "--results", store_root])
    assert r.exit_code == 2 and "svg, pdf" in r.output


def test_a_retrained_run_supersedes_the_older_one_and_other_lrs_are_other_models(tmp_path):
    """Same model and seed under two run ids (retrained after a code change) is one seed, the newest;
    a second seed is averaged; another learning rate is another model, never averaged in."""
    import datetime as dt

    from store import Store
    from test_analysis_data import _write, eval_row, run_row

    store = Store(str(tmp_path), "rerun")
    tp = {"n": 9, "mask_rate": 0.3}
    old = run_row("rerun", "sudoku", tp, 1, 3)
    new = {**run_row("rerun", "sudoku", tp, 1, 3), "run_id": "retrained",
           "created_at": dt.datetime(2026, 2, 1, tzinfo=dt.timezone.utc)}
    seed1 = run_row("rerun", "sudoku", tp, 1, 3, seed=1)
    other_lr = {**run_row("rerun", "sudoku", tp, 1, 3), "run_id": "lr3e-3", "lr": 3e-3}
    for run, v in [(old, 0.10), (new, 0.50), (seed1, 0.70), (other_lr, 0.90)]:
        _write(store, run, [eval_row(run, 1, 3, "vpr", v)])
    data = load_study(str(tmp_path), "rerun")
    assert list(data.superseded["run_id"]) == [old["run_id"]]
    agg = aggregate(data.evals)
    by_lr = {r.lr: r for r in agg.itertuples()}
    assert by_lr[1e-3].n_seeds == 2 and abs(by_lr[1e-3].value - 0.60) < 1e-9  # (0.50 + 0.70) / 2, not 0.10
    assert by_lr[3e-3].n_seeds == 1 and abs(by_lr[3e-3].value - 0.90) < 1e-9


# ---- model identity: the whole training configuration minus the seed -----------------------------
def _grid_runs(axes: dict, train: dict | None = None):
    """Runs of a tiny real grid (study.spec.grid), so configs are exactly what `study run` stores."""
    from study.spec.grid import expand

    raw = {"study": "ident", "task": {"name": "sudoku", "n": 4, "mask_rate": 0.3},
           "model": {"K": 1, "L": 3, "d_model": 16, "n_heads": 2}, "train": {"steps": 10, **(train or {})},
           "eval": {"T": [1, 2]}, "axes": axes}
    return expand(raw).runs


def _store_runs(root, runs, values, created=None) -> None:
    """One runs row per Run (its resolved config in the `config` column and configs/), VPR at T = 1, 2."""
    import datetime as dt
    import json

    from store import Store
    from test_analysis_data import _write, eval_row, run_row

    store = Store(str(root), "ident")
    for i, (run, vs) in enumerate(zip(runs, values)):
        row = run_row("ident", "sudoku", run.task.model_dump(), run.model.K, run.model.L, seed=run.train.seed,
                      d_model=run.model.d_model, loss=run.train.loss, schedule=run.train.schedule)
        row.update(run_id=run.run_id, config=json.dumps(run.resolved(), sort_keys=True),
                   created_at=(created or [dt.datetime(2026, 1, 1 + i, tzinfo=dt.timezone.utc)] * len(runs))[i])
        _write(store, row, [eval_row(row, T, run.model.L, "vpr", v) for T, v in zip((1, 2), vs)])
        store.write_config(run.run_id, {**run.resolved(), "code_version": "abc123"})


def _report(root, tmp_path):
    from study.cli import app

    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["report", "--figure", "all", "--results", str(root), "--study", "ident",
                                 "--out", str(out), "--threshold", "0.5"])
    assert r.exit_code == 0, r.output
    return (out / "report.md").read_text(), pd.read_csv(out / "threshold_crossings.csv")


@pytest.mark.parametrize("axis,values,labels", [
    ("train.truncate_k", [2, 3], ["(1 x 3) truncate_k=2", "(1 x 3) truncate_k=3"]),
    ("train.loss_weights", [[0.2, 0.3, 0.5], [0.5, 0.3, 0.2]],
     ["(1 x 3) loss_weights=[0.2,0.3,0.5]", "(1 x 3) loss_weights=[0.5,0.3,0.2]"]),
])
def test_runs_differing_in_any_training_field_are_two_models(tmp_path, axis, values, labels):
    """Was: truncate_k / loss_weights were not in a hand-kept key list, so the two runs were taken for a
    retraining of one model and the older one dropped as superseded."""
    loss = "truncated" if "truncate" in axis else "weighted"
    runs = _grid_runs({axis: values}, {"loss": loss})
    assert len({r.run_id for r in runs}) == 2
    _store_runs(tmp_path / "res", runs, [(0.4, 0.6), (0.7, 0.9)])
    data = load_study(str(tmp_path / "res"), "ident")
    assert data.superseded.empty and len(data.runs) == 2
    md, crossings = _report(tmp_path / "res", tmp_path)
    assert "Left out" not in md and "superseded" not in md
    # each model keeps its own numbers, labelled by the field that differs
    assert dict(zip(crossings["model"], crossings["best"])) == pytest.approx(dict(zip(labels, [0.6, 0.9])))
    for label in labels:
        assert label.split(") ")[1].replace("|", "\\|") in md  # the parameter table's differs column


def test_seeds_of_one_model_are_averaged_and_labels_stay_short(tmp_path):
    runs = _grid_runs({"seed": [0, 1]})
    _store_runs(tmp_path / "res", runs, [(0.4, 0.6), (0.6, 0.8)])
    data = load_study(str(tmp_path / "res"), "ident")
    agg = select(aggregate(data.evals), "vpr")
    assert data.runs["model_key"].nunique() == 1 and set(agg["n_seeds"]) == {2}
    assert sorted(agg["value"]) == pytest.approx([0.5, 0.7])
    _, crossings = _report(tmp_path / "res", tmp_path)
    assert list(crossings["model"]) == ["(1 x 3)"]  # nothing differs: no field named


def test_a_genuine_retraining_is_superseded_and_listed(tmp_path):
    """Equal whole configuration and seed under another run id (e.g. the id's hash changed): one seed,
    the newest; the report says which run was left out and why."""
    import dataclasses
    import datetime as dt

    (run,) = _grid_runs({"seed": [0]})
    retrained = dataclasses.replace(run)  # same config; stored under another id below
    _store_runs(tmp_path / "res", [run], [(0.1, 0.2)],
                created=[dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)])
    import json

    from store import Store
    from test_analysis_data import _write, eval_row, run_row

    row = run_row("ident", "sudoku", retrained.task.model_dump(), 1, 3, d_model=16)
    row.update(run_id="retrained-under-new-id", config=json.dumps({**run.resolved(), "run_id": "x"}, sort_keys=True),
               created_at=dt.datetime(2026, 2, 1, tzinfo=dt.timezone.utc))
    _write(Store(str(tmp_path / "res"), "ident"), row, [eval_row(row, T, 3, "vpr", v) for T, v in ((1, 0.5), (2, 0.7))])
    data = load_study(str(tmp_path / "res"), "ident")
    assert list(data.superseded["run_id"]) == [run.run_id]
    assert list(data.superseded["kept"]) == ["retrained-under-new-id"]
    md, crossings = _report(tmp_path / "res", tmp_path)
    assert list(crossings["best"]) == pytest.approx([0.7])  # the old run's 0.2 is not averaged in
    assert "## Left out" in md and run.run_id in md and "same training configuration and seed" in md


def test_cross_depth_never_averages_two_models_into_one_cell(tmp_path):
    """Two (1 x 3) models that differ only in lr, both sampled at L_s = 1 and 3: two heatmaps (was one,
    each cell the mean of both models)."""
    runs = _grid_runs({"lr": [1e-3, 3e-3], "L": [1, 3]})
    import json

    from store import Store
    from test_analysis_data import _write, eval_row, run_row

    store = Store(str(tmp_path / "res"), "ident")
    for run in runs:
        row = run_row("ident", "sudoku", run.task.model_dump(), 1, run.model.L, d_model=16)
        row.update(run_id=run.run_id, config=json.dumps(run.resolved(), sort_keys=True), lr=run.train.lr)
        base = 0.2 if run.train.lr == 1e-3 else 0.6
        _write(store, row, [eval_row(row, 2, ls, "vpr", base + 0.1 * ls) for ls in (1, 3)])
    data = load_study(str(tmp_path / "res"), "ident")
    agg = aggregate(data.evals)
    with pytest.raises(ValueError, match="several models"):
        heatmap_matrix(agg, 2, "vpr")
    paths = FIGURES["cross-depth"](data, str(tmp_path / "fig"), Options(T=2))
    tables = sorted(pd.read_csv(p).set_index("L_t").loc[3].tolist() for p in paths if p.endswith(".csv"))
    assert np.allclose(tables, [[0.3, 0.5], [0.7, 0.9]])


# ---- splits: one per figure, test by default ---------------------------------------------------------
@pytest.fixture()
def two_split_store(tmp_path):
    """One Sudoku model evaluated on test (VPR 0.5, 0.6) and on val (0.9, 0.95); one text8 model with NLL
    5.0 on test and 4.0 on val."""
    from store import Store
    from test_analysis_data import _write, eval_row, run_row

    store = Store(str(tmp_path), "splits")
    sud = run_row("splits", "sudoku", {"n": 9, "mask_rate": 0.3}, 1, 3)
    rows = []
    for split, vs in (("test", (0.5, 0.6)), ("val", (0.9, 0.95))):
        rows += [{**eval_row(sud, T, 3, "vpr", v), "split": split, "eval_key": f"T{T}-{split}"}
                 for T, v in zip((1, 2), vs)]
    _write(store, sud, rows)
    t8 = run_row("splits", "text8", {"seq_len": 64}, 1, 1)
    _write(store, t8, [{**eval_row(t8, 1, 1, "nll", v), "split": split, "eval_key": f"nll-{split}"}
                       for split, v in (("test", 5.0), ("val", 4.0))])
    return load_study(str(tmp_path), "splits")


def test_figures_read_the_test_split_only_and_never_average_splits(two_split_store, tmp_path):
    data = two_split_store
    agg = aggregate(data.evals)
    # text8 table: was the mean of both splits (4.5)
    assert text8_table(agg)["nll"].tolist() == pytest.approx([5.0])
    assert text8_table(agg, split="val")["nll"].tolist() == pytest.approx([4.0])
    c = crossings_table(data, Options(threshold=0.55))
    assert c["best"].tolist() == pytest.approx([0.6]) and c["crossing"].tolist() == [2]
    c = crossings_table(data, Options(threshold=0.55, split="val"))
    assert c["best"].tolist() == pytest.approx([0.95]) and c["crossing"].tolist() == [1]
    with pytest.raises(MissingData, match=r"split 'train' \(splits present: test, val\)"):
        FIGURES["iso-param"](data, str(tmp_path / "x"), Options(split="train"))
    from study.cli import app

    r = CliRunner().invoke(app, ["report", "--figure", "pareto", "--results", os.path.dirname(data.dir), "--study",
                                 "splits", "--split", "val", "--threshold", "0.55", "--out", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    assert pd.read_csv(tmp_path / "cli" / "threshold_crossings.csv")["best"].tolist() == pytest.approx([0.95])
    # a line handed rows of two splits refuses rather than drawing their mix
    import matplotlib.pyplot as plt

    from analysis.plotting import line as _line

    fig, ax = plt.subplots()
    rows = agg[agg["metric"] == "vpr"]
    with pytest.raises(ValueError, match="several splits"):
        _line(ax, rows, "T", "mixed", "k")
    plt.close(fig)


def test_forward_passes_are_the_stored_ones_not_T_times_L_s(tmp_path):
    """A sampler that stops early (28 free cells, T = 40) stores 28 x L_s block passes; the analysis
    keeps that number (was recomputed as T * L_s = 80)."""
    from store import Store
    from test_analysis_data import _write, eval_row, run_row

    run = run_row("fp", "sudoku", {"n": 9, "mask_rate": 0.3}, 1, 2)
    _write(Store(str(tmp_path), "fp"), run, [{**eval_row(run, 40, 2, "vpr", 0.5), "forward_passes": 56},
                                             eval_row(run, 10, 2, "vpr", 0.4)])
    agg = aggregate(load_study(str(tmp_path), "fp").evals)
    assert dict(zip(agg["T"], agg["forward_passes"])) == {40: 56, 10: 20}


# ---- evaluations: one row per run and point ----------------------------------------------------------
def test_an_older_or_smaller_evaluation_of_a_point_is_left_out_and_listed(tmp_path):
    """A store written before eval keys held every evaluation field holds, for one run, the old-key and
    the new-key rows of one point (was: averaged into one value). The newest of equal size is kept; of
    different sizes the largest, never their mean; the report lists the others and why."""
    import datetime as dt

    from store import Store
    from test_analysis_data import _write, eval_row, run_row

    jan, feb = (dt.datetime(2026, m, 1, tzinfo=dt.timezone.utc) for m in (1, 2))
    run = run_row("dup", "sudoku", {"n": 9, "mask_rate": 0.3}, 1, 3)
    rows = [
        {**eval_row(run, 1, 3, "vpr", 0.10), "eval_key": "T1-Ls3-confidence", "created_at": jan},  # old key
        {**eval_row(run, 1, 3, "vpr", 0.50), "eval_key": "T1-Ls3-confidence-0a1b2c3d", "created_at": feb},
        {**eval_row(run, 2, 3, "vpr", 0.30), "eval_key": "T2-Ls3-confidence", "n_examples": 200, "created_at": jan},
        {**eval_row(run, 2, 3, "vpr", 0.90), "eval_key": "T2-Ls3-confidence-4e5f6a7b", "n_examples": 50,
         "created_at": feb},
    ]
    _write(Store(str(tmp_path), "dup"), run, rows)
    data = load_study(str(tmp_path), "dup")
    agg = aggregate(data.evals)
    assert dict(zip(agg["T"], agg["value"])) == pytest.approx({1: 0.50, 2: 0.30})
    assert dict(zip(agg["T"], agg["n_examples"])) == {1: 100, 2: 200}
    left = data.left_out_evals.set_index("eval_key")
    assert sorted(left.index) == ["T1-Ls3-confidence", "T2-Ls3-confidence-4e5f6a7b"]
    assert left.loc["T1-Ls3-confidence", "kept"] == "T1-Ls3-confidence-0a1b2c3d"
    assert "an older evaluation of the same point" in left.loc["T1-Ls3-confidence", "reason"]
    assert "fewer examples (50)" in left.loc["T2-Ls3-confidence-4e5f6a7b", "reason"]
    # two rows of one point handed to aggregate directly: refused, not averaged
    with pytest.raises(ValueError, match="evals rows at one point"):
        aggregate(pd.concat([data.evals, data.evals]))
    from study.cli import app

    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["report", "--figure", "all", "--results", str(tmp_path), "--study", "dup",
                                 "--out", str(out), "--threshold", "0.2"])
    assert r.exit_code == 0, r.output
    md = (out / "report.md").read_text()
    assert "## Left out" in md and "2 evaluation rows are left out" in md
    assert "T1-Ls3-confidence " in md.replace("|", " ") and "an older evaluation of the same point" in md
    assert pd.read_csv(out / "threshold_crossings.csv")["best"].tolist() == pytest.approx([0.5])


def test_likelihood_table_reads_a_tasks_own_metric_names_by_their_unit(tmp_path):
    """A likelihood task of its own names its NLL metrics as it likes (`nats`, `bits`, declared with
    Metric.likelihood 1.0 and ln 2): the table reads them by unit. Was: only the names nll / bpc (MissingData)."""
    from typing import Literal

    import tasks
    from store import Store
    from tasks import Metric
    from tasks.text8 import Text8, Text8Config
    from test_analysis_data import _write, eval_row, run_row

    class NatsConfig(Text8Config):
        name: Literal["text8_nats"] = "text8_nats"

    class Nats(Text8):
        name, primary_metric, sample_score = "text8_nats", "nats", "nats"
        metrics = (Metric("nats", "NLL bound (nats / char)", higher_is_better=False, likelihood=1.0),
                   Metric("bits", "bits per char", higher_is_better=False, likelihood=math.log(2)))

    tasks.register(NatsConfig, Nats)
    try:
        store = Store(str(tmp_path), "nats")
        run = run_row("nats", "text8_nats", {"seq_len": 64}, 1, 1)
        _write(store, run, [{**eval_row(run, 1, 1, "nats", 3.0), "eval_key": "nll-test"},
                            {**eval_row(run, 1, 1, "bits", 3.0 / math.log(2)), "eval_key": "nll-test"}])
        t = text8_table(aggregate(load_study(str(tmp_path), "nats").evals))
        assert t[["nll", "bpc", "ppl"]].iloc[0].tolist() == pytest.approx([3.0, 3.0 / math.log(2), math.exp(3.0)])
    finally:
        tasks.TASKS.pop("text8_nats", None)


def test_every_analysis_reader_refuses_an_older_store_in_one_line_naming_migrate(tmp_path):
    """The readers read the current format only (no branch for an older store): `study report`, `study predict` (both
    laws) and the Python API refuse a store of another format, in one line naming `study migrate`."""
    from rmdm_study import Results
    from store.format import FormatMismatch
    from study.cli import app

    root = str(tmp_path)
    write_all(root)
    os.remove(os.path.join(root, "paper", "FORMAT"))  # data but no FORMAT: version 0
    with pytest.raises(FormatMismatch, match="study migrate --study paper"):
        load_study(root, "paper")
    with pytest.raises(FormatMismatch, match="study migrate --study paper"):
        Results(root).study("paper")
    for argv in (["report", "--figure", "iso-param"], ["predict"], ["predict", "--law", "two-step"]):
        r = CliRunner().invoke(app, [*argv, "--study", "paper", "--results", root])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1, (argv, r.output)
        assert "format none recorded (version 0)" in lines[0] and f"`study migrate --study paper --results {root}`" \
            in lines[0], (argv, lines)


def test_runs_without_flops_are_left_out_of_the_iso_flop_pairs(tmp_path):
    """A run whose flops_per_forward is null (not recorded) has no iso-FLOP partner: `--figure all` reports the
    study, and the pairs list only the models whose FLOPs are known."""
    from test_analysis_data import TS, _write, eval_row, run_row

    from store import Store
    from study.cli import app

    store = Store(str(tmp_path / "results"), "noflops")
    for K, L in ((1, 2), (2, 1), (1, 3), (3, 1)):
        run = run_row("noflops", "sudoku", {"n": 4, "mask_rate": 0.5}, K, L)
        if (K, L) == (1, 3):
            run["flops_per_forward"] = None
        _write(store, run, [eval_row(run, T, L, "vpr", 0.1 * T) for T in TS])
    runs = load_study(str(tmp_path / "results"), "noflops").runs
    assert runs["flops_per_forward"].isna().sum() == 1
    assert {(r.K, r.L, r.KL) for r in iso_flop_pairs(runs).itertuples()} == {(1, 2, 2)}
    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["report", "--figure", "all", "--results", str(tmp_path / "results"),
                                 "--study", "noflops", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "report.md").exists() and len(pd.read_csv(out / "iso_flop_params.csv")) == 1
