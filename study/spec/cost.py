"""What a grid will cost, before anything runs: `study plan`'s FLOPs, time and memory per run.

- Training FLOPs: the model's own count (`model.costs.train_flops_total`: forward + backward over
  the run's steps at the depth its schedule gives each step).
- Evaluation FLOPs: every evaluation point at T steps of L_s loops per example
  (`model.costs.inference_flops_per_sample`), an upper bound: the sampler stops once nothing is
  masked and adaptive depth stops looping once settled. A likelihood task (Text8) calls the model
  once per noise level per sequence, plus the few unconditional samples `study.engine.evaluate` draws.
- Time: FLOPs / a rate, either the user's (`--flops-per-s`, or `--mfu` x a device's bf16 peak) or
  one measured here (`--measure`): a few timed training steps (after a warm-up) of each distinct
  shape in a child process, with the trial's own trainer, device and threads, cached per machine
  and shape in the user's cache directory (`throughput.json` beside model.precision's cache).
- Memory: the peak of a training step, estimated (`model.costs.train_step_memory`) or, with
  `--measure`, measured: torch.cuda.max_memory_allocated on a GPU (after the warm-up steps); on a
  CPU the child's peak resident memory during the timed steps (VmHWM, reset after the warm-up)
  above its resident memory before them, plus the weight, gradient and AdamW tensors it already
  held: the step's own memory, without the framework's one-off buffers (tens of MiB on a CPU).
"""
from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import time
from typing import Callable

from model.config import ModelConfig, TrainConfig
from model.costs import (BF16_PEAK_TFLOPS, flops_per_forward, inference_flops_per_sample, train_flops_per_step,
                         train_step_memory)
from study.spec.grid import Run, config_hash
from study.spec.sections import N_GENERATE
from tasks import TASKS, make_task

# dense bf16 tensor-core peaks, FLOP/s (vendor data sheets, without sparsity)
PEAK_FLOPS = {key: tflops * 1e12 for key, _, tflops in BF16_PEAK_TFLOPS}  # --device NAME
CACHE_VERSION = 1
WARMUP_STEPS, TIMED_STEPS = 2, 3


# ---- what the task gives the sampler -----------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def _task_facts(task_name: str, task_json: str) -> dict:
    """seq_len, vocab, the range (fewest, most) of free (masked) positions of an example, and for a
    likelihood task its noise levels per sequence: what the task declares."""
    task = make_task(TASKS[task_name][0].model_validate_json(task_json))
    likelihood = task.eval_mode == "likelihood"
    return {"seq_len": len(task.pos_ids()), "vocab": task.vocab_size, "free": tuple(task.free_positions()),
            "likelihood": likelihood, "n_t": len(task.t_values()) if likelihood else None, "what": task.describe()}


def facts(run: Run) -> dict:
    return _task_facts(run.task.name, run.task.model_dump_json())


# ---- FLOPs ------------------------------------------------------------------------------------
def eval_examples(run: Run, n_examples: int) -> int:
    """Examples an evaluation point reads: its n_examples, at most the split's size (the task's config)."""
    size = run.task.split_size(run.eval.split)
    return min(n_examples, size) if size else n_examples


def eval_flops(run: Run) -> int:
    """Upper bound of the FLOPs of every evaluation point of `run` (see the module docstring)."""
    f = facts(run)
    N, V, total = f["seq_len"], f["vocab"], 0
    for pt in run.eval_points():
        n = eval_examples(run, pt.n_examples)
        per = inference_flops_per_sample(run.model, N, V, pt.T, pt.L_s, adaptive=pt.adaptive is not None)
        if f["likelihood"]:
            # one model call of L_s loops per noise level and sequence
            total += n * f["n_t"] * flops_per_forward(run.model, N, V, pt.L_s, heads=1)
            total += min(run.eval.n_samples_kept, N_GENERATE, n) * per
        else:
            total += n * per
    return total


def t_warnings(runs: list[Run], grid_path: str) -> list[str]:
    """One line per task config whose eval T exceed its free positions: the sampler then stops after
    as many steps as there are free positions, spending fewer forward passes than T x L_s."""
    seen: dict[tuple, tuple[set, set]] = {}  # (task, fewest, most free) -> (T values, run ids)
    for r in runs:
        f = facts(r)
        lo, hi = f["free"]
        over = {T for T in r.eval.T if T > lo}
        if over:
            Ts, ids = seen.setdefault((f["what"], lo, hi), (set(), set()))
            Ts.update(over)
            ids.add(r.run_id)
    out = []
    for (what, lo, hi), (Ts, ids) in seen.items():
        free = f"{lo}" if lo == hi else f"{lo} to {hi}"
        who = "every example" if min(Ts) > hi else "an example with fewer free positions than T"
        Tl = ", ".join(str(T) for T in sorted(Ts))
        out.append(f"warning: {grid_path}: eval T={Tl} exceed{'s' if len(Ts) == 1 else ''} the {free} free (masked) "
                   f"positions of {what} ({len(ids)} run{'s' if len(ids) != 1 else ''}): the sampler stops once "
                   f"nothing is masked, so {who} runs fewer steps than T and fewer forward passes than T x L_s; "
                   f"the plan's eval FLOPs count T (an upper bound)")
    return out


# ---- rates ------------------------------------------------------------------------------------
def given_rate(flops_per_s: float | None, mfu: float | None, device: str | None,
               peak_flops: float | None) -> tuple[float, str] | None:
    """(FLOP/s, where it comes from) for the target hardware, or None. ValueError on a bad combination."""
    if flops_per_s is not None and (mfu is not None or device or peak_flops is not None):
        raise ValueError("give either --flops-per-s or --mfu with --device/--peak-flops, not both")
    if device and peak_flops is not None:
        raise ValueError("give either --device or --peak-flops, not both")
    if flops_per_s is not None:
        if not 0 < flops_per_s < math.inf:
            raise ValueError(f"--flops-per-s must be > 0 and finite (got {flops_per_s})")
        return flops_per_s, f"--flops-per-s {flops_per_s:.3g}"
    if mfu is None:
        if device or peak_flops is not None:
            raise ValueError("--device / --peak-flops need --mfu (the fraction of the peak a run reaches, e.g. 0.4)")
        return None
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu must be in (0, 1] (got {mfu})")
    if device:
        key = device.lower()
        if key not in PEAK_FLOPS:
            raise ValueError(f"--device {device}: unknown; known devices: {', '.join(sorted(PEAK_FLOPS))} "
                             f"(or give --peak-flops)")
        peak, name = PEAK_FLOPS[key], f"{key} bf16 dense peak"
    elif peak_flops is not None:
        if not 0 < peak_flops < math.inf:
            raise ValueError(f"--peak-flops must be > 0 and finite (got {peak_flops})")
        peak, name = peak_flops, "--peak-flops"
    else:
        raise ValueError("--mfu needs a peak: --device NAME or --peak-flops FLOP/s")
    rate = mfu * peak
    return rate, f"--mfu {mfu:g} x {peak:.3g} FLOP/s ({name}) = {rate:.3g} FLOP/s"


# ---- measurement ------------------------------------------------------------------------------
def cache_path() -> str:
    from model.precision import cache_path as paths_cache  # the user's cache directory, one rule

    return os.path.join(os.path.dirname(paths_cache()), "throughput.json")


def shape_of(run: Run) -> dict:
    """Everything a training step's speed and memory depend on (what the child process rebuilds)."""
    import torch

    from model.precision import machine_key

    f = facts(run)
    device = "cuda" if run.resources.gpu > 0 and torch.cuda.is_available() else "cpu"
    threads = max(1, int(run.resources.cpu))
    machine = machine_key(torch.device(device)) + (f"|{threads} trial threads" if device == "cpu" else "")
    pt_n = max((eval_examples(run, p.n_examples) for p in run.eval_points()), default=1)
    train = run.train.model_dump(include={"batch_size", "loss", "loss_weights", "truncate_k", "precision", "grad_clip"})
    from model.precision import MEASURE_MIN_FLOPS  # here: `study plan` without --measure needs no torch

    # whether the trainer measures the fastest attention/precision path or takes the rule (model.precision)
    paths_measured = run.train_flops() >= MEASURE_MIN_FLOPS
    return {"v": CACHE_VERSION, "machine": machine, "device": device, "threads": threads,
            "task": {"name": run.task.name, "json": run.task.model_dump_json()},
            "model": run.model.model_dump(), "train": train, "seq_len": f["seq_len"], "vocab": f["vocab"],
            "eval_batch": min(pt_n, 256), "paths_measured": paths_measured}  # eval_batch: sample_all's


def measure(runs: list[Run], echo: Callable[[str], None] = lambda s: None, refresh: bool = False) -> dict[str, dict]:
    """run_id -> {"train", "eval" (FLOP/s), "memory" (bytes), "memory_how", "cached"}; one child process
    per distinct shape not yet in the cache (or every shape with `refresh`)."""
    from atomicio import read_versioned_json, write_text

    path = cache_path()
    cache = read_versioned_json(path, CACHE_VERSION).get("shapes")
    cache = cache if isinstance(cache, dict) else {}
    by_key: dict[str, dict] = {}
    out = {}
    for r in runs:
        shape = shape_of(r)
        key = config_hash(shape)
        if key not in by_key:
            if key in cache and not refresh:
                by_key[key] = {**cache[key], "cached": True}
            else:
                echo(f"measuring {r.model.K}x{r.model.L} d{r.model.d_model} batch {r.train.batch_size} "
                     f"({shape['device']}, {shape['threads']} threads) ...")
                got = _measure_child(shape)
                cache[key] = {**got, "shape": shape}
                write_text(path, json.dumps({"version": CACHE_VERSION, "shapes": cache}, indent=1, sort_keys=True))
                by_key[key] = {**cache[key], "cached": False}
        out[r.run_id] = by_key[key]
    return out


def _measure_child(shape: dict) -> dict:
    """Runs `_child` in a fresh interpreter (its own memory high-water mark, its own CUDA context), in the
    directory that holds the project's packages: `python -c` puts its working directory first on sys.path,
    where a folder named like a package (a results folder `store`) would shadow it."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
           # glibc: a fixed mmap threshold (else it grows after the first free) returns every large block
           # to the system when freed, so the warmed-up resident memory holds no step's activations
           "MALLOC_MMAP_THRESHOLD_": "131072"}
    p = subprocess.run([sys.executable, "-c", "from study.spec.cost import _child; _child()"], input=json.dumps(shape),
                       capture_output=True, text=True, env=env, cwd=root)
    if p.returncode != 0:
        tail = " ".join(p.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"measuring a training step failed (exit {p.returncode}): {tail}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def _child() -> None:
    """Measure one shape (read as JSON from stdin), print the result as one JSON line."""
    import torch

    from model.precision import MEASURE_MIN_FLOPS, autocast
    from model.rmdm import SeqSpec
    from model.train import Trainer

    shape = json.loads(sys.stdin.read())
    device = torch.device(shape["device"])
    if device.type == "cpu":
        torch.set_num_threads(shape["threads"])  # as the trial sets them (study.engine.trial.execute)
    task = make_task(TASKS[shape["task"]["name"]][0].model_validate_json(shape["task"]["json"]))
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    model_cfg = ModelConfig.model_validate(shape["model"])
    N, V = spec.seq_len, spec.vocab_size
    # every step at the full depth L: the rate of the deepest step (a schedule's shallower steps
    # cost fewer FLOPs at about the same rate), and the memory a GPU must hold
    # steps: a total above (or below) the threshold at which the trainer measures its fastest path
    steps = WARMUP_STEPS + TIMED_STEPS
    probe = TrainConfig.model_validate({**shape["train"], "steps": steps})
    if shape["paths_measured"]:
        steps = max(steps, int(MEASURE_MIN_FLOPS // train_flops_per_step(model_cfg, probe, N, V, recompute=False)) + 1)
    train_cfg = TrainConfig.model_validate({**shape["train"], "schedule": "fixed", "steps": steps})
    B = train_cfg.batch_size

    def batch(step: int, g: torch.Generator):  # random tokens of the run's shape: the FLOPs do not care
        return torch.randint(0, V, (B, N), generator=g), torch.rand(B, N, generator=g) < 0.3

    trainer = Trainer(model_cfg, train_cfg, spec, batch, device)
    for _ in range(WARMUP_STEPS):  # also the framework's first-use allocations, not the step's own
        trainer.train_step()
    # the step's memory that lasts: weights, gradients and optimizer state (resident already)
    kept = sum(t.numel() * t.element_size() for p in trainer.model.parameters()
               for t in (p, p.grad) if t is not None)
    kept += sum(t.numel() * t.element_size() for st in trainer.opt.state.values()
                for t in st.values() if torch.is_tensor(t))
    rss0 = _status_kb("VmRSS") if device.type == "cpu" else 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM: the peak from here on is the steps' (and everything kept)
        except OSError:
            pass  # then VmHWM since start: the path measurement may have raised it (an upper bound)
    t0 = time.perf_counter()
    for _ in range(TIMED_STEPS):
        trainer.train_step()  # syncs (reads the loss) every step
    step_s = (time.perf_counter() - t0) / TIMED_STEPS
    if device.type == "cuda":
        memory, how = int(torch.cuda.max_memory_allocated(device)), "measured: torch.cuda.max_memory_allocated"
    else:
        memory = (_status_kb("VmHWM") - rss0) * 1024 + kept
        how = "measured: peak resident memory (VmHWM) of the steps above the warmed-up process, + weights, grads, AdamW"
    flops = train_flops_per_step(model_cfg, train_cfg, N, V, recompute=False)

    model = trainer.model.eval()
    Be = shape["eval_batch"]
    x = torch.randint(0, V, (Be, N), device=device)
    with torch.no_grad(), autocast(device, trainer.precision):
        model(x, n_loops=model_cfg.L, all_logits=False)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(TIMED_STEPS):
            model(x, n_loops=model_cfg.L, all_logits=False)[-1].float().sum().item()
        fwd_s = (time.perf_counter() - t0) / TIMED_STEPS
    eval_flops = Be * flops_per_forward(model_cfg, N, V, model_cfg.L, heads=1)
    print(json.dumps({"train": flops / step_s, "eval": eval_flops / fwd_s, "step_seconds": step_s,
                      "memory": memory, "memory_how": how, "attention": trainer.attention,
                      "precision": trainer.precision}))


# ---- the plan ---------------------------------------------------------------------------------
def run_costs(run: Run) -> dict:
    """Per-run FLOPs and estimated step memory (no rate)."""
    f = facts(run)
    mem = train_step_memory(run.model, run.train, f["seq_len"], f["vocab"], run.costs()["n_params"])
    return {"train_flops": run.train_flops(), "eval_flops": eval_flops(run), "memory_bytes": mem["total"],
            "memory_how": "estimate"}


def with_time(row: dict, train_rate: float | None, eval_rate: float | None) -> dict:
    if train_rate is None:
        return {**row, "train_seconds": None, "eval_seconds": None, "seconds": None}
    ts, es = row["train_flops"] / train_rate, row["eval_flops"] / eval_rate
    return {**row, "train_seconds": ts, "eval_seconds": es, "seconds": ts + es}


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"
