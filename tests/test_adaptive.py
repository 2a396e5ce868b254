"""Adaptive sampling depth: loops stop once predictions settle, counted with a hook on the block;
grids ask for it as an eval-only point; a tiny study stores what it spent and draws it.
Run: pytest tests/test_adaptive.py"""
from __future__ import annotations

import pytest
import torch

from model import ModelConfig, RecursiveDenoiser, SeqSpec
from model.rmdm import sample_all, sample_steps
from study.spec.grid import GridError, expand

SPEC = SeqSpec(vocab_size=4, pos_ids=tuple((i,) for i in range(16)), pos_sizes=(16,))


def identity_model(peaked: int = 16, step_emb: str = "none", reinject: bool = False) -> RecursiveDenoiser:
    """A real model whose block is the identity (attention and MLP outputs zeroed), so its
    predictions are the same after every loop: after loop 1 already. Positions < `peaked` predict
    token 0 with confidence ~1; the others are flat (confidence 1/4): they never settle."""
    torch.manual_seed(0)
    m = RecursiveDenoiser(ModelConfig(K=1, L=1, d_model=16, n_heads=2, step_emb=step_emb, reinject_input=reinject,
                                       attention="sdpa"), SPEC)
    with torch.no_grad():
        for layer in m.block:
            for lin in (layer.attn.proj, layer.mlp[2]):
                lin.weight.zero_()
                lin.bias.zero_()
        m.tok_emb.weight.zero_()
        m.pos_embs[0].weight.zero_()
        m.pos_embs[0].weight[:peaked, 0] = 10.0  # h = 10 e_0 at peaked positions, 0 elsewhere
        m.head.weight.zero_()
        m.head.weight[0, 0] = 5.0  # logit of token 0 ~ 5 * 3.9 after the final norm; 0 where h = 0
    return m


def hooked(m: RecursiveDenoiser) -> list[int]:
    """Batch rows through the block, one entry per loop (the block's first layer sees every loop)."""
    rows: list[int] = []
    m.block[0].register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    return rows


def test_settled_predictions_stop_after_two_loops_per_step():
    m = identity_model()
    rows = hooked(m)
    x = torch.zeros(3, 16, dtype=torch.long)
    cond = torch.rand(3, 16, generator=torch.Generator().manual_seed(0)) < 0.5
    got = sample_steps(m, x, cond, T=3, L_s=6, adaptive=0.9)
    steps = int(got.steps[0])
    assert steps == 3
    # two loops a step (one comparison), whatever the cap; counted by the hook, rows of 3 examples
    assert got.step_loops.tolist() == [[2, 2, 2]] * 3 and rows == [3] * (2 * steps)
    assert got.passes.tolist() == [6, 6, 6] and got.forward_passes == 6 and got.forward_passes_mean == 6.0
    assert got.head_calls == 3 * 6  # the head reads the predictions after every loop
    # the same completions as looping to the cap: the predictions had settled
    assert torch.equal(got.x, sample_steps(m, x, cond, T=3, L_s=6).x)


def test_threshold_above_one_never_stops_and_is_fixed_depth():
    """No confidence reaches 1.01: every example loops to the cap, exactly the fixed sampler at L_s = cap
    (same step embeddings, same outputs, same block passes)."""
    torch.manual_seed(0)
    m = RecursiveDenoiser(ModelConfig(K=1, L=3, d_model=32, n_heads=4, attention="sdpa"), SPEC)
    rows = hooked(m)
    x = torch.randint(0, 4, (5, 16), generator=torch.Generator().manual_seed(1))
    cond = torch.rand(5, 16, generator=torch.Generator().manual_seed(2)) < 0.4
    ada = sample_steps(m, x, cond, T=4, L_s=4, adaptive=1.01)
    n_ada = list(rows)
    rows.clear()
    fixed = sample_steps(m, x, cond, T=4, L_s=4)
    assert torch.equal(ada.x, fixed.x)
    assert n_ada == rows == [5] * 16 and ada.forward_passes == fixed.forward_passes == 16
    assert (ada.step_loops == 4).all() and torch.equal(ada.passes, fixed.passes)
    assert fixed.head_calls == 5 * 4 and ada.head_calls == 5 * 16


@pytest.mark.parametrize("reinject", [False, True])
def test_each_example_stops_on_its_own(reinject):
    """Blanks of example 0 only at confident positions (settles at loop 2), of example 1 only at flat
    ones (loops to the cap): the hook sees both for two loops, then example 1 alone (with its own
    re-injected input: h grows by x_emb a loop, the final norm reads the same direction)."""
    m = identity_model(peaked=8, reinject=reinject)
    rows = hooked(m)
    x = torch.zeros(2, 16, dtype=torch.long)
    cond = torch.ones(2, 16, dtype=torch.bool)
    cond[0, :4] = False  # confident positions
    cond[1, 8:12] = False  # flat positions
    got = sample_steps(m, x, cond, T=2, L_s=5, adaptive=0.9)
    assert got.step_loops.tolist() == [[2, 2], [5, 5]]
    assert rows == [2, 2, 1, 1, 1] * 2
    assert got.forward_passes == 10 and got.forward_passes_mean == 7.0
    # in batches of one: the same count per example
    rows.clear()
    one = sample_all(m, x, cond, T=2, L_s=5, batch_size=1, adaptive=0.9)
    assert one.step_loops.tolist() == [[2, 2], [5, 5]] and sum(rows) == 14


def test_adaptive_threshold_must_be_positive():
    m = identity_model()
    with pytest.raises(ValueError, match="threshold"):
        sample_steps(m, torch.zeros(1, 16, dtype=torch.long), torch.zeros(1, 16, dtype=torch.bool), 2, 3,
                     adaptive=0.0)


# ---- grids -------------------------------------------------------------------------------
BASE = {
    "study": "ada",
    "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 20, "n_test": 10},
    "model": {"d_model": 16, "n_heads": 2},
    "train": {"steps": 10},
    "eval": {"T": [1, 2], "L_s": ["train"]},
    "axes": {"L": [1, 3]},
}


def _grid(**ev):
    return expand({**BASE, "eval": {**BASE["eval"], **ev}}, "ada.yaml")


def test_adaptive_points_are_eval_only():
    plain = _grid()
    ada = _grid(adaptive=[{"max_loops": 6, "threshold": 0.9}, {"max_loops": "train", "threshold": 0.95}])
    assert [r.run_id for r in plain.runs] == [r.run_id for r in ada.runs]  # never retrains
    for p_run, a_run in zip(plain.runs, ada.runs):
        fixed = {p.key for p in p_run.eval_points()}
        pts = a_run.eval_points()
        assert fixed <= {p.key for p in pts}  # fixed points keep their keys (their stored results stay valid)
        extra = [p for p in pts if p.key not in fixed]
        assert all(p.adaptive is not None and "-adaptive-" in p.key for p in extra)
        # 'train' caps at L_t, and gives no point at L = 1 (one loop leaves nothing to compare)
        want = {(T, 6, 0.9) for T in (1, 2)} | ({(T, 3, 0.95) for T in (1, 2)} if a_run.model.L == 3 else set())
        assert {(p.T, p.L_s, p.adaptive) for p in extra} == want
        assert {p.label for p in extra} >= {"confidence+adaptive(0.9)"}
    # a different threshold is a different evaluation
    other = _grid(adaptive=[{"max_loops": 6, "threshold": 0.8}])
    assert not {p.key for p in other.runs[0].eval_points()} - {p.key for p in plain.runs[0].eval_points()} \
        & {p.key for p in ada.runs[0].eval_points()}


@pytest.mark.parametrize("bad, key, hint", [
    ([{"max_loops": 8, "threshold": 1.5}], "eval.adaptive.0.threshold", "less than or equal to 1"),
    ([{"max_loops": 8, "threshold": 0}], "eval.adaptive.0.threshold", "greater than 0"),
    ([{"max_loops": 1, "threshold": 0.9}], "eval.adaptive.0.max_loops", ">= 2"),
    ([{"max_loops": 8, "threshold": True}], "eval.adaptive.0.threshold", "not a boolean"),
    ([{"max": 8, "threshold": 0.9}], "eval.adaptive.0.max", "allowed: max_loops, threshold"),
    ([{"threshold": 0.9}], "eval.adaptive.0.max_loops", "Field required"),
    ({"max_loops": 8, "threshold": 0.9}, "eval.adaptive", "valid list"),
])
def test_bad_adaptive_points_name_file_key_and_allowed_values(bad, key, hint):
    with pytest.raises(GridError) as e:
        _grid(adaptive=bad)
    msg = str(e.value)
    assert msg.startswith("ada.yaml: key ") and key in msg and hint in msg and "\n" not in msg


def test_adaptive_is_refused_for_a_likelihood_task():
    raw = {"study": "t8", "task": {"name": "text8"}, "model": {"d_model": 16, "n_heads": 2},
           "train": {"steps": 10}, "eval": {"adaptive": [{"max_loops": 4, "threshold": 0.9}]}}
    with pytest.raises(GridError, match="eval.adaptive.*likelihood"):
        expand(raw, "t8.yaml")


# ---- end to end: a tiny study ------------------------------------------------------------
def test_tiny_study_stores_and_draws_adaptive_points(tmp_path):
    """4x4 Sudoku, d 16, 20 steps, trained and evaluated through study.engine.trial.execute (real Parquet);
    the adaptive point's rows say what it spent (<= the cap's), and the compute figure draws it."""
    from analysis.figures import FIGURES
    from analysis.load import load_study
    from store import Store
    from study.engine.trial import execute
    from study.engine.options import TrialOptions

    raw = {"study": "ada4", "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 64, "n_test": 16},
           "model": {"d_model": 16, "n_heads": 2, "L": 3},
           "train": {"steps": 20, "batch_size": 16, "warmup": 2, "checkpoint_every": 1000},
           "eval": {"T": [1, 3], "L_s": ["train"], "n_examples": 16,
                    "adaptive": [{"max_loops": 4, "threshold": 0.5}]}}
    run = expand(raw, "ada4.yaml").runs[0]
    root = str(tmp_path / "results")
    store = Store(root, "ada4")
    execute(run, store, TrialOptions("test"))
    ev = store.read("evals")
    vpr = ev[ev.metric == "vpr"].set_index(["sampler", "T"])
    assert set(vpr.index) == {("confidence", 1), ("confidence", 3), ("confidence+adaptive(0.5)", 1),
                              ("confidence+adaptive(0.5)", 3)}
    for T in (1, 3):
        a, f = vpr.loc[("confidence+adaptive(0.5)", T)], vpr.loc[("confidence", T)]
        assert a.L_s == 4 and f.L_s == 3
        assert 2 * T <= a.forward_passes_mean <= a.forward_passes <= 4 * T  # 2..cap loops a step
        assert f.forward_passes == f.forward_passes_mean == 3 * T
        assert a.eval_flops > 0
    # the fixed rows' keys are those a grid without adaptive points owes: nothing re-evaluated
    plain = {**raw, "eval": {k: v for k, v in raw["eval"].items() if k != "adaptive"}}
    assert {p.key for p in expand(plain, "ada4.yaml").runs[0].eval_points()} == \
        set(ev.eval_key[ev.sampler == "confidence"])
    paths = FIGURES["compute"](load_study(root, "ada4"), str(tmp_path / "fig"))
    assert any(p.endswith(".png") for p in paths)


def test_plan_and_search_tell_adaptive_points_from_fixed(tmp_path, monkeypatch):
    """`study plan --json` lists the adaptive point by its label; a search scores the fixed-depth point
    of its (T, L_s, sampler), never the adaptive one that shares them."""
    import json

    import yaml
    from typer.testing import CliRunner

    from study.cli import app
    from study.spec.search import SearchMetric
    from study.engine.tune import _metric_point

    raw = {**BASE, "axes": {"L": [3]}, "eval": {"T": [2], "L_s": ["train"],
                                                "adaptive": [{"max_loops": "train", "threshold": 0.9}]}}
    path = tmp_path / "ada.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert out.exit_code == 0, out.output
    pts = json.loads(out.output.splitlines()[0])["eval_points"]
    assert pts == [{"T": 2, "L_s": 3, "sampler": "confidence"},
                   {"T": 2, "L_s": 3, "sampler": "confidence+adaptive(0.9)"}]
    run = expand(raw, "ada.yaml").runs[0]
    assert _metric_point(run, SearchMetric(name="vpr", T=2)).adaptive is None
    # whatever the order of the points: the adaptive one listed first
    listed = run.eval_points()
    monkeypatch.setattr(type(run), "eval_points", lambda self: listed[::-1])
    assert _metric_point(run, SearchMetric(name="vpr", T=2)).adaptive is None
