"""`study eval RUN_ID --puzzles FILE`: solve the examples of an external file (Sudoku puzzles, or
whatever the run's task reads: `Task.read_inputs`) with a trained run's final weights, write `evals`
and `samples` rows beside the run's own, and optionally the completed examples in the input's order
and format (`Task.format_outputs`).
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time

import torch

from model import ModelConfig, RecursiveDenoiser, SeqSpec
from model.sampler import sample_all
from model.train import CheckpointError, load_state
from store import Store, list_studies
from stats import mean_ci_from_sd, wilson
from study.trial import now, sample_rows
from tasks import TASKS, EvalSet, make_task


class EvalError(ValueError):
    """`study eval` cannot run: unknown run, wrong task, bad file (message says which)."""


def find_run(results: str, run_id: str, study: str | None = None) -> Store:
    """The study that holds final weights of `run_id`."""
    studies = [study] if study else [s for s, _ in list_studies(results)]
    if study is None and os.path.isdir(results):  # also studies whose runs table is not written yet
        studies = sorted(set(studies) | {d for d in os.listdir(results) if os.path.isdir(os.path.join(results, d))})
    found = []
    for s in studies:
        try:
            st = Store(results, s)
            if st.exists(st.weights_path(run_id)):
                found.append(st)
        except ValueError:
            continue
    if not found:
        where = f"study {study!r}" if study else f"any study under {results}"
        raise EvalError(f"no final weights of run {run_id!r} in {where} (is the run trained? see `study status`)")
    if len(found) > 1:
        raise EvalError(f"run {run_id!r} has weights in several studies ({', '.join(s.study for s in found)}): "
                        f"pick one with --study")
    return found[0]


def load_run_model(store: Store, run_id: str, device: str | torch.device = "cpu"):
    """(resolved config, task, model) of a trained run, from its stored config and final weights."""
    cpath = store.path("configs", f"{run_id}.json")
    raw = store.read_bytes(cpath)
    if raw is None:
        why = store.unreadable.get(cpath, "missing")
        raise EvalError(f"{cpath}: no stored config of run {run_id!r} ({why}); `study run` on its grid rewrites it")
    try:
        cfg = json.loads(raw)
        if not isinstance(cfg, dict) or not isinstance(cfg.get("task"), dict) or "model" not in cfg:
            raise ValueError("not a run's config (no task or model)")
    except ValueError as e:
        raise EvalError(f"{cpath}: the stored config of run {run_id!r} is damaged ({str(e)[:100]}); "
                        f"`study run` on its grid rewrites it") from None
    name = cfg["task"]["name"]
    if name not in TASKS:
        raise EvalError(f"run {run_id!r} is task {name!r}, unknown here; known tasks: {', '.join(sorted(TASKS))}")
    task = make_task(TASKS[name][0].model_validate(cfg["task"]))
    model_cfg = ModelConfig.model_validate(cfg["model"])
    model = RecursiveDenoiser(model_cfg, SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())).to(device)
    try:
        sd = load_state(io.BytesIO(store.read_bytes(store.weights_path(run_id))), device, store.weights_path(run_id))
    except CheckpointError as e:
        raise EvalError(str(e)) from None
    model.load_state_dict(sd["model"])
    return cfg, task, model


CHUNK = 4096  # puzzles read, sampled and scored at a time: memory stays bounded whatever the file's size
BATCH = 256  # the sampler's batch; CHUNK is a multiple of it, so chunking never changes an output
SAMPLES_KEPT = 1000  # puzzles whose text the samples table keeps by default: the file's first (--out holds all)


def evaluate_puzzles(run_id: str, puzzles: str, results: str = "results", study: str | None = None,
                     T: int | None = None, L_s: int | None = None, out: str | None = None,
                     sampler: str = "confidence", seed: int = 0, n_samples_kept: int | None = SAMPLES_KEPT,
                     device: str | None = None, chunk: int = CHUNK) -> dict:
    """Solve the examples (Sudoku puzzles) of `puzzles` with run `run_id`; write evals + samples rows (and `out`).

    The file is read, sampled and scored `chunk` puzzles at a time (a multiple of the sampler's batch of
    256: the outputs are those of sampling the whole file at once), so memory does not grow with the
    file: the metrics are running sums, `out` is written as the chunks come (to a temp file renamed at
    the end). The samples table holds a row per puzzle (its scores and cost: `study verify` derives the
    evals rows from them), with the text of the first `n_samples_kept` puzzles (None: of all of them).
    Nothing is written to the store until every puzzle is scored; `out` is checked before any work.

    T defaults to the largest T of the run's grid, L_s to its training depth. Returns a summary:
    eval_key, n, metrics {name: (value, ci_low, ci_high)}, out."""
    if chunk < 1 or chunk % BATCH:
        raise ValueError(f"chunk must be a positive multiple of {BATCH} (got {chunk})")
    tmp = _open_out(out) if out else None
    try:
        store = find_run(results, run_id, study)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        cfg, task, model = load_run_model(store, run_id, dev)
        if task.eval_mode != "sample":
            raise EvalError(f"run {run_id!r} is task {task.name!r}, scored by its likelihood, not by sampling: "
                            f"`study eval` solves input files of sample-and-score tasks")
        T = T or max(cfg.get("eval", {}).get("T") or [task.free_positions()[1]])
        L_s = L_s or model.cfg.L
        if T < 1 or L_s < 1:
            raise EvalError(f"T and L_s must be >= 1 (got T={T}, L_s={L_s})")
        for _ in task.read_inputs(puzzles, chunk):  # every line checked before the first is sampled
            pass
        # keyed by the file's content, not its name: one file under two names is one evaluation point
        key = f"ext-{_file_digest(puzzles)}-T{T}-Ls{L_s}-{sampler}-s{seed}"

        metrics, acc, cost, samples, secs = None, {}, _Cost(), [], 0.0
        for pf in task.read_inputs(puzzles, chunk):
            x, cond = pf.x, pf.cond
            t0 = time.perf_counter()
            # seeded by the index of the chunk's first puzzle: sample_all seeds batch i `seed + i`
            got = sample_all(model, x, cond, T=T, L_s=L_s, unmask=sampler, seed=seed + pf.start, batch_size=BATCH)
            secs += time.perf_counter() - t0
            cost.add(got)
            output = got.x
            has_ref = pf.reference is not None  # the whole file has solutions or none (one CSV header)
            ref = pf.reference if has_ref else x
            scores = task.score(output, EvalSet(ref, cond))
            metrics = metrics or (task.metric_names if has_ref else task.metrics_without_reference())
            for m in metrics:
                acc.setdefault(m, _Running()).add([s[m] for s in scores])
            keep = len(scores) if n_samples_kept is None else max(0, min(n_samples_kept - pf.start, len(scores)))
            # a row per puzzle (its scores and cost); the text of the first n_samples_kept only
            samples += sample_rows(run_id, key, T, L_s, task, x, cond, output, ref if has_ref else None,
                                   [{m: s[m] for m in metrics} for s in scores], got, keep, start=pf.start)
            if tmp:
                tmp[1].write(task.format_outputs(pf, output))

        n = acc[metrics[0]].n
        base = {"run_id": run_id, "eval_key": key, "T": T, "L_s": L_s, "sampler": sampler,
                "split": f"external:{os.path.basename(puzzles)}", "eval_seconds": secs, "created_at": now(),
                **cost.columns(model)}
        rows = [{**base, "n_examples": n, "metric": m, **acc[m].columns()} for m in metrics]
        if tmp:
            tmp[1].close()
        store.write_rows("samples", samples, run_id, f"{key}.parquet")
        store.write_rows("evals", rows, run_id, f"{key}.parquet")
        if tmp:
            os.replace(tmp[0], out)
            tmp = None
    finally:
        if tmp:  # an error before the end: no half-written --out is left behind
            tmp[1].close()
            os.unlink(tmp[0])
    summary = {r["metric"]: (r["value"], r["ci_low"], r["ci_high"]) for r in rows}
    return {"study": store.study, "eval_key": key, "n": n, "T": T, "L_s": L_s, "metrics": summary, "out": out}


def _open_out(out: str):
    """(temp path, open file) beside `out`: that `out` can be written is known before any work."""
    if os.path.isdir(out):
        raise EvalError(f"--out {out}: is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise EvalError(f"--out {out}: no such directory {parent}")
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        return tmp, open(tmp, "w", encoding="utf-8")
    except OSError as e:
        raise EvalError(f"--out {out}: cannot write there ({e.strerror or e})") from None


def _file_digest(path: str) -> str:
    """The first 16 hex digits of the file's SHA-256, read a block at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


class _Running:
    """One metric's per-puzzle scores so far, in constant memory: the value and 95% interval of
    study.trial.metric_rows (Wilson for 0/1 scores, else the normal interval), from running sums
    (the spread by Welford's update, exact to rounding)."""

    def __init__(self):
        self.n, self.total, self.binary, self.mean, self.m2 = 0, 0.0, True, 0.0, 0.0

    def add(self, values: list[float]) -> None:
        for v in values:
            self.n += 1
            self.total += v
            self.binary = self.binary and v in (0.0, 1.0)
            d = v - self.mean
            self.mean += d / self.n
            self.m2 += d * (v - self.mean)

    def columns(self) -> dict:
        if self.binary:
            lo, hi = wilson(self.total, self.n)
        else:
            lo, hi = mean_ci_from_sd(self.mean, math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0, self.n)
        return {"value": self.total / self.n, "ci_low": lo, "ci_high": hi}


class _Cost:
    """study.trial.sampling_cost over chunks: passes summed (and their most), head calls summed."""

    def __init__(self):
        self.n, self.passes, self.most, self.heads = 0, 0, 0, 0

    def add(self, got) -> None:
        self.n += len(got.steps)
        self.passes += int(got.passes.sum())
        self.most = max(self.most, got.forward_passes)
        self.heads += got.head_calls

    def columns(self, model: RecursiveDenoiser) -> dict:
        flops = model.flops_per_forward(self.passes, heads=self.heads) if self.passes else 0
        return {"forward_passes": self.most, "forward_passes_mean": self.passes / self.n if self.n else None,
                "eval_flops": flops}
