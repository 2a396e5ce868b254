"""The continuous quantities (issue 32, study/engine/continuous.py): a real tiny 4x4 Sudoku run trained
through `study.engine.trial.execute` (real Parquet) stores `nll-test` / `nll-val` points (ELBO and the
reference's NLL per blank) and checkpoint keys `val_elbo` / `val_ref_nll`; `study verify` (and --deep)
derives them again; and every number the store kept before is the same with or without them."""
from __future__ import annotations

import json

import pytest
import torch

import study.engine.evaluate as continuous
from store import Store
from study.commands.verify import verify_study
from study.engine.options import TrialOptions
from study.engine.trial import execute
from study.spec.grid import expand

GRID = {
    "study": "nll4",
    "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 40, "n_test": 12, "n_val": 10, "data_seed": 2},
    "model": {"d_model": 16, "n_heads": 2, "L": 2},
    "train": {"steps": 12, "batch_size": 8, "warmup": 2, "checkpoint_every": 6, "log_every": 3},
    "eval": {"T": [1, 2], "n_examples": 12, "at_checkpoints": 6},
}


def _trained(root, study: str = "nll4"):
    run = expand({**GRID, "study": study}, f"{study}.yaml").runs[0]
    store = Store(str(root), study)
    execute(run, store, TrialOptions("test"))
    return run, store


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return _trained(tmp_path_factory.mktemp("results"))


def test_rows_follow_the_contract(trained):
    run, store = trained
    ev = store.read("evals")
    nll = ev[ev["eval_key"].str.startswith("nll-")]
    assert sorted(zip(nll["eval_key"], nll["metric"])) == [
        ("nll-test", "elbo"), ("nll-test", "ref_nll"), ("nll-val", "elbo"), ("nll-val", "ref_nll")]
    assert set(nll["T"]) == {0} and set(nll["L_s"]) == {run.model.L} and set(nll["sampler"]) == {"likelihood"}
    assert dict(zip(nll["eval_key"], nll["split"])) == {"nll-test": "test", "nll-val": "val"}
    assert dict(zip(nll["eval_key"], nll["n_examples"])) == {"nll-test": 12, "nll-val": 10}
    assert ((nll["ci_low"] < nll["value"]) & (nll["value"] < nll["ci_high"])).all()
    assert (nll["value"] > 0).all()
    samples = store.read("samples")
    per = samples[samples["eval_key"] == "nll-test"].sort_values("example")
    sc = [json.loads(s) for s in per["scores"]]
    row = nll[(nll["eval_key"] == "nll-test") & (nll["metric"] == "ref_nll")].iloc[0]
    assert abs(sum(s["ref_nll"] for s in sc) / len(sc) - row["value"]) < 1e-12
    hist = store.read("history")
    vals = [json.loads(v) for v in hist["val"] if isinstance(v, str)]
    assert len(vals) >= 2 and all({"val_elbo", "val_ref_nll", "val_vpr_T1", "val_vpr_T2"} <= set(v) for v in vals)


def test_scoring_leaves_the_global_rng_alone_and_repeats(trained):
    run, store = trained
    from study.commands.puzzles import load_run_model

    from tasks import make_task

    model, task = load_run_model(store, run.run_id)[2], make_task(run.task)
    task.prepare(None)
    ev = task.eval_set("test").head(5)
    states = torch.get_rng_state(), torch.random.initial_seed()
    a = continuous.evaluate_nll(model, run.run_id, "test", ev, run.model.L)
    assert torch.equal(torch.get_rng_state(), states[0])
    b = continuous.evaluate_nll(model, run.run_id, "test", ev, run.model.L)
    assert a.scores == b.scores
    assert continuous.nll_seed(run.run_id, "test") != continuous.nll_seed(run.run_id, "val")


def test_verify_derives_them_and_catches_a_changed_value(trained, tmp_path):
    run, store = trained
    v = verify_study(store, deep=True, points=["nll-test", "nll-val"])
    assert v.problems == [], v.problems
    assert any("; 2 of 2 continuous-quantity points" in n for n in v.notes if n.startswith("--deep")), v.notes
    t = store.read_file("samples", run.run_id, "nll-val.parquet").to_pylist()
    sc = json.loads(t[0]["scores"])
    sc["elbo"] += 0.5
    t[0]["scores"], t[0]["score"] = json.dumps(sc), sc["elbo"]
    store.write_rows("samples", t, run.run_id, "nll-val.parquet")
    probs = verify_study(store, deep=True, points=["nll-val"]).problems
    assert any("nll-val" in p and "elbo" in p for p in probs), probs


def test_existing_numbers_unchanged_without_them(trained, tmp_path, monkeypatch):
    """The same run with the new scoring switched off: every other evals row, history row and the weights
    are the same to the bit (no global RNG draw, no reordered draw)."""
    run, store = trained
    monkeypatch.setattr(continuous, "scored", lambda task: False)
    _, plain = _trained(tmp_path)

    def rows(s: Store, table: str):
        # times, and the digests that cover them (the weights file holds its seconds; compared below by tensor)
        skip = ("created_at", "eval_seconds", "seconds", "row_sha256", "point_sha256", "weights_sha256")
        d = s.read(table).drop(columns=[c for c in skip if c in s.read(table)])
        return d[~d["eval_key"].str.startswith("nll-")].sort_values(["eval_key", "metric"]).to_dict("records") \
            if table == "evals" else d.sort_values("step").to_dict("records")

    assert str(rows(plain, "evals")) == str(rows(store, "evals"))
    new, old = rows(store, "history"), rows(plain, "history")
    for h in old:
        h["val"] = json.loads(h["val"]) if isinstance(h["val"], str) else None
    for h in new:
        d = json.loads(h["val"]) if isinstance(h["val"], str) else None
        h["val"] = None if d is None else {k: x for k, x in d.items() if k not in ("val_elbo", "val_ref_nll")}
    as_text = lambda rs: json.dumps(rs, default=lambda a: a.tolist() if hasattr(a, "tolist") else str(a))
    assert as_text(new) == as_text(old) and any(h["val"] for h in old)
    assert plain.read("evals")["eval_key"].str.startswith("nll-").sum() == 0
    w_new = torch.load(store.weights_path(run.run_id), weights_only=True)["model"]
    w_old = torch.load(plain.weights_path(run.run_id), weights_only=True)["model"]
    assert all(torch.equal(w_new[k], w_old[k]) for k in w_new)


def test_backfill_scores_old_runs_from_their_weights(trained, tmp_path, monkeypatch):
    """A run stored without them (an older store) gets the same points from its final weights, verified."""
    from typer.testing import CliRunner

    from study.cli import app

    run, store = trained
    with monkeypatch.context() as m:
        m.setattr(continuous, "scored", lambda task: False)
        _, old = _trained(tmp_path, study="old4")
    assert not any(k.startswith("nll-") for k in old.eval_keys(run.run_id))
    r = CliRunner().invoke(app, ["backfill", "--study", "old4", "--results", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "2 point(s) written" in r.output and "checkpoint numbers" in r.output
    got, want = old.read("evals"), store.read("evals")
    pick = lambda d: d[d["eval_key"].str.startswith("nll-")].sort_values(["eval_key", "metric"])[
        ["eval_key", "metric", "value", "ci_low", "ci_high", "n_examples", "T", "L_s", "split"]].to_dict("records")
    assert pick(got) == pick(want)
    assert verify_study(old, deep=True, points=["nll-test"]).problems == []
    again = CliRunner().invoke(app, ["backfill", "--study", "old4", "--results", str(tmp_path)])
    assert again.exit_code == 0 and "0 point(s) written" in again.output, again.output


def test_a_run_evaluated_on_validation_never_reads_the_test_split(tmp_path):
    """A search's trial (eval.split val) gets nll-val only: its selection never looks at the test split."""
    grid = {**GRID, "study": "val4", "eval": {**GRID["eval"], "split": "val", "at_checkpoints": 0}}
    run = expand(grid, "val4.yaml").runs[0]
    store = Store(str(tmp_path), "val4")
    execute(run, store, TrialOptions("test"))
    ev = store.read("evals")
    assert set(ev["split"]) == {"val"} and "nll-val" in set(ev["eval_key"]) and "nll-test" not in set(ev["eval_key"])


def test_validation_left_out_where_the_data_cannot_hold_it(tmp_path):
    """4x4 Sudoku has 192 reachable grids: 150 train + 30 test leave no room for 30 validation grids."""
    grid = {**GRID, "study": "full4", "eval": {**GRID["eval"], "at_checkpoints": 0},
            "task": {**GRID["task"], "n_train": 150, "n_test": 30, "n_val": 30}}
    run = expand(grid, "full4.yaml").runs[0]
    store = Store(str(tmp_path), "full4")
    execute(run, store, TrialOptions("test"))
    keys = set(store.read("evals")["eval_key"])
    assert "nll-test" in keys and "nll-val" not in keys
    assert "nll-val left out" in store.read_bytes(store.path("logs", f"{run.run_id}.log")).decode()
