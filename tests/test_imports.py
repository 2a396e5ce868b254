"""Imports on demand: each read command, run through the CLI's real entry point in a fresh interpreter on a
done 3-run store (benchmarks/cli_latency.py's), imports only the heavy modules it needs.

- status, plan, prune: none of torch, ray, seaborn, matplotlib, scipy;
- report --figure iso-param: matplotlib and seaborn (the theme and palettes every figure draws with:
  analysis/plotting.py), scipy (through them), never torch or ray;
- verify (without --deep): torch, for the done runs' weights (read with torch.load, weights_only) and the
  sampler's cost rule; never ray or the drawing stack.
The Python API's tables (rmdm_study: runs, evals, history, table, compare) import none of them.
Also: the parameter counts `study plan` gives without torch (model/flops.py) are the built model's.
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
EXPECTED = {"status": [], "plan": [], "prune": [], "report": ["matplotlib", "scipy", "seaborn"], "verify": ["torch"]}


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
    if name == "report":
        assert os.path.exists(os.path.join(tmp, f"fig-{name}", "iso_param.png"))


def test_param_counts_without_torch_are_the_built_models():
    import torch

    from model import ModelConfig, RecursiveDenoiser, SeqSpec
    from model.flops import param_counts

    for kw in (dict(K=1, L=2, d_model=128, n_heads=4, mlp_ratio=2),
               dict(K=3, L=1, d_model=96, n_heads=3, mlp_ratio=2.5, step_emb="sinusoidal"),
               dict(K=2, L=4, d_model=64, n_heads=2, step_emb="none")):
        cfg = ModelConfig(**kw)
        for vocab, sizes in ((10, (81,)), (27, (9, 9, 9))):
            with torch.device("meta"):
                model = RecursiveDenoiser(cfg, SeqSpec(vocab, tuple((0,) * len(sizes) for _ in range(81)), sizes))
            assert param_counts(cfg, vocab, sizes) == model.param_counts(), kw


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
