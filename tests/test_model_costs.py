"""Cost accounting: parameters, training and inference FLOPs, iso-FLOP / iso-parameter partners;
and the device a trial trains on.

Run: pytest tests/test_model_costs.py -x -q   (no training; under a second)
"""
from __future__ import annotations

import pytest
import torch

from model import ModelConfig, RecursiveDenoiser, SeqSpec, TrainConfig, flops_per_forward
from model.costs import (depth_at, heads_run, inference_flops_per_sample, train_flops_per_step,
                         train_flops_total)

N, V, D = 81, 9, 64
SPEC = SeqSpec(vocab_size=V, pos_ids=tuple((i,) for i in range(N)), pos_sizes=(N,))


def mc(K=2, L=3, **kw):
    return ModelConfig(K=K, L=L, d_model=D, n_heads=4, **kw)


def layer_flops():
    return flops_per_forward(mc(K=1, L=1), N, V, heads=0)


def head_flops():
    return flops_per_forward(mc(K=1, L=1), N, V, heads=1) - layer_flops()


def test_training_flops_count_the_loops_and_heads_actually_run():
    m, B = mc(K=2, L=3), 16
    all_ = train_flops_per_step(m, TrainConfig(batch_size=B, loss="all"), N, V)
    assert all_ == B * 3 * (2 * 3 * layer_flops() + 3 * head_flops())  # a head on every loop
    final = train_flops_per_step(m, TrainConfig(batch_size=B, loss="final"), N, V)
    assert final == B * 3 * (2 * 3 * layer_flops() + head_flops())  # earlier logits never formed
    assert heads_run(3, TrainConfig(loss="truncated", truncate_k=2)) == 3
    assert heads_run(3, TrainConfig(loss="truncated", truncate_k=1)) == 1
    # a step at depth 1 of a schedule costs a third of the blocks
    shallow = train_flops_per_step(m, TrainConfig(batch_size=B, loss="all"), N, V, n_loops=1)
    assert shallow == B * 3 * (2 * layer_flops() + head_flops())
    # activation checkpointing recomputes the blocks' forward once more
    ckpt = train_flops_per_step(mc(K=2, L=3, checkpoint_loops=True), TrainConfig(batch_size=B), N, V)
    assert ckpt - all_ == B * 2 * 3 * layer_flops()


def test_total_training_flops_follow_the_depth_schedule():
    m = mc(K=1, L=4)
    fixed = TrainConfig(steps=10, batch_size=2, loss="final")
    rev = TrainConfig(steps=10, batch_size=2, loss="final", schedule="reverse")
    assert train_flops_total(m, fixed, N, V) == 10 * train_flops_per_step(m, fixed, N, V)
    want = sum(2 * 3 * (depth_at(s, 10, 4, rev) * layer_flops() + head_flops()) for s in range(10))
    assert train_flops_total(m, rev, N, V) == want < train_flops_total(m, fixed, N, V)


def test_inference_flops_are_T_times_L_s_forwards_and_independent_of_L_t():
    for L_t in (1, 3, 7):
        m = mc(K=2, L=L_t)
        got = inference_flops_per_sample(m, N, V, T=20, L_s=3)
        assert got == 20 * (2 * 3 * layer_flops() + head_flops())
        assert got == 20 * RecursiveDenoiser(m, SPEC).flops_per_forward(3)
    with pytest.raises(ValueError, match="T and L_s"):
        inference_flops_per_sample(mc(), N, V, T=0, L_s=1)


def test_iso_flop_and_iso_param_baselines_of_a_recursive_model():
    # (6 x 5) against its iso-FLOP (30 x 1) and iso-parameter (6 x 1) baselines
    with torch.device("meta"):
        rec, flop, par = (RecursiveDenoiser(mc(K=k, L=l), SPEC) for k, l in ((6, 5), (30, 1), (6, 1)))
    # iso-FLOP: same per-forward compute; iso-param: same parameters
    assert rec.flops_per_forward() == flop.flops_per_forward()
    assert rec.param_counts() == par.param_counts()
    assert flop.param_counts()["block"] == 5 * rec.param_counts()["block"]
    assert par.flops_per_forward() < rec.flops_per_forward()


def test_parameters_count_K_layers_whatever_L_and_options():
    for kw in ({}, {"step_emb": "sinusoidal"}, {"reinject_input": True}, {"checkpoint_loops": True}):
        counts = {L: RecursiveDenoiser(mc(K=2, L=L, **kw), SPEC).param_counts() for L in (1, 4)}
        assert counts[1] == counts[4]
        assert counts[1]["total"] - counts[1]["non_embedding"] == (V + 1) * D + N * D


def test_device_follows_the_gpus_ray_grants(monkeypatch):
    from study.spec.grid import Resources
    from study.engine.trial import pick_device

    assert pick_device(Resources(gpu=0)).type == "cpu"
    if torch.cuda.is_available():
        assert pick_device(Resources(gpu=1)).type == "cuda"
    else:  # a GPU asked for where there is none is an error, unless the grid allows the CPU
        with pytest.raises(RuntimeError, match="allow_cpu_fallback"):
            pick_device(Resources(gpu=1))
        assert pick_device(Resources(gpu=1, allow_cpu_fallback=True)).type == "cpu"
    # a trial granted a GPU (Ray sets CUDA_VISIBLE_DEVICES) trains on it; one granted none never grabs one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device(Resources(gpu=0.5)).type == "cuda"
    assert pick_device(Resources(gpu=0)).type == "cpu"
