"""Attention kernels (sdpa / math) and precisions (float32 / bf16 autocast) compute one model,
and `auto` chooses among them per machine without ever picking emulated bf16.

Run: pytest tests/test_attention_paths.py -q   (tiny models on CPU; a few seconds each)
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from model import ModelConfig, RecursiveDenoiser, SeqSpec, Trainer, TrainConfig, sample
from model import precision as prec
from model.train import diffusion_loss

N, V = 16, 4
SPEC = SeqSpec(vocab_size=V, pos_ids=tuple((i // 4, i % 4, (i // 8) * 2 + (i % 4) // 2) for i in range(N)),
               pos_sizes=(4, 4, 4))
PATHS = [(a, p) for a in prec.ATTENTIONS for p in prec.PRECISIONS]


def batch(seed=0, B=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, N), generator=g), torch.rand(B, N, generator=g) < 0.25


def loss_and_grad(attention: str, precision: str, L: int = 2) -> tuple[float, torch.Tensor]:
    torch.manual_seed(0)
    m = RecursiveDenoiser(ModelConfig(K=2, L=L, d_model=32, n_heads=4), SPEC).train()
    m.set_attention(attention)
    x0, cond = batch()
    with prec.autocast(torch.device("cpu"), precision):
        loss, _ = diffusion_loss(m, x0, cond, torch.Generator().manual_seed(1), L, [1 / L] * L)
    loss.backward()
    return float(loss.detach()), torch.cat([p.grad.flatten() for p in m.parameters()])


@pytest.mark.parametrize("attention,precision", PATHS)
def test_every_path_gives_the_same_loss_and_gradients(attention, precision):
    ref_loss, ref_grad = loss_and_grad("sdpa", "float32")
    loss, grad = loss_and_grad(attention, precision)
    if precision == "float32":
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        assert torch.allclose(grad, ref_grad, rtol=1e-3, atol=1e-6)
    else:  # bf16 keeps 8 bits of mantissa; loose enough for AMX and AVX512-BF16 alike
        assert loss == pytest.approx(ref_loss, rel=3e-2)
        cos = torch.nn.functional.cosine_similarity(grad, ref_grad, dim=0)
        assert cos > 0.98 and (grad.norm() / ref_grad.norm() - 1).abs() < 0.1


def test_a_model_trained_on_one_path_samples_on_another(tiny_sudoku):
    """Train with written-out attention in bf16, reload the weights into an sdpa / float32
    model: the weights carry no kernel choice, and both paths sample the same puzzles alike."""
    task = tiny_sudoku
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    tr = Trainer(ModelConfig(K=1, L=2, d_model=32, n_heads=4, attention="math"),
                 TrainConfig(steps=30, batch_size=16, lr=3e-3, warmup=3, precision="bf16"), spec,
                 lambda s, g: task.train_batch(16, g))
    assert (tr.attention, tr.precision, tr.paths["how"]) == ("math", "bf16", "fixed")
    tr.train()
    other = RecursiveDenoiser(ModelConfig(K=1, L=2, d_model=32, n_heads=4, attention="sdpa"), spec)
    other.load_state_dict(tr.model.state_dict())
    assert other.attention == "sdpa" and tr.model.attention == "math"
    ev = task.eval_set("test")
    x, cond = ev.x0[:20], ev.cond[:20]
    tr.model.eval()
    with torch.no_grad():
        l_math = tr.model(x, n_loops=2, all_logits=False)[-1]
        l_sdpa = other(x, n_loops=2, all_logits=False)[-1]
    assert torch.allclose(l_math, l_sdpa, rtol=1e-4, atol=1e-4)
    out_math = sample(tr.model, x, cond, T=3, L_s=2, precision="bf16")
    out_sdpa = sample(other, x, cond, T=3, L_s=2, precision="float32")
    for out in (out_math, out_sdpa):
        assert (out < task.vocab_size).all() and torch.equal(out[cond], x[cond])
    # argmax near-ties may flip between float32 and bf16; nearly every cell agrees
    assert (out_math == out_sdpa).float().mean() > 0.8


def test_auto_never_offers_bf16_where_the_cpu_has_no_bf16_units():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert prec.candidates(cpu, "auto", "auto", bf16_native=False) == [("sdpa", "float32"), ("math", "float32")]
    assert ("math", "bf16") in prec.candidates(cpu, "auto", "auto", bf16_native=True)
    assert prec.candidates(cpu, "math", "auto", bf16_native=False) == [("math", "float32")]
    assert prec.candidates(cpu, "sdpa", "bf16", bf16_native=False) == [("sdpa", "bf16")]  # pinned: kept (warned)
    assert prec.candidates(cuda, "auto", "auto") == [("sdpa", "bf16")]  # flash / efficient kernels, tensor cores
    got = prec.choose(cpu, "auto", "auto", {"d": 1}, lambda a, p: 1.0 if p == "bf16" else 2.0, bf16_native=False)
    assert got["precision"] == "float32"
    with pytest.raises(ValueError, match="precision"):
        prec.candidates(cpu, "auto", "fp16")
    with pytest.raises(ValueError, match="resolved"):
        prec.autocast(cpu, "auto")


def test_auto_measures_once_per_machine_and_shape_then_reads_its_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RMDM_CACHE_DIR", str(tmp_path))
    cpu, calls = torch.device("cpu"), []
    secs = {("sdpa", "float32"): 3.0, ("math", "float32"): 2.0, ("sdpa", "bf16"): 4.0, ("math", "bf16"): 1.0}

    def measure(a, p):
        calls.append((a, p))
        return secs[(a, p)]

    first = prec.choose(cpu, "auto", "auto", {"d": 32}, measure, bf16_native=True)
    assert (first["attention"], first["precision"], first["how"]) == ("math", "bf16", "measured")
    n = len(calls)
    assert n >= 8  # a warm-up and at least one timed step per path
    again = prec.choose(cpu, "auto", "auto", {"d": 32}, measure, bf16_native=True)
    assert (again["attention"], again["precision"], again["how"]) == ("math", "bf16", "cached") and len(calls) == n
    other = prec.choose(cpu, "auto", "auto", {"d": 64}, measure, bf16_native=True)  # another shape: measured
    assert other["how"] == "measured" and len(calls) > n
    assert len(json.loads((tmp_path / "fastest_paths.json").read_text())["entries"]) == 2
    (tmp_path / "fastest_paths.json").write_text("{not json")  # a damaged cache is measured again, not fatal
    assert prec.choose(cpu, "auto", "auto", {"d": 32}, measure, bf16_native=True)["how"] == "measured"
    # a path whose step raises is ruled out, the run goes on with another
    def bf16_broken(a, p):
        if p == "bf16":
            raise RuntimeError("no bf16 kernel here")
        return secs[(a, p)]

    got = prec.choose(cpu, "auto", "auto", {"d": 128}, bf16_broken, bf16_native=True)
    assert (got["attention"], got["precision"]) == ("math", "float32") and got["times"]["math/bf16"] == math.inf
    # a run too small to repay a measurement takes the rule
    small = prec.choose(cpu, "auto", "auto", {"d": 8}, measure, total_flops=1e9, bf16_native=True)
    assert (small["attention"], small["precision"], small["how"]) == ("sdpa", "float32", "rule")


def test_trainer_measures_its_real_step_and_records_the_choice(tiny_sudoku, tmp_path, monkeypatch):
    """A real measurement (timings decide only which valid path wins: the assertions hold for any)."""
    monkeypatch.setenv("RMDM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(prec, "MEASURE_MIN_FLOPS", 0)
    task = tiny_sudoku
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())

    def make():
        return Trainer(ModelConfig(K=1, L=2, d_model=16, n_heads=2), TrainConfig(steps=3, batch_size=8, warmup=1),
                       spec, lambda s, g: task.train_batch(8, g))

    tr = make()
    assert tr.paths["how"] == "measured"
    assert (tr.attention, tr.precision) in prec.candidates(torch.device("cpu"), "auto", "auto")
    assert set(tr.paths["times"]) == {f"{a}/{p}" for a, p in prec.candidates(torch.device("cpu"), "auto", "auto")}
    assert tr.model.attention == tr.attention
    assert not hasattr(tr, "_scratch")
    # the measurement trains a copy: the run's initial weights are those of a rule-chosen trainer
    monkeypatch.setattr(prec, "MEASURE_MIN_FLOPS", float("inf"))
    ruled = make()
    assert ruled.paths["how"] == "rule"
    assert all(torch.equal(a, b) for a, b in zip(tr.model.state_dict().values(), ruled.model.state_dict().values()))
    monkeypatch.setattr(prec, "MEASURE_MIN_FLOPS", 0)
    again = make()
    assert again.paths["how"] == "cached" and (again.attention, again.precision) == (tr.attention, tr.precision)


def test_non_finite_loss_is_found_without_a_sync_per_step_and_names_its_step(tiny_sudoku):
    task = tiny_sudoku
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    tr = Trainer(ModelConfig(K=1, L=1, d_model=16, n_heads=2), TrainConfig(steps=6, batch_size=4, warmup=1),
                 spec, lambda s, g: task.train_batch(4, g))
    rows = [tr.train_step(sync=False) for _ in range(2)]
    assert isinstance(rows[0]["loss"], torch.Tensor)  # nothing waited for the device
    assert math.isfinite(tr.sync_row(rows[1])["loss"])
    with torch.no_grad():
        for p in tr.model.parameters():
            p.fill_(float("nan"))
    rows = [tr.train_step(sync=False) for _ in range(3)]  # steps 2, 3, 4
    with pytest.raises(FloatingPointError, match="non-finite loss nan at step 2"):
        tr.sync_row(rows[-1])



def test_the_runs_table_and_the_log_record_the_resolved_paths(tmp_path):
    """A real tiny run through `study.engine.trial.execute` (real Parquet, no Ray): `auto` is stored resolved."""
    from store import Store
    from study.spec.grid import expand
    from study.engine.trial import execute
    from study.engine.options import TrialOptions

    grid = {"study": "paths", "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 40, "n_test": 8},
            "model": {"d_model": 16, "n_heads": 2, "attention": "math"},
            "train": {"steps": 3, "batch_size": 8, "warmup": 1}, "eval": {"T": [2], "n_examples": 8}}
    run = expand(grid, "paths.yaml").runs[0]
    assert run.train.precision == "auto"  # the default
    store = Store(str(tmp_path), "paths")
    execute(run, store, TrialOptions("test"))
    row = store.read("runs").iloc[0]
    assert (row["attention"], row["precision"]) == ("math", "float32")  # pinned; auto -> rule at this size
    log = store.read_bytes(store.path("logs", f"{run.run_id}.log")).decode()
    # with bf16 units `auto` chose float32 by rule among two precisions; without them float32 is the only one
    from model.precision import cpu_bf16_native

    assert f"attention math, precision float32 ({'rule' if cpu_bf16_native() else 'fixed'})" in log


def _run_gpu_check(*args, block_pydantic=False):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, runpy; " + ("sys.modules['pydantic'] = None; " if block_pydantic else "")
            + f"sys.argv = ['gpu_check.py', *{list(args)!r}]; "
            + "runpy.run_path('benchmarks/gpu_check.py', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_gpu_check_without_cuda_says_so_and_exits_0():
    r = _run_gpu_check()
    assert r.returncode == 0, r.stderr
    assert "no CUDA device" in r.stdout and r.stdout.strip().splitlines()[-1] == "gpu_check device=none"


@pytest.mark.slow
def test_gpu_check_runs_from_model_and_tasks_without_pydantic(tmp_path):
    """The GPU box has no pydantic: the CPU dry run of gpu_check works with it blocked."""
    r = _run_gpu_check("--cpu-dry-run", "--train-s", "1", block_pydantic=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "pydantic missing" in r.stdout
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check device=") and "vpr_2x3_T5=" in last and "vpr_6x1_T5=" in last
