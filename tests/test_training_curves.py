"""Training curves with the evaluation metric at checkpoints (eval.at_checkpoints): scored on validation
examples into the history, drawn by `--figure training-curves`, and without any effect on training."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from store import Store
from tests.helpers import study, tiny_grid


# slow set (29 s of the default suite, measured under load); the default suite keeps test_continuous's unchanged-numbers test
@pytest.mark.slow
def test_checkpoint_scores_leave_training_unchanged_and_are_drawn(tmp_path):
    plain, watched = tmp_path / "plain.yaml", tmp_path / "watched.yaml"
    plain.write_text(tiny_grid("curves", steps=20, axes="L: [2]"))
    watched.write_text(tiny_grid("curves", steps=20, axes="L: [2]", eval_extra=", at_checkpoints: 8"))
    for g, res in ((plain, tmp_path / "a"), (watched, tmp_path / "b")):
        r = study("run", str(g), "--results", str(res))
        assert r.returncode == 0, r.stdout + r.stderr
    a, b = Store(str(tmp_path / "a"), "curves"), Store(str(tmp_path / "b"), "curves")
    (run_id,) = a.read("runs")["run_id"].tolist()
    assert b.read("runs")["run_id"].tolist() == [run_id]  # eval settings are not part of the run id

    # the same weights, bit for bit, and the same evaluations
    wa = torch.load(a.weights_path(run_id), weights_only=True)["model"]
    wb = torch.load(b.weights_path(run_id), weights_only=True)["model"]
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ea = a.read("evals").sort_values(["eval_key", "metric"])["value"].tolist()
    eb = b.read("evals").sort_values(["eval_key", "metric"])["value"].tolist()
    assert ea == eb

    # scores at the checkpoint (step 10: after steps 0..9) and at the last step, at each T; none without
    ha, hb = a.read("history"), b.read("history")
    assert ha["val"].isna().all()
    scored = hb[hb["val"].notna()].sort_values("step")
    assert scored["step"].tolist() == [9, 19]
    for v in scored["val"]:
        d = json.loads(v)
        vpr = {k: x for k, x in d.items() if k.startswith("val_vpr_")}
        assert sorted(vpr) == ["val_vpr_T1", "val_vpr_T2"] and all(0.0 <= x <= 1.0 for x in vpr.values())
        # beside them the continuous quantities (study/engine/continuous.py), nats per blank
        assert sorted(set(d) - set(vpr)) == ["val_elbo", "val_ref_nll"] and d["val_elbo"] > 0 < d["val_ref_nll"]
    # the loss rows a plain run logs are all there, with the same losses
    merged = ha.merge(hb, on="step", suffixes=("_a", "_b"))
    assert len(merged) == len(ha) and (merged["loss_a"] == merged["loss_b"]).all()

    out = tmp_path / "fig"
    r = study("report", "--results", str(tmp_path / "b"), "--study", "curves", "--figure", "training-curves",
              "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    table = pd.read_csv(out / "training_curves_val.csv")
    assert sorted(table["key"].unique()) == ["val_vpr_T1", "val_vpr_T2"] and set(table["step"]) == {9, 19}
    assert (out / "training_curves.png").stat().st_size > 0


def test_likelihood_tasks_refuse_checkpoint_scores(tmp_path):
    g = tmp_path / "t8.yaml"
    g.write_text("study: t8\ntask: {name: text8, seq_len: 16}\nmodel: {d_model: 16, n_heads: 2}\n"
                 "train: {steps: 2}\neval: {at_checkpoints: 4}\n")
    r = study("plan", str(g))
    assert r.returncode == 2 and "eval.at_checkpoints" in r.stderr, r.stderr


def test_time_in_untimed_callback_blocks_is_not_training_time(tiny_sudoku, monkeypatch):
    """Checkpoint scoring runs inside `Trainer.untimed`: its time stays out of `state.seconds` (a run's
    train_seconds), while time elsewhere in a callback (a checkpoint write) still counts. A fake clock
    that moves only when the test moves it: no dependence on this machine's speed."""
    import model.train as mt
    from model import ModelConfig, SeqSpec, Trainer, TrainConfig

    task = tiny_sudoku
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    tr = Trainer(ModelConfig(K=1, L=1, d_model=16, n_heads=2),
                 TrainConfig(steps=6, batch_size=4, warmup=1, checkpoint_every=2, log_every=1),
                 spec, lambda s, g: task.train_batch(4, g))
    clock = [1000.0]
    monkeypatch.setattr(mt.time, "perf_counter", lambda: clock[0])

    def on_checkpoint(t: Trainer) -> None:
        with t.untimed():
            clock[0] += 100.0  # "scoring"
        clock[0] += 1.0  # "writing the checkpoint"

    tr.train(on_checkpoint=on_checkpoint)
    # checkpoints after steps 2 and 4 (not at the last step): 2 x 1 s counted, 2 x 100 s not
    assert tr.state.seconds == 2.0
    assert [r["seconds"] for r in tr.state.history] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
