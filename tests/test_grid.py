"""Grid validation, expansion and run ids. Run: pytest tests/test_grid.py"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from study.spec.grid import GridError, expand, load_grid

BASE = {
    "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 20, "n_test": 10},
    "model": {"d_model": 32, "n_heads": 4},
    "train": {"steps": 10},
    "eval": {"T": [1, 2], "L_s": ["train"]},
}


def grid(**kw):
    return {**BASE, **kw}


def test_product_over_axes():
    g = expand(grid(axes={"K": [1, 2], "L": [1, 3], "seed": [0, 1]}))
    assert len(g.runs) == 8
    assert {(r.model.K, r.model.L, r.train.seed) for r in g.runs} == {
        (k, l, s) for k in (1, 2) for l in (1, 3) for s in (0, 1)}


def test_coupled_axes_constraints_include_exclude_groups():
    g = expand(grid(couple=[[{"K": 6, "L": 5}, {"K": 30, "L": 1}]], axes={"seed": [0, 1]}))
    assert {(r.model.K, r.model.L) for r in g.runs} == {(6, 5), (30, 1)} and len(g.runs) == 4
    g = expand(grid(axes={"K": [1, 2, 3, 6], "L": [1, 2, 3, 6]}, constraints=[{"product": ["K", "L"], "equals": 6}]))
    assert {(r.model.K, r.model.L) for r in g.runs} == {(1, 6), (2, 3), (3, 2), (6, 1)}
    g = expand(grid(axes={"K": [1, 2], "L": [1, 2]}, exclude=[{"K": 2, "L": 2}], include=[{"K": 5, "L": 1}]))
    assert {(r.model.K, r.model.L) for r in g.runs} == {(1, 1), (1, 2), (2, 1), (5, 1)}
    base = {k: v for k, v in BASE.items()}
    g = expand({**base, "groups": [{"name": "wide", "model": {"d_model": 64}, "axes": {"K": [1]}},
                                   {"name": "deep", "axes": {"K": [2, 3]}}]})
    assert sorted((r.group, r.model.K, r.model.d_model) for r in g.runs) == [
        ("deep", 2, 32), ("deep", 3, 32), ("wide", 1, 64)]


def test_run_id_is_stable_and_depends_on_training_config_only():
    a = expand(grid(axes={"K": [2]})).runs[0]
    b = expand(grid(axes={"K": [2]})).runs[0]
    assert a.run_id == b.run_id
    # any change to the training config changes the id
    for change in ({"train": {"steps": 11}}, {"model": {"d_model": 32, "n_heads": 2}},
                   {"task": {**BASE["task"], "mask_rate": 0.5}}, {"train": {"steps": 10, "seed": 1}}):
        assert expand(grid(axes={"K": [2]}, **change)).runs[0].run_id != a.run_id, change
    # a change to evaluation points only keeps it
    c = expand(grid(axes={"K": [2]}, eval={"T": [1, 2, 4, 8], "L_s": [1, 5]})).runs[0]
    assert c.run_id == a.run_id
    d = expand(grid(axes={"K": [2]}, task={**BASE["task"], "n_test": 99}, resources={"cpu": 2})).runs[0]
    assert d.run_id == a.run_id


@pytest.mark.parametrize("bad, key, hint", [
    (grid(modle={"K": 1}), "modle", "allowed"),
    (grid(model={"d_model": 32, "n_heads": 4, "depth": 3}), "model.depth", "allowed: K, L"),
    (grid(model={"d_model": "wide"}), "model.d_model", "integer"),
    (grid(axes={"K": [0]}), "model.K", "greater than or equal to 1"),
    (grid(task={"name": "chess"}), "task.name", "known tasks: countdown, sudoku, text8"),
    (grid(train={"loss": "mean"}), "train.loss", "'all', 'final', 'weighted' or 'truncated'"),
    (grid(axes={"K": 3}), "axes.K", "non-empty list"),
    (grid(axes={"eval.T": [1]}), "eval.T", "eval"),
    (grid(study="../escape"), "study", "plain name"),
    (grid(eval={"T": [0]}), "eval.T", ">= 1"),
])
def test_malformed_grids_name_file_key_and_allowed_values(bad, key, hint):
    with pytest.raises(GridError) as e:
        expand(bad, "grids/bad.yaml")
    msg = str(e.value)
    assert msg.startswith("grids/bad.yaml: key '") and key in msg and hint in msg, msg


def test_cli_rejects_a_bad_grid_before_running(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("task: {name: sudoku}\naxes: {K: [0, 1]}\n")
    for cmd in ("plan", "run"):
        r = subprocess.run([sys.executable, "-m", "study.cli", cmd, str(p), "--results", str(tmp_path / "res")]
                           if cmd == "run" else [sys.executable, "-m", "study.cli", cmd, str(p)],
                           capture_output=True, text=True)
        assert r.returncode == 2
        assert str(p) in r.stderr and "model.K" in r.stderr
    assert not (tmp_path / "res").exists()  # nothing was dispatched or written


def test_yaml_is_safe_loaded(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text("task: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(GridError, match="not valid YAML"):
        load_grid(str(p))


def test_every_shipped_grid_plans():
    import glob
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = glob.glob(os.path.join(root, "grids", "**", "*.yaml"), recursive=True)
    assert files
    for f in files:
        g = load_grid(f)
        assert g.runs and all(r.costs()["n_params"] > 0 for r in g.runs)


def test_fields_inert_under_the_chosen_loss_and_schedule_do_not_split_a_run():
    """truncate_k means nothing to the `all` loss, min_depth nothing to a fixed schedule: one run, one id."""
    a = expand(grid(axes={"K": [1]}, train={"steps": 10, "loss": "all"})).runs[0]
    b = expand(grid(axes={"K": [1]}, train={"steps": 10, "loss": "all", "truncate_k": 1, "min_depth": 1})).runs[0]
    assert a.run_id == b.run_id
    m = {"d_model": 32, "n_heads": 4, "L": 3}
    t1 = expand(grid(model=m, train={"steps": 10, "loss": "truncated", "truncate_k": 1})).runs[0]
    t2 = expand(grid(model=m, train={"steps": 10, "loss": "truncated", "truncate_k": 2})).runs[0]
    assert t1.run_id != t2.run_id
    r1 = expand(grid(model=m, train={"steps": 10, "schedule": "reverse", "min_depth": 1})).runs[0]
    r2 = expand(grid(model=m, train={"steps": 10, "schedule": "reverse", "min_depth": 2})).runs[0]
    assert r1.run_id != r2.run_id


def test_longest_training_is_dispatched_first_and_trained_runs_last(tmp_path):
    from study.engine.runner import longest_first
    from store import Store

    g = expand(grid(axes={"K": [1, 2], "L": [1, 2]}, train={"steps": 10}))
    store = Store(str(tmp_path), g.study)
    shapes = lambda runs: [(r.model.K, r.model.L) for r in runs]
    order = shapes(longest_first(g.runs, store))
    assert order[0] == (2, 2) and order[-1] == (1, 1), order
    # FLOPs say (1 x 2) and (2 x 1) cost the same up to the head: both in the middle
    assert set(order[1:3]) == {(1, 2), (2, 1)}
    # a run whose final weights exist only evaluates: it goes last, whatever its size
    big = next(r for r in g.runs if (r.model.K, r.model.L) == (2, 2))
    store.write_bytes(store.weights_path(big.run_id), b"weights")
    assert shapes(longest_first(g.runs, store))[-1] == (2, 2)
    # a schedule that trains at depth 1 for most steps costs less than fixed depth
    cur = expand(grid(model={"d_model": 32, "n_heads": 4, "L": 4}, train={"steps": 10, "schedule": "curriculum"})).runs[0]
    fix = expand(grid(model={"d_model": 32, "n_heads": 4, "L": 4}, train={"steps": 10})).runs[0]
    assert cur.train_flops() < fix.train_flops()


def test_eval_keys_follow_every_field_that_changes_the_evaluation():
    """n_test, n_val, the split, n_examples, the sampler's settings and seed re-key an evaluation;
    adding a T keeps the run id and the other points' keys."""
    def keys(**kw):
        r = expand(grid(axes={"K": [1]}, **kw)).runs[0]
        return r.run_id, {(p.T, p.split): p.key for p in r.eval_points()}

    rid, base = keys()
    assert {s for _, s in base} == {"test"}
    changes = [{"task": {**BASE["task"], "n_test": 9}}, {"eval": {**BASE["eval"], "split": "val"}},
               {"eval": {**BASE["eval"], "n_examples": 7}}, {"eval": {**BASE["eval"], "temperature": 0.5}},
               {"eval": {**BASE["eval"], "seed": 3}}]
    for change in changes:
        r2, other = keys(**change)
        assert r2 == rid, change  # evaluation-only: the trained model is the same
        assert set(other.values()).isdisjoint(base.values()), change
    assert {s for _, s in keys(eval={**BASE["eval"], "split": "val"})[1]} == {"val"}
    # n_val shapes the val split only
    assert keys(task={**BASE["task"], "n_val": 5})[1] == base
    assert keys(task={**BASE["task"], "n_val": 5}, eval={**BASE["eval"], "split": "val"})[1] != \
        keys(eval={**BASE["eval"], "split": "val"})[1]
    r3, more = keys(eval={**BASE["eval"], "T": [1, 2, 4]})
    assert r3 == rid and {k: v for k, v in more.items() if k[0] != 4} == base
    with pytest.raises(GridError, match="eval.split"):
        expand(grid(eval={"split": "train"}))


def test_text8_eval_keys_follow_n_t_and_the_slice_read():
    t8 = {"name": "text8", "seq_len": 16, "n_test": 4}
    def pts(**task):
        r = expand({**BASE, "task": {**t8, **task}}).runs[0]
        return r.run_id, r.eval_points()

    rid, base = pts()
    for change in ({"n_t": 8}, {"eval_split": "valid"}):
        r2, p2 = pts(**change)
        assert r2 == rid and {p.key for p in p2}.isdisjoint({p.key for p in base}), change
    assert {p.split for p in pts(eval_split="valid")[1]} == {"val"}  # the split actually read


def test_single_loop_runs_of_any_loss_or_schedule_are_one_run():
    """At L = 1 the loss over loops and the depth schedule cannot change the training."""
    m = {"d_model": 32, "n_heads": 4, "L": 1}
    variants = [{"loss": "final"}, {"loss": "truncated", "truncate_k": 1}, {"loss": "weighted", "loss_weights": [2.0]},
                {"schedule": "reverse", "min_depth": 1}, {"schedule": "stochastic"}, {"schedule": "curriculum"}]
    plain = expand(grid(model=m)).runs[0]
    for v in variants:
        r = expand(grid(model=m, train={"steps": 10, **v})).runs[0]
        assert r.run_id == plain.run_id, v
        assert (r.train.loss, r.train.schedule, r.train.loss_weights) == ("all", "fixed", None)  # what plan shows
    g = expand(grid(model=m, axes={"loss": ["all", "final", "truncated"], "schedule": ["fixed", "reverse"]}))
    assert len(g.runs) == 1
    g = expand(grid(model={**m, "L": 3}, axes={"loss": ["all", "final"]}))
    assert len(g.runs) == 2  # with loops they differ


def test_constraints_are_checked_on_resolved_values():
    """K comes from the base `model:` section, L from an axis: K*L = 6 still filters."""
    g = expand(grid(model={"d_model": 32, "n_heads": 4, "K": 3}, axes={"L": [1, 2, 3]},
                    constraints=[{"product": ["K", "L"], "equals": 6}]))
    assert [(r.model.K, r.model.L) for r in g.runs] == [(3, 2)]
    g = expand(grid(axes={"L": [1, 2, 3]}, constraints=[{"product": ["K", "L"], "max": 2}]))  # K default 1
    assert sorted(r.model.L for r in g.runs) == [1, 2]
    with pytest.raises(GridError, match="no runs"):
        expand(grid(model={"d_model": 32, "n_heads": 4, "K": 4}, constraints=[{"product": ["K", "L"], "equals": 6}]))
    with pytest.raises(GridError, match="no such field"):
        expand(grid(constraints=[{"product": ["model.depth", "L"], "equals": 6}]))


def test_loss_weights_of_the_wrong_length_are_rejected_by_grid_and_trainer():
    from model import ModelConfig, SeqSpec, TrainConfig, Trainer
    from model.costs import loop_weights

    m = {"d_model": 32, "n_heads": 4, "L": 3}
    for w in ([1.0, 2.0], [1.0, 2.0, 3.0, 4.0]):
        with pytest.raises(GridError, match=r"train.loss_weights.*3 values for L=3"):
            expand(grid(model=m, train={"steps": 10, "loss": "weighted", "loss_weights": w}))
    cfg = TrainConfig(steps=2, loss="weighted", loss_weights=[1.0, 2.0])
    spec = SeqSpec(4, tuple((i,) for i in range(4)), (4,))
    batch = lambda step, gen: (torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool))  # noqa: E731
    with pytest.raises(ValueError, match="3 values for L=3"):
        Trainer(ModelConfig(d_model=16, n_heads=2, L=3), cfg, spec, batch)
    with pytest.raises(ValueError, match="2 weights for a forward of 3 loops"):
        loop_weights(3, cfg)
    assert loop_weights(2, cfg) == [1 / 3, 2 / 3]
    Trainer(ModelConfig(d_model=16, n_heads=2, L=2), cfg, spec, batch)  # the right length trains


def test_a_grid_of_a_million_runs_is_refused_before_it_is_expanded(monkeypatch):
    """Six axes of ten values: 10^6 points. Refused by counting (BOUNDS['grid.runs']), never by expanding:
    the check comes before any run is resolved, so a resolver that fails on the first call is never reached."""
    import study.spec.grid as sg

    big = {f"train.{k}": list(range(1, 11)) for k in ("seed", "steps", "warmup", "batch_size", "log_every")}
    big["model.d_model"] = [16 * i for i in range(1, 11)]

    def never(*a, **k):
        raise AssertionError("a run was resolved")

    monkeypatch.setattr(sg, "_resolve", never)
    monkeypatch.delenv(sg.MAX_RUNS_ENV, raising=False)
    with pytest.raises(GridError, match=r"1,000,000 points to expand .* beyond the bound 10,000 .*RMDM_MAX_RUNS"):
        expand(grid(axes=big))
    groups = [{"name": "a", "axes": {"seed": list(range(6000))}}, {"name": "b", "axes": {"seed": list(range(6000))}}]
    with pytest.raises(GridError, match=r"groups\[1\]\.axes.*12,000 points"):
        expand({**BASE, "groups": groups})  # the groups' points add up
    monkeypatch.undo()
    monkeypatch.setenv(sg.MAX_RUNS_ENV, "3")
    with pytest.raises(GridError, match="4 points to expand .* beyond the bound 3"):
        expand(grid(axes={"K": [1, 2], "L": [1, 3]}))
    monkeypatch.setenv(sg.MAX_RUNS_ENV, "4")
    assert len(expand(grid(axes={"K": [1, 2], "L": [1, 3]})).runs) == 4  # overridable
    monkeypatch.setenv(sg.MAX_RUNS_ENV, "-1")
    with pytest.raises(GridError, match=r"\$RMDM_MAX_RUNS='-1': a positive integer"):
        expand(grid())
