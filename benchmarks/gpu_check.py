"""GPU readiness in one run (under 8 minutes on one GPU): is the CUDA path fast and right?

    python benchmarks/gpu_check.py                  # on a machine with CUDA
    python benchmarks/gpu_check.py --cpu-dry-run    # the same code, tiny and on the CPU (for CI / no GPU)

Needs torch and numpy only, plus this repository's model/ and tasks/ (no ray, optuna, pandas; where
pydantic is missing a small stand-in, benchmarks/pydantic_lite.py, takes its place). Prints:
- the device, its bf16 dense peak from a table of known devices, and the path `auto` takes there
  (bf16 autocast, SDPA: flash / memory-efficient kernels, fused AdamW, TF32 for float32 matmuls);
- host syncs inside one training step (`torch.cuda.set_sync_debug_mode`): must be 0;
- step time of the paper's (6 x 5) and (30 x 1) at d 384 on 9x9 Sudoku, batch 256, achieved
  TFLOP/s (model FLOPs, `model.costs.train_flops_per_step`) against the bf16 peak, peak memory;
- a short paper-scale Sudoku training of (6 x 5) and (30 x 1) at d 384 (a time budget each) and
  their VPR at T = 5 on the test puzzles.
The last line is machine-readable: `gpu_check device=... vs_bf16_peak=... vpr_6x5_T5=... ...`.
On a machine without CUDA it says so and exits 0.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pydantic_lite  # noqa: E402

LITE = pydantic_lite.install()

import torch  # noqa: E402

from model import ModelConfig, SeqSpec, Trainer, TrainConfig  # noqa: E402
from model.costs import bf16_peak_flops, train_flops_per_step  # noqa: E402
from model.rmdm import sample  # noqa: E402
from tasks.sudoku import Sudoku, SudokuConfig  # noqa: E402

def bf16_peak(name: str) -> float | None:
    """TFLOP/s of the CUDA device `name` (model.costs.BF16_PEAK_TFLOPS), None when unknown."""
    got = bf16_peak_flops(name)
    return got / 1e12 if got is not None else None


def sudoku_task(n_train: int, n_test: int) -> Sudoku:
    task = Sudoku(SudokuConfig(n=9, n_train=n_train, n_test=n_test))
    task.prepare(None)
    return task


def make_trainer(task, K: int, L: int, d: int, heads: int, B: int, steps: int, device) -> Trainer:
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    return Trainer(ModelConfig(K=K, L=L, d_model=d, n_heads=heads),
                   TrainConfig(steps=steps, batch_size=B, lr=1e-3, warmup=min(100, steps // 10), log_every=50),
                   spec, lambda s, g: task.train_batch(B, g), device)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_syncs(tr: Trainer) -> int | None:
    """Synchronizing calls inside one `train_step(sync=False)` (CUDA's sync debug mode)."""
    if tr.device.type != "cuda":
        return None
    tr.train_step(sync=False)  # warm: allocations, kernel selection
    sync(tr.device)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            tr.train_step(sync=False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for x in w:
        print(f"  host sync: {str(x.message).splitlines()[0]}")
    return len(w)


def step_speed(tr: Trainer, reps: int) -> dict:
    for _ in range(2):
        tr.train_step(sync=False)
    sync(tr.device)
    if tr.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(tr.device)
    t = time.perf_counter()
    for _ in range(reps):
        row = tr.train_step(sync=False)
    sync(tr.device)
    sec = (time.perf_counter() - t) / reps
    tr.sync_row(row)
    flops = train_flops_per_step(tr.model_cfg, tr.cfg, tr.spec.seq_len, tr.spec.vocab_size)
    mem = torch.cuda.max_memory_allocated(tr.device) / 2**30 if tr.device.type == "cuda" else float("nan")
    return {"step_s": sec, "tflops": flops / sec / 1e12, "peak_mem_gib": mem}


def data_time(task, B: int, reps: int = 10) -> float:
    """Best seconds of one host-side training batch (sampled grids, symmetry augmentation, givens)."""
    best = float("inf")
    for i in range(reps):
        t = time.perf_counter()
        task.train_batch(B, torch.Generator().manual_seed(i))
        best = min(best, time.perf_counter() - t)
    return best


def vpr(task, model, T: int, precision: str, batch: int = 500) -> float:
    """Valid Puzzle Rate on the test puzzles at T denoising steps, L_s = the training depth."""
    ev = task.eval_set("test")
    device = next(model.parameters()).device
    outs = [sample(model, ev.x0[i:i + batch].to(device), ev.cond[i:i + batch].to(device), T=T, L_s=model.cfg.L,
                   precision=precision).cpu() for i in range(0, len(ev.x0), batch)]
    scores = task.score(torch.cat(outs), ev)
    return sum(r["vpr"] for r in scores) / len(scores)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny settings on the CPU: checks the code, not speed")
    ap.add_argument("--train-s", type=float, default=150.0, help="training time budget per model (seconds)")
    ap.add_argument("--steps", type=int, default=3000, help="training steps per model at most")
    ap.add_argument("--reps", type=int, default=10, help="timed steps per shape")
    a = ap.parse_args()
    t_start = time.perf_counter()
    if not torch.cuda.is_available() and not a.cpu_dry_run:
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing to check")
        print("gpu_check device=none")
        return 0
    device = torch.device("cpu" if a.cpu_dry_run else "cuda")
    if a.cpu_dry_run:
        d, heads, B, shapes, n_train, n_test = 32, 4, 8, [(2, 3), (6, 1)], 50, 20
        a.train_s, a.steps, a.reps = min(a.train_s, 5.0), min(a.steps, 20), min(a.reps, 2)
        name, peak = "cpu (dry run)", None
    else:
        d, heads, B, shapes, n_train, n_test = 384, 6, 256, [(6, 5), (30, 1)], 10000, 500
        name = torch.cuda.get_device_name(device)
        peak = bf16_peak(name)
    print(f"gpu_check: {name}, torch {torch.__version__}, bf16 dense peak "
          f"{f'{peak:.0f} TFLOP/s' if peak else 'unknown (not in the table)'}"
          + ("; pydantic missing: using benchmarks/pydantic_lite.py" if LITE else ""))
    t = time.perf_counter()
    task = sudoku_task(n_train, n_test)
    print(f"Sudoku 9x9 data: {n_train} training grids, {n_test} test puzzles in {time.perf_counter() - t:.1f} s")

    out = {"device": name.replace(" ", "_")}
    for K, L in shapes:
        tag = f"{K}x{L}"
        tr = make_trainer(task, K, L, d, heads, B, a.steps, device)
        print(f"\n({K} x {L}) d {d}, {heads} heads, batch {B}: attention {tr.attention}, precision {tr.precision} "
              f"({tr.paths['how']}); TF32 {torch.backends.cuda.matmul.allow_tf32}; "
              f"fused AdamW {tr.opt.defaults.get('fused')}")
        n_sync = host_syncs(tr)
        if n_sync is not None:
            print(f"  host syncs inside a training step: {n_sync} (want 0)")
            out[f"syncs_{tag}"] = n_sync
        del tr
        sp = step_speed(make_trainer(task, K, L, d, heads, B, a.steps, device), a.reps)
        frac = sp["tflops"] / peak if peak else float("nan")
        print(f"  step {sp['step_s'] * 1e3:.1f} ms, {sp['tflops']:.1f} TFLOP/s ({frac:.2f} of the bf16 peak), "
              f"peak memory {sp['peak_mem_gib']:.2f} GiB")
        data_s = data_time(task, B)
        print(f"  a training batch takes {data_s * 1e3:.2f} ms on the host, {data_s / sp['step_s']:.3f} of a step "
              f"(want <= 0.05)")
        out[f"data_vs_step_{tag}"] = round(data_s / sp["step_s"], 4)
        out.update({f"step_ms_{tag}": round(sp["step_s"] * 1e3, 2), f"tflops_{tag}": round(sp["tflops"], 1),
                    f"vs_bf16_peak_{tag}": round(frac, 3), f"peak_mem_gib_{tag}": round(sp["peak_mem_gib"], 2)})

        # a short training within the time budget, then VPR at T = 5
        tr = make_trainer(task, K, L, d, heads, B, a.steps, device)
        t = time.perf_counter()
        while tr.state.step < a.steps and time.perf_counter() - t < a.train_s:
            row = tr.train_step(sync=False)
            if tr.state.step % 100 == 0:
                row = tr.sync_row(row)
                print(f"  step {row['step']} loss {row['loss']:.4f} ({time.perf_counter() - t:.0f} s)")
        row = tr.sync_row(row)
        train_s = time.perf_counter() - t
        t = time.perf_counter()
        v = vpr(task, tr.model, 5, tr.precision)
        print(f"  trained {tr.state.step} steps in {train_s:.0f} s (final loss {row['loss']:.4f}); "
              f"VPR at T = 5, L_s = {L}: {100 * v:.1f}% on {n_test} test puzzles ({time.perf_counter() - t:.1f} s)")
        out.update({f"steps_{tag}": tr.state.step, f"loss_{tag}": round(row["loss"], 4), f"vpr_{tag}_T5": round(v, 4)})
        del tr
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    print("gpu_check " + " ".join(f"{k}={v}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
