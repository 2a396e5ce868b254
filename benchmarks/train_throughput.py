"""Training and sampling speed of the R-MDM against this machine's own limits, measured in one run.

    nice -n 15 .venv/bin/python benchmarks/train_throughput.py            # ~3-5 minutes on 2 idle cores
    .venv/bin/python benchmarks/train_throughput.py --profile             # + torch.profiler top ops
    .venv/bin/python benchmarks/train_throughput.py --batch 16 --reps 1 --no-memory   # smoke run

Reference config: d_model 256, 8 heads, sequence 81 (9x9 Sudoku, vocabulary 9), batch 256;
shapes (4 x 1), (1 x 4), (2 x 2); loss `all`, AdamW, grad clipping: the real `Trainer.train_step`.
Every attention kernel x precision path (`sdpa` / `math` x float32 / bf16 autocast; bf16 only where
the CPU has bf16 units) is timed at the (4 x 1) shape, and so is the path `auto` picks
(model/precision.py), which gives `auto_vs_best`. Also printed: the CPU model and flags, tokens/s
and achieved GFLOP/s (model FLOPs, `model.costs.train_flops_per_step`), the float32 and bf16
matrix-multiply peak measured in this same run, a baseline built from
`torch.nn.TransformerEncoderLayer` at the (4 x 1) shape, the real Sudoku task's batch generation
against a training step, sampling puzzles/s (batched across puzzles) and its FLOP rate against
training's, and peak memory with and without `checkpoint_loops`. Every figure is a ratio against
something measured in this run, because the machine is shared and its speed varies from minute
to minute. Each timing is the best of its repeats (as the peak is): noise only ever slows a run down.

Where the CPU has no bf16 matrix units (AVX2 only), bf16 matmuls are emulated and a full-batch
bf16 step would take minutes; bf16 is then not timed (auto never picks it) and bf16_vs_fp32 is nan.

The last line is machine-readable:
    fp32_vs_peak=<r> bf16_vs_fp32=<r> bf16_vs_peak=<r> vs_baseline=<r> auto_vs_best=<r> data_vs_step=<r>
    sample_vs_train=<r> sample_puzzles_per_s=<n>
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from model import ModelConfig, RecursiveDenoiser, SeqSpec, Trainer, TrainConfig, sample  # noqa: E402
from model.costs import inference_flops_per_sample, train_flops_per_step  # noqa: E402
from model.precision import ATTENTIONS, cpu_bf16_native, machine_summary  # noqa: E402

D, HEADS, N, V, BATCH = 256, 8, 81, 9, 256
SHAPES = [(4, 1), (1, 4), (2, 2)]
SPEC = SeqSpec(V, tuple((i // 9, i % 9, (i // 27) * 3 + (i % 9) // 3) for i in range(N)), (9, 9, 9))


def batch_fn(B: int):
    def fn(step: int, g: torch.Generator):
        return torch.randint(0, V, (B, N), generator=g), torch.rand(B, N, generator=g) < 0.3
    return fn


def best_time(fn, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


# ---- the machine's own matmul peak ---------------------------------------------------------
def matmul_peak(dtype: torch.dtype, budget_s: float = 1.5) -> float:
    """Best GFLOP/s of plain matmuls: squares and the model's own MLP shape (B*N, D) x (D, 4D)."""
    emulated = dtype == torch.bfloat16 and not cpu_bf16_native()
    shapes = [(512, 512, 512)] if emulated else [(1024, 1024, 1024), (2048, 2048, 2048), (BATCH * N, D, 4 * D)]
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        a @ b
        t_end, t_best = time.perf_counter() + budget_s / len(shapes), float("inf")
        while True:
            t = time.perf_counter()
            a @ b
            t_best = min(t_best, time.perf_counter() - t)
            if time.perf_counter() > t_end:
                break
        best = max(best, 2 * m * k * n / t_best / 1e9)
    return best


# ---- the R-MDM's real training step --------------------------------------------------------
def trainer(K: int, L: int, precision: str, B: int | None = None, attention: str = "sdpa", **model_kw) -> Trainer:
    B = B or BATCH
    return Trainer(ModelConfig(K=K, L=L, d_model=D, n_heads=HEADS, attention=attention, **model_kw),
                   TrainConfig(steps=1000, batch_size=B, warmup=10, precision=precision), SPEC, batch_fn(B))


def train_speed(K: int, L: int, precision: str, reps: int, B: int | None = None, attention: str = "sdpa") -> dict:
    B = B or BATCH
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bf16-on-AVX2 warning: this benchmark says it itself
        tr = trainer(K, L, precision, B, attention)
    t = best_time(tr.train_step, reps)
    flops = train_flops_per_step(tr.model_cfg, tr.cfg, N, V)
    return {"shape": f"({K} x {L})", "attention": tr.attention, "precision": tr.precision, "batch": B, "step_s": t,
            "tokens_per_s": B * N / t, "gflops": flops / t / 1e9}


def auto_choice(K: int, L: int, B: int) -> dict:
    """What `attention: auto, precision: auto` resolves to for this shape (measured, or from the cache)."""
    t = time.perf_counter()
    tr = Trainer(ModelConfig(K=K, L=L, d_model=D, n_heads=HEADS, attention="auto"),
                 TrainConfig(steps=1000, batch_size=B, warmup=10, precision="auto"), SPEC, batch_fn(B))
    return {**tr.paths, "choose_s": time.perf_counter() - t}


# ---- data: the real Sudoku task's batches ------------------------------------------------------
def data_time(B: int, reps: int = 5) -> float:
    """Seconds of one training batch of the real 9x9 Sudoku task (sampled grids, symmetry
    augmentation, givens), as `study` hands it to the trainer."""
    from tasks.sudoku import Sudoku, SudokuConfig

    task = Sudoku(SudokuConfig(n=9, mask_rate=0.5, n_train=2000, n_test=10, structural_pos=True))
    task.prepare(None)
    step = [0]

    def one():
        step[0] += 1
        task.train_batch(B, torch.Generator().manual_seed(step[0]))

    return best_time(one, reps)


# ---- baseline: a straightforward nn.TransformerEncoder at the (4 x 1) shape ---------------------
class Baseline(nn.Module):
    def __init__(self, n_layers: int):
        super().__init__()
        self.tok = nn.Embedding(V + 1, D)
        self.pos = nn.Parameter(torch.randn(N, D) * 0.02)
        layer = nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, x):
        return self.head(self.norm(self.enc(self.tok(x) + self.pos)))


def baseline_speed(precision: str, reps: int, B: int | None = None) -> dict:
    B = B or BATCH
    torch.manual_seed(0)
    model = Baseline(4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fn, step = batch_fn(B), [0]

    def train_step():
        g = torch.Generator().manual_seed(step[0])
        x0, cond = fn(step[0], g)
        t = 1e-3 + (1 - 1e-3) * torch.rand(B, 1, generator=g)
        masked = (torch.rand(B, N, generator=g) < t) & ~cond
        xt = x0.masked_fill(masked, V)
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cpu", enabled=False)
        with ctx:
            logits = model(xt)
        ce = F.cross_entropy(logits.float().reshape(B * N, V), x0.reshape(-1), reduction="none").view(B, N)
        loss = ((ce * masked / t).sum(1) / (~cond).sum(1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step[0] += 1

    t = best_time(train_step, reps)
    return {"shape": "baseline (4 x 1)", "precision": precision, "batch": B, "step_s": t, "tokens_per_s": B * N / t}


# ---- sampling ----------------------------------------------------------------------------------
def sample_speed(precision: str, reps: int, n_puzzles: int, T: int = 20, L_s: int = 3, attention: str = "sdpa") -> dict:
    torch.manual_seed(0)
    model = RecursiveDenoiser(ModelConfig(K=1, L=4, d_model=D, n_heads=HEADS, attention=attention), SPEC)
    g = torch.Generator().manual_seed(0)
    x, cond = torch.randint(0, V, (n_puzzles, N), generator=g), torch.rand(n_puzzles, N, generator=g) < 0.3
    t = best_time(lambda: sample(model, x, cond, T=T, L_s=L_s, precision=precision), reps, warmup=0)
    flops = inference_flops_per_sample(model.cfg, N, V, T, L_s) * n_puzzles
    return {"model": "(1 x 4)", "T": T, "L_s": L_s, "puzzles": n_puzzles, "seconds": t,
            "puzzles_per_s": n_puzzles / t, "gflops": flops / t / 1e9}


# ---- peak memory, each in a fresh process (ru_maxrss only grows) ----------------------------
def memory_child(K: int, L: int, ckpt: bool) -> None:
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
    tr = trainer(K, L, "float32", checkpoint_loops=ckpt)
    base = high_water_kib()
    tr.train_step()
    print(json.dumps({"peak_mib": (high_water_kib() - base) / 1024}))


def high_water_kib() -> int:
    """This process's peak resident memory. VmHWM, not ru_maxrss: Linux carries ru_maxrss over
    from the parent across fork+exec, so a child of a big parent would read the parent's peak."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            return int(f.read().split("VmHWM:")[1].split()[0])
    except (OSError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def memory(K: int, L: int, ckpt: bool, threads: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--memory-child", f"{K},{L},{int(ckpt)}", "--batch", str(BATCH)],
                         check=True,
                         capture_output=True, text=True, env={**os.environ, "BENCH_THREADS": str(threads)})
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def print_memory(threads: int) -> None:
    for K, L in [(1, 4)]:  # where it matters: 4 loops of activations vs 1
        plain, ck = memory(K, L, False, threads), memory(K, L, True, threads)
        print(f"peak memory of a training step ({K} x {L}) batch {BATCH}: {plain:.0f} MiB, "
              f"with checkpoint_loops {ck:.0f} MiB")


def profile_step(K: int, L: int, precision: str, B: int, rows: int = 15) -> None:
    from torch.profiler import ProfilerActivity, profile

    tr = trainer(K, L, precision, B)
    tr.train_step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        tr.train_step()
    print(f"\n== profile: ({K} x {L}) {precision} batch {B}, one training step ==")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2, help="timed training steps per config (after one warm-up)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--sample-puzzles", type=int, default=64)
    ap.add_argument("--batch", type=int, default=256, help="training batch (256 is the reference; smaller: smoke run)")
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler top ops")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--memory-only", action="store_true", help="only the peak-memory comparison")
    ap.add_argument("--use-cache", action="store_true",
                    help="let auto read its cached choice (default: measure afresh, in this run's conditions)")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    global BATCH
    a = parse_args()
    if not a.use_cache:  # auto_vs_best judges the measurement itself, not one made earlier on a busier machine
        os.environ["RMDM_CACHE_DIR"] = tempfile.mkdtemp(prefix="rmdm-bench-")
    BATCH = a.batch
    if a.memory_child:
        K, L, ck = (int(x) for x in a.memory_child.split(","))
        return memory_child(K, L, bool(ck))
    torch.set_num_threads(a.threads)
    if a.memory_only:
        return print_memory(a.threads)
    native = cpu_bf16_native()
    print(f"machine: {machine_summary()}")
    print(f"{a.threads} threads, batch {BATCH}" + ("" if BATCH == 256 else " (not the reference 256: a smoke run)"))
    print("targets this machine can show: fp32_vs_peak >= 0.60, vs_baseline >= 1.25, auto_vs_best >= 0.95, "
          "data_vs_step <= 0.05, sample_vs_train >= 0.67" + (
              ", bf16_vs_fp32 >= 3 and bf16_vs_peak >= 0.50 (bf16_vs_fp32 >= 3 needs AMX: see the bf16 peak below)"
              if native else "; not the bf16 targets (no bf16 units: bf16 is emulated, auto never picks it)"))
    m = measure(a, native)
    r = ratios(m)
    print_ratios(m, r)
    smp = sample_speed(m["auto_row"]["precision"], 1, a.sample_puzzles, attention=m["auto_row"]["attention"])
    r["sample_vs_train"] = smp["gflops"] / m["auto_row"]["gflops"]
    print(f"sampling {smp['model']} T={smp['T']} L_s={smp['L_s']} batch {smp['puzzles']}: "
          f"{smp['puzzles_per_s']:.1f} puzzles/s, {smp['gflops']:.1f} GFLOP/s, {r['sample_vs_train']:.2f} of "
          f"training's (target >= 0.67: within 1.5x)")
    if not a.no_memory:
        print_memory(a.threads)
    if a.profile:
        profile_step(4, 1, "float32", BATCH)
        if native:
            profile_step(4, 1, "bf16", BATCH)
    print(" ".join(f"{k}={r[k]:.3f}" for k in ("fp32_vs_peak", "bf16_vs_fp32", "bf16_vs_peak", "vs_baseline",
                                                "auto_vs_best", "data_vs_step", "sample_vs_train"))
          + f" sample_puzzles_per_s={smp['puzzles_per_s']:.2f}")


def measure(a: argparse.Namespace, native: bool) -> dict:
    """Every timing of the run: the matmul peaks (measured before and after the runs; the best of both is
    the one peak every ratio uses), each path at (4 x 1), the other shapes, auto's choice, the baseline, data."""
    peak32 = matmul_peak(torch.float32)
    peak16 = matmul_peak(torch.bfloat16) if native else float("nan")
    print(f"matmul peak, first measurement: float32 {peak32:.1f} GFLOP/s, bf16 {peak16:.1f} GFLOP/s "
          "(measured again after the runs; the ratio is printed once, from the best of both)")
    # every path at the (4 x 1) shape, then the other shapes on float32 sdpa
    precs = ["float32", "bf16"] if native else ["float32"]
    paths = [train_speed(4, 1, p, a.reps, attention=att) for p in precs for att in ATTENTIONS]
    rows = paths + [train_speed(K, L, "float32", a.reps) for K, L in SHAPES[1:]]
    auto = auto_choice(4, 1, BATCH)
    auto_row = next(r for r in paths if (r["attention"], r["precision"]) == (auto["attention"], auto["precision"]))
    print(f"\nauto picks attention {auto['attention']}, precision {auto['precision']} ({auto['how']}, "
          f"{auto['choose_s']:.1f} s)" + (f"; its measured step seconds {auto['times']}" if auto["times"] else ""))
    base = [baseline_speed(p, a.reps) for p in precs]
    # both peaks again after the long runs, the best the machine gave: every ratio below uses these two
    peak32 = max(peak32, matmul_peak(torch.float32))
    peak16 = max(peak16, matmul_peak(torch.bfloat16)) if native else peak16
    print(f"\nmatmul peak, best of two measurements: float32 {peak32:.1f} GFLOP/s, bf16 {peak16:.1f} GFLOP/s "
          f"(bf16 peak = {peak16 / peak32:.2f}x float32's: the one ratio of the two peaks this run uses)")
    step_data = data_time(BATCH)
    print("\nshape              attention precision  batch  step_s  tokens/s  GFLOP/s  vs fp32 peak")
    for r in rows:
        print(f"{r['shape']:<18} {r['attention']:<9} {r['precision']:<10} {r['batch']:>5} {r['step_s']:7.2f} "
              f"{r['tokens_per_s']:9.0f} {r['gflops']:8.1f}  {r['gflops'] / peak32:5.2f}")
    for b in base:
        print(f"{b['shape']:<18} {'sdpa':<9} {b['precision']:<10} {b['batch']:>5} {b['step_s']:7.2f} "
              f"{b['tokens_per_s']:9.0f}")
    return {"peak32": peak32, "peak16": peak16, "paths": paths, "rows": rows, "auto_row": auto_row, "base": base,
            "step_data": step_data}


def ratios(m: dict) -> dict:
    """The run's figures of merit, each a ratio of two of its own measurements."""
    paths, rows = m["paths"], m["rows"]
    best = min(paths, key=lambda r: r["step_s"])
    best32 = min((r for r in paths if r["precision"] == "float32"), key=lambda r: r["step_s"])
    bf16 = [r for r in paths if r["precision"] == "bf16"]
    theirs = min(m["base"], key=lambda r: r["step_s"])
    return {"fp32_vs_peak": max(r["gflops"] for r in rows if r["precision"] == "float32") / m["peak32"],
            "bf16_vs_fp32": best32["step_s"] / min(r["step_s"] for r in bf16) if bf16 else float("nan"),
            "bf16_vs_peak": max(r["gflops"] for r in bf16) / m["peak16"] if bf16 else float("nan"),
            "vs_baseline": theirs["step_s"] / m["auto_row"]["step_s"],
            "auto_vs_best": best["step_s"] / m["auto_row"]["step_s"],
            "data_vs_step": m["step_data"] / best["step_s"], "best": best, "theirs": theirs}


def print_ratios(m: dict, r: dict) -> None:
    auto_row, best, theirs = m["auto_row"], r["best"], r["theirs"]
    print(f"\nfloat32 training: best {r['fp32_vs_peak']:.2f} of the float32 matmul peak (target >= 0.60)")
    if any(x["precision"] == "bf16" for x in m["paths"]):
        # the peaks' ratio is said once (the "best of two" line above): a step-speed ratio is not a peak's
        print(f"bf16 / float32 step speed at (4 x 1): {r['bf16_vs_fp32']:.2f}x (target >= 3 where AMX); best bf16 "
              f"path at {r['bf16_vs_peak']:.2f} of the bf16 matmul peak (target >= 0.50)")
    print(f"auto ({auto_row['attention']}, {auto_row['precision']}) vs the best path measured here "
          f"({best['attention']}, {best['precision']}): {r['auto_vs_best']:.2f} (target >= 0.95)")
    print(f"(4 x 1) auto vs nn.TransformerEncoderLayer baseline ({theirs['precision']}): "
          f"{r['vs_baseline']:.2f}x (target >= 1.25)")
    print(f"data: a Sudoku batch of {BATCH} takes {m['step_data'] * 1e3:.1f} ms, {r['data_vs_step']:.3f} of the best "
          f"step (target <= 0.05)")


if __name__ == "__main__":
    main()
