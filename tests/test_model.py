"""The R-MDM's structure, cost accounting, training and sampler. Run: pytest tests/test_model.py"""
from __future__ import annotations

import math

import pytest
import torch

from model import ModelConfig, RecursiveDenoiser, SeqSpec, Trainer, TrainConfig, sample
from model.rmdm import sample_all, sample_steps

SPEC = SeqSpec(vocab_size=4, pos_ids=tuple((i,) for i in range(16)), pos_sizes=(16,))


def make(K=1, L=1, **kw):
    torch.manual_seed(0)
    return RecursiveDenoiser(ModelConfig(K=K, L=L, d_model=32, n_heads=4, **kw), SPEC)


def test_parameters_do_not_depend_on_loops():
    assert make(K=2, L=1).param_counts() == make(K=2, L=7).param_counts()
    # and do depend on K: exactly one more layer
    one, two = make(K=1).param_counts()["block"], make(K=2).param_counts()["block"]
    assert two == 2 * one


def test_flops_grow_with_K_times_L():
    base = make(K=1, L=1)
    head = base.flops_per_forward(1) - (make(K=2, L=1).flops_per_forward(1) - base.flops_per_forward(1))
    layer = base.flops_per_forward(1) - head
    for K, L in [(1, 3), (3, 1), (2, 2), (4, 5)]:
        assert make(K=K, L=L).flops_per_forward() == K * L * layer + head
    # the layer count is the usual 24 N d^2-ish closed form (d_ff = 4d): 2 N (4d^2 + 8 d^2) + 4 N^2 d
    N, d = 16, 32
    assert layer == 2 * N * 12 * d * d + 4 * N * N * d


def test_logits_after_every_loop():
    m = make(K=1, L=3)
    x = torch.randint(0, 5, (2, 16))
    out = m(x)
    assert len(out) == 3 and all(o.shape == (2, 16, 4) for o in out)
    assert not torch.allclose(out[0], out[2])  # loops change the prediction
    assert len(m(x, n_loops=5)) == 5  # any depth at inference
    last = m(x, all_logits=False)
    assert len(last) == 1 and torch.allclose(last[0], out[-1])


def test_block_is_shared_across_loops():
    m = make(K=1, L=4)
    names = [n for n, _ in m.named_parameters() if n.startswith("block.")]
    assert all(n.startswith("block.0.") for n in names)


def test_training_loss_falls_on_tiny_sudoku(tiny_sudoku):
    task = tiny_sudoku
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    tr = Trainer(ModelConfig(K=1, L=2, d_model=32, n_heads=4),
                 TrainConfig(steps=150, batch_size=32, lr=3e-3, warmup=10, log_every=1),
                 spec, lambda s, g: task.train_batch(32, g))
    tr.train()
    losses = [h["loss"] for h in tr.state.history]
    first, last = sum(losses[:15]) / 15, sum(losses[-15:]) / 15
    # chance is ln 4 = 1.386 nats per masked cell (the 1/t weighting averages to about that)
    assert last < 0.75 * first and last < 0.8 * math.log(4), (first, last)


@pytest.mark.parametrize("T", [1, 2, 3, 7])
def test_sampler_keeps_givens_and_fills_every_mask_in_T_steps(T):
    m = make(K=1, L=2)
    calls = []
    m.block[0].register_forward_hook(lambda *a: calls.append(1))
    x = torch.randint(0, 4, (5, 16))
    cond = torch.rand(5, 16) < 0.3
    out = sample(m, x, cond, T=T, L_s=3)
    assert (out[cond] == x[cond]).all()
    assert (out < 4).all()  # no mask token left
    n_free = int((~cond).sum(1).max())
    assert len(calls) == min(T, n_free) * 3  # T steps (fewer only if fewer blanks), L_s loops each


def test_sampler_reveals_ceil_remaining_over_steps_left():
    m = make(K=1, L=1)
    x = torch.zeros(1, 16, dtype=torch.long)
    cond = torch.zeros(1, 16, dtype=torch.bool)
    seen = []
    orig = m.forward

    def spy(inp, *a, **k):
        seen.append(int((inp == SPEC.mask_id).sum()))
        return orig(inp, *a, **k)

    m.forward = spy
    sample(m, x, cond, T=3, L_s=1)
    # 16 masked -> reveal ceil(16/3)=6 -> 10 left -> ceil(10/2)=5 -> 5 left -> 5
    assert seen == [16, 10, 5]


@pytest.mark.parametrize("T", [2, 40])
def test_sampler_reports_the_steps_it_ran(T):
    """The cost the sampler reports is the block calls a hook counts, not T * L_s: at T = 40
    with at most 16 blanks it stops early."""
    m = make(K=2, L=1)
    rows = []  # batch rows through the block's first layer, one entry per loop of a model call
    m.block[0].register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    x = torch.randint(0, 4, (5, 16), generator=torch.Generator().manual_seed(1))
    cond = torch.rand(5, 16, generator=torch.Generator().manual_seed(2)) < 0.5
    got = sample_steps(m, x, cond, T=T, L_s=3)
    assert got.forward_passes == len(rows) and (got.steps * got.loops == len(rows)).all()
    assert got.model_calls * got.loops == sum(rows)
    # per example and step: L_s loops in each step run, none after; the head once a step
    assert (got.step_loops[:, :int(got.steps[0])] == 3).all() and int(got.step_loops.sum()) == sum(rows)
    assert got.head_calls == got.model_calls and got.forward_passes_mean == len(rows)
    if T == 40:
        assert got.forward_passes < T * 3
    # in batches of 2: each batch stops on its own; per-example steps say so
    rows.clear()
    cond[:2] = True  # the first batch has nothing to fill: no model call at all
    got = sample_all(m, x, cond, T=T, L_s=3, batch_size=2)
    assert got.steps[:2].tolist() == [0, 0] and got.model_calls * 3 == sum(rows)
    assert got.forward_passes == max(int(s) for s in got.steps) * 3
