"""Exact resume: N steps straight == N/2 steps, save, load in a NEW process, N/2 more (float32, CPU).

Saved and loaded as study/engine/trial.py does: `torch.save(trainer.state_dict())`, then `load_state` (weights
only) and `Trainer.load_state_dict`.

Run: pytest tests/test_model_resume.py -x -q   (two tiny trainings and one subprocess; seconds)
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

from model import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Everything a step draws (data, masking, dropout, depth, lr) must come from the checkpoint or
# from (seed, step): dropout, a stochastic depth schedule and a weighted loss make any leak show.
SETUP = textwrap.dedent("""
    import torch
    from model import ModelConfig, SeqSpec, Trainer, TrainConfig
    torch.set_num_threads(1)
    SPEC = SeqSpec(vocab_size=5, pos_ids=tuple((i % 4, i // 4) for i in range(16)), pos_sizes=(4, 4))
    MODEL = ModelConfig(K=2, L=3, d_model=32, n_heads=4, dropout=0.1, step_emb="mlp", reinject_input=True)
    TRAIN = TrainConfig(steps=12, batch_size=8, lr=3e-3, warmup=3, loss="weighted", schedule="stochastic",
                        seed=7, log_every=1)

    def batch_fn(step, g):
        return torch.randint(0, 5, (8, 16), generator=g), torch.rand(8, 16, generator=g) < 0.3
""")
RESUME = SETUP + textwrap.dedent("""
    import sys
    from model.train import load_state
    tr = Trainer(MODEL, TRAIN, SPEC, batch_fn)
    tr.load_state_dict(load_state(sys.argv[1], tr.device))
    assert tr.state.step == 6, tr.state.step
    tr.train()
    torch.save(tr.state_dict(), sys.argv[2])
""")


def test_resume_in_a_new_process_gives_the_same_weights(tmp_path):
    scope: dict = {}
    exec(SETUP, scope)  # the same setup text the subprocess runs
    torch.set_num_threads(1)
    straight = Trainer(scope["MODEL"], scope["TRAIN"], scope["SPEC"], scope["batch_fn"])
    straight.train()

    half = Trainer(scope["MODEL"], scope["TRAIN"], scope["SPEC"], scope["batch_fn"])
    half.train(until=6)
    torch.save(half.state_dict(), tmp_path / "half.pt")
    torch.manual_seed(12345)  # whatever the parent's RNG does next must not matter

    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, str(script), str(tmp_path / "half.pt"), str(tmp_path / "resumed.pt")],
                   check=True, env=env, cwd=ROOT, timeout=600)  # generous: a shared, loaded CPU
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)

    assert resumed["step"] == straight.state.step == 12
    assert [h["L_t"] for h in resumed["history"]] == [h["L_t"] for h in straight.state.history]
    assert len({h["L_t"] for h in straight.state.history}) > 1  # the schedule really varied
    for name, w in straight.model.state_dict().items():
        torch.testing.assert_close(resumed["model"][name], w, atol=1e-6, rtol=0, msg=name)
    # the optimizer moments too: a further step would agree as well
    for a, b in zip(resumed["opt"]["state"].values(), straight.opt.state_dict()["state"].values()):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], atol=1e-9, rtol=1e-6)
    # and the comparison can fail: the half-trained weights are far from the final ones
    assert not torch.allclose(torch.load(tmp_path / "half.pt", weights_only=True)["model"]["head.weight"],
                              straight.model.state_dict()["head.weight"], atol=1e-4)


def test_dropout_noise_is_a_function_of_the_step():
    """Without per-step seeding a resumed run would draw other dropout masks than a straight one."""
    scope: dict = {}
    exec(SETUP, scope)
    a = Trainer(scope["MODEL"], scope["TRAIN"], scope["SPEC"], scope["batch_fn"])
    b = Trainer(scope["MODEL"], scope["TRAIN"], scope["SPEC"], scope["batch_fn"])
    a.train(until=2)
    torch.rand(1000)  # disturb the global RNG between the two trainings
    b.train(until=2)
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
