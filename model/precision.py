"""Numeric precision and attention implementation: what this machine can do, and the fastest choice.

`precision` is `float32`, `bf16` (autocast) or `auto`; `attention` is `sdpa`
(torch's fused scaled_dot_product_attention), `math` (q k^T, softmax, times v, written out) or
`auto`. Which path is fastest depends on the machine: on an Intel Xeon with AMX, bf16 autocast with
`math` attention trains 2.5x faster than the best float32 path, while the fused CPU attention
kernel gains nothing from bf16; on a CPU without bf16 units bf16 is emulated and many times slower
than float32. So `auto`:

- CUDA: bf16 autocast and SDPA (flash / memory-efficient kernels); a rule, no measurement.
- CPU: times the real training step (forward, backward, AdamW) of every candidate path at the
  run's shape, at a reduced batch, and keeps the fastest. bf16 is a candidate only where the CPU
  multiplies bf16 in hardware (AMX or AVX512-BF16). The choice is cached per machine and shape in
  a JSON file under the user's cache directory ($RMDM_CACHE_DIR, else $XDG_CACHE_HOME/rmdm, else
  ~/.cache/rmdm), so it is measured once. Runs too small for the choice to repay a measurement
  (under `MEASURE_MIN_FLOPS` of training in all) take float32 with SDPA by rule.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import time
from typing import Callable

import torch

from atomicio import read_versioned_json, write_text

ATTENTIONS = ("sdpa", "math")
PRECISIONS = ("float32", "bf16")
# a whole run under this many training FLOPs (about 30 s of float32 on two cores) is not worth
# the few seconds a measurement costs; it takes the rule (float32, sdpa)
MEASURE_MIN_FLOPS = 3e12
CACHE_VERSION = 1
# a measurement is one warm-up and one timed step per path, a second timed round while under this
MEASURE_BUDGET_S = 3.0


def autocast(device: torch.device, precision: str):
    """bf16 autocast or nothing. `precision` must already be resolved (not `auto`)."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision != "float32":
        raise ValueError(f"precision {precision!r} must be resolved to one of {PRECISIONS} before use")
    return contextlib.nullcontext()


# ---- what the CPU has ------------------------------------------------------------------------
@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key.strip() == "model name" and not model:
            model = val.strip()
        elif key.strip() == "flags" and not flags:
            flags = frozenset(val.split())
    return model or platform.processor() or platform.machine(), flags


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX or AVX512-BF16).

    Without it (e.g. AVX2-only CPUs) oneDNN emulates bf16 matmuls, many times slower than float32.
    """
    return bool({"avx512_bf16", "amx_bf16"} & _cpuinfo()[1])


def machine_summary() -> str:
    """One line: CPU model, the flags that decide the fastest path, torch's CPU capability."""
    model, have = _cpuinfo()
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in have]
    return (f"{model}; flags {' '.join(flags) or 'none of avx2/avx512/amx'}; "
            f"torch {torch.__version__} capability {torch.backends.cpu.get_cpu_capability()}, "
            f"{torch.get_num_threads()} threads; native bf16: {cpu_bf16_native()} "
            f"(AMX: {'amx_bf16' in have})")


# ---- the choice --------------------------------------------------------------------------------
def candidates(device: torch.device, attention: str, precision: str,
               bf16_native: bool | None = None) -> list[tuple[str, str]]:
    """(attention, precision) pairs `auto` chooses among, fixed values kept as given."""
    if attention not in (*ATTENTIONS, "auto") or precision not in (*PRECISIONS, "auto"):
        raise ValueError(f"attention must be one of {(*ATTENTIONS, 'auto')} and precision one of "
                         f"{(*PRECISIONS, 'auto')} (got {attention!r}, {precision!r})")
    if device.type == "cuda":  # tensor cores want bf16; SDPA dispatches to flash / efficient kernels
        atts = ["sdpa"] if attention == "auto" else [attention]
        precs = ["bf16"] if precision == "auto" else [precision]
    else:
        native = cpu_bf16_native() if bf16_native is None else bf16_native
        atts = list(ATTENTIONS) if attention == "auto" else [attention]
        precs = (["float32", "bf16"] if native else ["float32"]) if precision == "auto" else [precision]
    return [(a, p) for p in precs for a in atts]


def machine_key(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda|{torch.cuda.get_device_name(device)}|torch {torch.__version__}"
    model, flags = _cpuinfo()
    return (f"cpu|{model}|{torch.backends.cpu.get_cpu_capability()}|bf16 {cpu_bf16_native()}|"
            f"amx {'amx_bf16' in flags}|{torch.get_num_threads()} threads|torch {torch.__version__}")


def cache_path() -> str:
    root = os.environ.get("RMDM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rmdm")
    return os.path.join(root, "fastest_paths.json")


def choose(device: torch.device, attention: str, precision: str, shape: dict,
           measure: Callable[[str, str], float] | None, total_flops: float | None = None,
           bf16_native: bool | None = None) -> dict:
    """Resolve `auto`: returns {"attention", "precision", "how", "times"}.

    `shape` identifies the training step (width, heads, depth, sequence, batch, ...);
    `measure(attention, precision)` returns the seconds of one real training step on that path.
    `how` is `fixed` (nothing to choose), `rule`, `cached` or `measured`.
    """
    cands = candidates(device, attention, precision, bf16_native)
    if len(cands) == 1:
        return {"attention": cands[0][0], "precision": cands[0][1], "how": "fixed", "times": None}
    if measure is None or (total_flops is not None and total_flops < MEASURE_MIN_FLOPS):
        att, prec = ("sdpa", "float32") if ("sdpa", "float32") in cands else cands[0]
        return {"attention": att, "precision": prec, "how": "rule", "times": None}
    key = json.dumps({"machine": machine_key(device), "shape": shape,
                      "candidates": [list(c) for c in cands]}, sort_keys=True)
    path = cache_path()
    hit = read_versioned_json(path, CACHE_VERSION).get("entries", {}).get(key)
    if hit and (hit.get("attention"), hit.get("precision")) in cands:
        return {"attention": hit["attention"], "precision": hit["precision"], "how": "cached", "times": hit.get("times")}
    times = _measure_all(cands, measure)
    att, prec = min(cands, key=lambda c: times[f"{c[0]}/{c[1]}"])
    # re-read: another run may have added one
    data = read_versioned_json(path, CACHE_VERSION) or {"version": CACHE_VERSION, "entries": {}}
    data.setdefault("entries", {})[key] = {"attention": att, "precision": prec, "times": times,
                                           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        write_text(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only home: the choice still holds for this run, it is just measured again next time
    return {"attention": att, "precision": prec, "how": "measured", "times": times}


def _measure_all(cands: list[tuple[str, str]], measure: Callable[[str, str], float]) -> dict:
    """Best of up to two steps per path after one warm-up each, the paths interleaved so that a busy
    neighbour slows them all alike; the second round only while within MEASURE_BUDGET_S. A path
    whose step raises (a kernel this build or device lacks) is timed as inf, unless all do."""
    t_end = time.perf_counter() + MEASURE_BUDGET_S
    best = {c: float("inf") for c in cands}
    ok, error = [], None
    for c in cands:
        try:
            measure(*c)
            ok.append(c)
        except Exception as e:  # noqa: BLE001 -- any failure rules the path out; the run uses another
            error = e
    if not ok:
        raise RuntimeError(f"every attention/precision path failed its measurement step: {error}") from error
    for r in range(2):
        if r > 0 and time.perf_counter() > t_end:
            break
        for c in ok:
            best[c] = min(best[c], measure(*c))
    return {f"{a}/{p}": t for (a, p), t in best.items()}
