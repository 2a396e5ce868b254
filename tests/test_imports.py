"""Imports on demand: each read command, run through the CLI's real entry point in a fresh interpreter on a
done 3-run store (benchmarks/cli_latency.py's), imports only the heavy modules it needs.

- status, plan, prune: none of torch, ray, seaborn, matplotlib, scipy;
- report --figure iso-param: matplotlib and seaborn (the theme and palettes; it imports scipy) only, never torch or ray;
  --redraw likewise;
- verify (without --deep): none of them: the weights are read without torch (model/checkpoint_meta.py), the
  cost, rows and scores re-derived with the torch-free functions that wrote them (study/engine/rows.py).
The Python API's tables (rmdm_study: runs, evals, history, table, compare) import none of them.
Also: the parameter counts and shapes read without torch (model/costs.py) are the built model's, and the
torch-free weights reader agrees with torch.load(weights_only=True): the same shapes, the same refusals.
Run: .venv/bin/python -m pytest tests/test_imports.py -q
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.cli_latency import commands, make_store, study_code  # noqa: E402

HEAVY = ("torch", "ray", "seaborn", "matplotlib", "scipy", "optuna", "sklearn")
EXPECTED = {"status": [], "plan": [], "prune": [], "report": ["matplotlib", "scipy", "seaborn"],
            "report-redraw": ["matplotlib", "scipy", "seaborn"],
            "verify": []}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("imports"))
    gpath, root = make_store(tmp)
    return gpath, root, tmp


def heavy_imports(argv: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
    """The heavy top-level packages in sys.modules when `study ARGV` exits (printed by an atexit hook)."""
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: print('HEAVY=' + ','.join(sorted(m for m in sys.modules "
            f"if m in {HEAVY!r}))))\n" + study_code(argv))
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [line for line in p.stdout.splitlines() if line.startswith("HEAVY=")]
    assert lines, f"no HEAVY line: rc {p.returncode}, {p.stdout[-500:]} {p.stderr[-1500:]}"
    return [m for m in lines[-1][len("HEAVY="):].split(",") if m], p


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_read_command_imports_only_what_it_needs(store, name):
    gpath, root, tmp = store
    argv = commands(gpath, root, os.path.join(tmp, f"fig-{name}"))[name]
    got, p = heavy_imports(argv)
    # verify finds the synthetic store's made-up samples and weights wrong (exit 1): it still ran every check
    assert p.returncode == (1 if name == "verify" else 0), p.stderr[-1500:]
    assert got == EXPECTED[name], f"study {name} imported {got}, expected {EXPECTED[name]}"
    if name.startswith("report"):
        assert os.path.exists(os.path.join(argv[argv.index("--out") + 1], "iso_param.png"))
        assert "1 figure: 1 drawn" in p.stdout, p.stdout


def test_param_counts_without_torch_are_the_built_models():
    import torch

    from model import ModelConfig, RecursiveDenoiser, SeqSpec
    from model.costs import param_counts, param_shapes

    for kw in (dict(K=1, L=2, d_model=128, n_heads=4, mlp_ratio=2),
               dict(K=3, L=1, d_model=96, n_heads=3, mlp_ratio=2.5, step_emb="sinusoidal"),
               dict(K=2, L=4, d_model=64, n_heads=2, step_emb="none")):
        cfg = ModelConfig(**kw)
        for vocab, sizes in ((10, (81,)), (27, (9, 9, 9))):
            with torch.device("meta"):
                model = RecursiveDenoiser(cfg, SeqSpec(vocab, tuple((0,) * len(sizes) for _ in range(81)), sizes))
            assert param_counts(cfg, vocab, sizes) == model.param_counts(), kw
            want = {k: tuple(t.shape) for k, t in model.state_dict().items()}
            assert param_shapes(cfg, vocab, sizes) == want, kw


def test_weights_read_without_torch_are_what_torch_loads():
    import io
    import pickle

    import torch

    from model import ModelConfig, RecursiveDenoiser, SeqSpec
    from model.checkpoint_meta import CheckpointError, read_state_meta
    from model.train import load_state

    model = RecursiveDenoiser(ModelConfig(K=2, L=1, d_model=16, n_heads=2), SeqSpec(5, ((0,), (1,), (2,)), (3,)))
    opt = torch.optim.AdamW(model.parameters())
    sum(p.sum() for p in model.parameters()).backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": 3, "seconds": 1.5,
                "history": [{"step": 0, "loss": 1.0}], "torch_rng": torch.get_rng_state(),
                "model_cfg": {"d_model": 16, "x": None}}, buf)
    data = buf.getvalue()
    sd, meta = load_state(io.BytesIO(data)), read_state_meta(data, "w.pt")
    assert {k: tuple(t.shape) for k, t in sd["model"].items()} == {k: t.shape for k, t in meta["model"].items()}
    assert meta["model"]["head.weight"].dtype == "float"
    assert tuple(meta["torch_rng"].shape) == tuple(sd["torch_rng"].shape)
    assert (meta["step"], meta["seconds"], meta["history"]) == (3, 1.5, [{"step": 0, "loss": 1.0}])
    assert meta["opt"]["param_groups"][0]["lr"] == sd["opt"]["param_groups"][0]["lr"]

    class Crafted:
        def __reduce__(self):
            return (print, ("ran",))

    bad = io.BytesIO()
    torch.save({"model": {}, "x": Crafted()}, bad)
    for blob, why in ((bad.getvalue(), "refused"), (data[: len(data) // 2], "not a readable checkpoint"),
                      (pickle.dumps({"model": {}}), ""), (b"text", "not a readable")):  # "": refused, either way
        with pytest.raises(CheckpointError, match=why):
            load_state(io.BytesIO(blob))
        with pytest.raises(CheckpointError, match=why):
            read_state_meta(blob)


def test_python_api_tables_import_no_heavy_module(store):
    _, root, _ = store
    code = ("import sys, rmdm_study\n"
            f"s = rmdm_study.open({root!r}).study('latency')\n"
            "assert len(s.table()) and len(s.runs) and len(s.evals) and len(s.history)\n"
            "s.compare()\n"
            f"print('HEAVY=' + ','.join(sorted(m for m in sys.modules if m in {HEAVY!r})))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-1500:]
    assert p.stdout.strip().splitlines()[-1] == "HEAVY=", p.stdout


def test_report_with_workers_draws_without_matplotlib_in_its_own_process(store):
    """`report --figure all` with drawing workers: the figure modules import matplotlib only when they draw
    (analysis.plotting.mpl), so the main process, which orders and captions them, never imports it (its workers
    do)."""
    gpath, root, tmp = store
    out = os.path.join(tmp, "fig-all-jobs")
    argv = commands(gpath, root, out)["report"]
    argv = [a if a != "iso-param" else "all" for a in argv] + ["--jobs", "2"]
    got, p = heavy_imports(argv)
    assert p.returncode == 0, p.stderr[-1500:]
    assert got == [], f"study report --figure all --jobs 2 imported {got} in its own process"
    assert os.path.exists(os.path.join(out, "iso_param.png")) and os.path.exists(os.path.join(out, "report.md"))
