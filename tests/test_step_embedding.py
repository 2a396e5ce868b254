"""The step embedding v(l) must not drown the input it is added to.

A fixed sinusoidal v(l) at its raw size (rms 0.71) against input embeddings initialised at std 0.02
kept a 9x9 Sudoku (1 x 3) at chance loss for 500 steps (docs/REPRODUCTION.md, cross-depth); the
learned (mlp) one starts small and trains.
"""
import pytest
import torch

from model.config import ModelConfig
from model.rmdm import RecursiveDenoiser, SeqSpec, loop_position


def _model(kind: str, d: int = 32) -> RecursiveDenoiser:
    torch.manual_seed(0)
    spec = SeqSpec(vocab_size=4, pos_ids=tuple((i,) for i in range(6)), pos_sizes=(6,))
    return RecursiveDenoiser(ModelConfig(K=1, L=3, d_model=d, n_heads=4, step_emb=kind), spec)


@pytest.mark.parametrize("kind", ["mlp", "sinusoidal"])
@pytest.mark.parametrize("n_loops", [1, 3, 4, 6])
def test_step_embedding_no_larger_than_the_input_embedding_at_init(kind, n_loops):
    m = _model(kind)
    x = torch.randint(0, 5, (8, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x_rms = m.embed(x).pow(2).mean().sqrt()
        for l in range(1, n_loops + 1):
            v = m.step_emb(loop_position(l, n_loops), x_rms)
            assert v.shape == (1, 32)
            assert v.pow(2).mean().sqrt() <= x_rms, (kind, l, n_loops)


def test_sinusoidal_step_embedding_still_tells_loops_apart():
    m = _model("sinusoidal")
    like = torch.zeros(())
    vs = [m.step_emb(loop_position(l, 3), like) for l in (1, 2, 3)]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not torch.allclose(vs[a], vs[b])
    assert float(vs[0].pow(2).mean().sqrt()) == pytest.approx(0.02, rel=1e-3)
