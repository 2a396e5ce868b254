"""Every option of the model and of its training, each by its behaviour.

Run: pytest tests/test_model_options.py -x -q   (tiny models on CPU; a few seconds each)
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from pydantic import ValidationError

from model import ModelConfig, RecursiveDenoiser, SeqSpec, Trainer, TrainConfig, sample
from model.rmdm import loop_position
from model.costs import depth_at, loop_weights
from model.precision import cpu_bf16_native
from model.train import diffusion_loss

N, V = 16, 4
SPEC = SeqSpec(vocab_size=V, pos_ids=tuple((i,) for i in range(N)), pos_sizes=(N,))


def make(K=1, L=3, **kw) -> RecursiveDenoiser:
    torch.manual_seed(0)
    return RecursiveDenoiser(ModelConfig(K=K, L=L, d_model=32, n_heads=4, **kw), SPEC)


def batch(seed=0, B=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, N), generator=g), torch.rand(B, N, generator=g) < 0.25


def loss_and_grads(model, weights, seed=0, n_loops=None):
    """diffusion_loss with the given loop weights; returns (loss, per-loop losses, {name: grad})."""
    x0, cond = batch()
    model.zero_grad(set_to_none=True)
    n_loops = n_loops or model.cfg.L
    loss, per_loop = diffusion_loss(model, x0, cond, torch.Generator().manual_seed(seed), n_loops, weights)
    loss.backward()
    return loss.detach(), per_loop, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def independent_loop_losses(model, seed=0, eps=1e-3):
    """The MDLM ELBO per loop, written out again from the definition (same draws as diffusion_loss)."""
    x0, cond = batch()
    g = torch.Generator().manual_seed(seed)
    B = x0.shape[0]
    t = eps + (1 - eps) * torch.rand(B, 1, generator=g)
    masked = (torch.rand(B, N, generator=g) < t) & ~cond
    xt = x0.masked_fill(masked, SPEC.mask_id)
    out = []
    for lg in model(xt):
        logp = torch.log_softmax(lg, -1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)  # (B, N)
        out.append(((-logp * masked / t).sum(1) / (~cond).sum(1)).mean())
    return out


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**kw)


def grads_close(a, b, tol=1e-6):
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=tol, rtol=1e-5) for k in a)


# ---- losses over loops ---------------------------------------------------------------------
def test_loss_all_is_the_mean_of_the_per_loop_elbos():
    m = make(L=3)
    ref = independent_loop_losses(m)
    loss, per_loop, _ = loss_and_grads(m, loop_weights(3, cfg(loss="all")))
    assert per_loop == pytest.approx([float(r) for r in ref], rel=1e-5)
    assert float(loss) == pytest.approx(sum(float(r) for r in ref) / 3, rel=1e-5)


def test_loss_final_trains_only_through_the_last_loops_logits():
    m = make(L=3)
    heads = []
    m.head.register_forward_hook(lambda *a: heads.append(1))
    loss, per_loop, g_final = loss_and_grads(m, loop_weights(3, cfg(loss="final")))
    assert len(heads) == 1  # earlier loops' logits are never even formed
    assert math.isnan(per_loop[0]) and math.isnan(per_loop[1])
    # the gradient is exactly that of the last loop's ELBO alone
    m.zero_grad(set_to_none=True)
    last = independent_loop_losses(m)[-1]
    last.backward()
    g_ref = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert float(loss) == pytest.approx(float(last), rel=1e-5)
    assert grads_close(g_final, g_ref)
    # ... and differs from the gradient of `all`, which also pulls on the earlier loops
    _, _, g_all = loss_and_grads(m, loop_weights(3, cfg(loss="all")))
    assert not grads_close(g_final, g_all)


def test_truncated_k1_equals_final_and_kL_equals_all():
    m = make(L=3)
    assert loop_weights(3, cfg(loss="truncated", truncate_k=1)) == loop_weights(3, cfg(loss="final"))
    l1, _, g1 = loss_and_grads(m, loop_weights(3, cfg(loss="truncated", truncate_k=1)))
    lf, _, gf = loss_and_grads(m, loop_weights(3, cfg(loss="final")))
    assert float(l1) == float(lf) and grads_close(g1, gf, tol=0)
    l3, _, g3 = loss_and_grads(m, loop_weights(3, cfg(loss="truncated", truncate_k=3)))
    la, _, ga = loss_and_grads(m, loop_weights(3, cfg(loss="all")))
    assert float(l3) == pytest.approx(float(la), rel=1e-6) and grads_close(g3, ga)
    # k = 2: the mean of the last two loops
    ref = [float(r) for r in independent_loop_losses(m)]
    l2, _, _ = loss_and_grads(m, loop_weights(3, cfg(loss="truncated", truncate_k=2)))
    assert float(l2) == pytest.approx((ref[1] + ref[2]) / 2, rel=1e-5)
    # a shallower step (schedules) keeps at most its own depth
    assert loop_weights(1, cfg(loss="truncated", truncate_k=2)) == [1.0]


def test_weighted_default_increases_linearly_and_explicit_list_is_used():
    assert loop_weights(3, cfg(loss="weighted")) == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    w = cfg(loss="weighted", loss_weights=[3.0, 0.0, 1.0])
    assert loop_weights(3, w) == pytest.approx([0.75, 0.0, 0.25])
    assert loop_weights(2, w) == pytest.approx([0.0, 1.0])  # a depth-2 step uses the last two weights
    m = make(L=3)
    ref = [float(r) for r in independent_loop_losses(m)]
    loss, _, _ = loss_and_grads(m, loop_weights(3, w))
    assert float(loss) == pytest.approx(0.75 * ref[0] + 0.25 * ref[2], rel=1e-5)


@pytest.mark.parametrize("kw, msg", [
    ({"loss": "all", "loss_weights": [1.0, 1.0]}, "only used with loss 'weighted'"),
    ({"loss": "weighted", "loss_weights": [1.0, -1.0]}, ">= 0"),
    ({"loss": "weighted", "loss_weights": [1.0, 0.0]}, "last loop's weight"),
    ({"loss": "bogus"}, "all"),
    ({"schedule": "sideways"}, "reverse"),
])
def test_bad_loss_options_fail_clearly(kw, msg):
    with pytest.raises(ValidationError, match=msg):
        TrainConfig(**kw)


def test_grid_checks_loss_options_against_L(tmp_path):
    from study.spec.grid import GridError, expand

    base = {"task": {"name": "sudoku", "n": 4}, "model": {"K": 1, "L": 3}}
    with pytest.raises(GridError, match="loss_weights"):
        expand({**base, "train": {"loss": "weighted", "loss_weights": [1, 2]}})
    with pytest.raises(GridError, match="truncate_k"):
        expand({**base, "train": {"loss": "truncated", "truncate_k": 4}})
    with pytest.raises(GridError, match="min_depth"):
        expand({**base, "train": {"schedule": "reverse", "min_depth": 4}})
    assert len(expand({**base, "train": {"loss": "weighted", "loss_weights": [1, 2, 3]}}).runs) == 1


# ---- training-depth schedules --------------------------------------------------------------
def depths(schedule, steps=20, L=5, **kw):
    c = cfg(schedule=schedule, steps=steps, **kw)
    return [depth_at(s, steps, L, c) for s in range(steps)]


def test_fixed_schedule_always_trains_at_L():
    assert depths("fixed") == [5] * 20


def test_reverse_starts_at_L_max_and_ends_at_1():
    d = depths("reverse")
    assert d[0] == 5 and d[-1] == 1
    assert all(a >= b for a, b in zip(d, d[1:]))
    assert set(d) == {1, 2, 3, 4, 5}  # passes through every depth
    assert depths("reverse", min_depth=2)[-1] == 2


def test_curriculum_grows_from_min_depth_to_L():
    d = depths("curriculum")
    assert d[0] == 1 and d[-1] == 5 and all(a <= b for a, b in zip(d, d[1:]))
    assert depths("curriculum", min_depth=3)[0] == 3


def test_stochastic_draws_in_range_reproducibly_per_step():
    d = depths("stochastic", steps=200, min_depth=2)
    assert set(d) == {2, 3, 4, 5}
    assert d == depths("stochastic", steps=200, min_depth=2)  # a pure function of (seed, step)
    assert d != depths("stochastic", steps=200, min_depth=2, seed=1)


def test_trainer_runs_the_scheduled_depth(tiny_sudoku):
    task = tiny_sudoku
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    tc = TrainConfig(steps=6, batch_size=4, warmup=1, schedule="reverse", log_every=1)
    tr = Trainer(ModelConfig(K=1, L=3, d_model=16, n_heads=2), tc, spec, lambda s, g: task.train_batch(4, g))
    calls = []
    tr.model.block[0].register_forward_hook(lambda *a: calls.append(tr.state.step))
    tr.train()
    want = [depth_at(s, 6, 3, tc) for s in range(6)]
    assert [h["L_t"] for h in tr.state.history] == want == [3, 3, 2, 2, 1, 1]
    assert [calls.count(s) for s in range(6)] == want


# ---- step embedding and input re-injection -------------------------------------------------
def literal_forward(m: RecursiveDenoiser, x, n_loops):
    """h(0) = embed(x); h(l) = f(h(l-1) [+ x_emb] + v(l)); the last loop's logits."""
    x_emb = m.embed(x)
    h = x_emb
    for l in range(1, n_loops + 1):
        v = m.step_emb(loop_position(l, n_loops), h)
        inp = h + (v if v is not None else 0) + (x_emb if m.cfg.reinject_input and l > 1 else 0)
        for layer in m.block:
            inp = layer(inp)
        h = inp
    return m.logits(h)


@pytest.mark.parametrize("step_emb", ["mlp", "sinusoidal", "none"])
@pytest.mark.parametrize("reinject", [False, True])
def test_forward_is_the_literal_loop(step_emb, reinject):
    m = make(L=3, step_emb=step_emb, reinject_input=reinject).eval()
    x = batch()[0]
    for n in (1, 3, 5):
        assert torch.allclose(m(x, n_loops=n)[-1], literal_forward(m, x, n), atol=1e-6)


def test_step_embeddings_tell_loops_apart_and_none_does_not():
    h = torch.zeros(1)
    for kind in ("mlp", "sinusoidal"):
        m = make(step_emb=kind)
        v = [m.step_emb(s, h) for s in (0.0, 0.5, 1.0)]
        assert v[0].shape == (1, 32)
        assert not torch.allclose(v[0], v[1]) and not torch.allclose(v[1], v[2])
    assert make(step_emb="mlp").param_counts()["step_embedding"] > 0
    assert make(step_emb="sinusoidal").param_counts()["step_embedding"] == 0  # fixed, not learned
    assert make(step_emb="none").step_emb(0.5, h) is None
    assert loop_position(1, 1) == 0.0 and loop_position(3, 3) == 1.0 and loop_position(2, 5) == 0.25


def test_reinjection_changes_the_loop_but_not_the_parameters():
    a, b = make(L=3), make(L=3, reinject_input=True)
    assert a.param_counts() == b.param_counts()
    b.load_state_dict(a.state_dict())
    x = batch()[0]
    a.eval(), b.eval()
    assert torch.allclose(a(x)[0], b(x)[0])  # loop 1 starts from x_emb in both
    assert not torch.allclose(a(x)[-1], b(x)[-1], atol=1e-4)


# ---- sampler -------------------------------------------------------------------------------
def test_random_unmasking_is_seeded_and_reproducible():
    m = make(L=2)
    x, cond = batch(B=6)
    a = sample(m, x, cond, T=4, L_s=2, unmask="random", seed=3)
    assert torch.equal(a, sample(m, x, cond, T=4, L_s=2, unmask="random", seed=3))
    assert not torch.equal(a, sample(m, x, cond, T=4, L_s=2, unmask="random", seed=4))
    assert (a[cond] == x[cond]).all() and (a < V).all()


def reveal_order(m, x, cond, **kw):
    """Per sampler step, the set of (b, i) positions masked when the model is called."""
    seen, orig = [], m.forward

    def spy(inp, *a, **k):
        seen.append(inp == SPEC.mask_id)
        return orig(inp, *a, **k)

    m.forward = spy
    out = sample(m, x, cond, **kw)
    del m.forward
    return seen, out


def test_confidence_unmasking_reveals_the_most_confident_positions_first():
    m = make(L=1)
    x, cond = batch(B=4)
    seen, _ = reveal_order(m, x, cond, T=4, L_s=1)
    m.eval()
    with torch.no_grad():
        conf = torch.softmax(m(x.masked_fill(~cond, SPEC.mask_id))[-1], -1).amax(-1)  # (B, N)
    revealed = seen[0] & ~seen[1]
    for b in range(4):
        free = ~cond[b]
        k = int(revealed[b].sum())
        assert k == math.ceil(int(free.sum()) / 4)
        top = conf[b].masked_fill(~free, -1).topk(k).indices
        assert set(top.tolist()) == set(revealed[b].nonzero().flatten().tolist())


def test_temperature_samples_reproducibly_and_zero_is_argmax():
    m = make(L=1)
    x, cond = batch(B=8)
    hot = [sample(m, x, cond, T=1, L_s=1, temperature=5.0, seed=s) for s in (0, 0, 1)]
    assert torch.equal(hot[0], hot[1]) and not torch.equal(hot[0], hot[2])
    m.eval()
    with torch.no_grad():
        argmax = m(x.masked_fill(~cond, SPEC.mask_id))[-1].argmax(-1)
    cold = sample(m, x, cond, T=1, L_s=1, temperature=0.0, seed=0)
    assert torch.equal(cold, torch.where(cond, x, argmax))


def test_remask_reopens_decoded_tokens_and_still_fills_everything_in_T_steps():
    m = make(L=1)
    x, cond = batch(B=4)
    seen, out = reveal_order(m, x, cond, T=4, L_s=1, remask=0.5)
    # without re-masking the masked count only falls; with it some decoded positions re-open
    reopened = [(~a & b).any() for a, b in zip(seen, seen[1:])]
    assert any(reopened)
    assert len(seen) == 4 and (out < V).all() and (out[cond] == x[cond]).all()
    plain, _ = reveal_order(m, x, cond, T=4, L_s=1)
    assert not any((~a & b).any() for a, b in zip(plain, plain[1:]))


def test_sampling_deeper_than_training_depth_runs():
    m = make(L=2)
    calls = []
    m.block[0].register_forward_hook(lambda *a: calls.append(1))
    x, cond = batch(B=3)
    out = sample(m, x, cond, T=2, L_s=7)
    assert len(calls) == 2 * 7 and (out < V).all()
    with pytest.raises(ValueError, match="L_s"):
        sample(m, x, cond, T=2, L_s=0)


# ---- precision, memory ---------------------------------------------------------------------
def test_bf16_autocast_trains_in_bf16_and_float32_stays_float32(tiny_sudoku):
    task = tiny_sudoku
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    dtypes = {}
    for precision in ("float32", "bf16", "auto"):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            tr = Trainer(ModelConfig(K=1, L=2, d_model=16, n_heads=2),
                         TrainConfig(steps=2, batch_size=4, warmup=1, precision=precision), spec,
                         lambda s, g: task.train_batch(4, g))
        slow_warned = any("bf16" in str(x.message) for x in w)
        assert slow_warned == (precision == "bf16" and not cpu_bf16_native())
        tr.model.head.register_forward_hook(lambda mod, i, o: dtypes.__setitem__(precision, o.dtype))
        tr.train()
        assert math.isfinite(tr.state.history[-1]["loss"])
        assert all(p.dtype == torch.float32 for p in tr.model.parameters())  # master weights stay float32
    # auto: a run this small is not worth measuring; the rule takes float32
    assert dtypes == {"float32": torch.float32, "bf16": torch.bfloat16, "auto": torch.float32}


def saved_bytes(m, x):
    """Bytes autograd keeps for backward during one forward."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = m(x, all_logits=False)[-1]
    return total[0], out


def test_checkpoint_loops_keeps_memory_of_one_loop_and_same_gradients():
    x = batch(B=16)[0]
    plain, ckpt, one = make(L=6).train(), make(L=6, checkpoint_loops=True).train(), make(L=1).train()
    b_plain, out_p = saved_bytes(plain, x)
    b_ckpt, out_c = saved_bytes(ckpt, x)
    b_one, _ = saved_bytes(one, x)
    assert b_ckpt < b_plain / 3  # 6 loops of activations -> their inputs only
    assert b_ckpt < 2 * b_one  # about the memory of (K x 1)
    out_p.sum().backward(), out_c.sum().backward()
    gp = {n: p.grad for n, p in plain.named_parameters()}
    gc = {n: p.grad for n, p in ckpt.named_parameters()}
    assert grads_close(gp, gc)
