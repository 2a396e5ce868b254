"""`study eval RUN_ID --puzzles FILE`: solve the examples of an external file (Sudoku puzzles, or
whatever the run's task reads: `Task.read_inputs`) with a trained run's final weights, write `evals`
and `samples` rows beside the run's own, and optionally the completed examples in the input's order
and format (`Task.format_outputs`).
"""
from __future__ import annotations

import hashlib
import io
import os
from array import array

import torch

from atomicio import AtomicFile, loads_json
from model import ModelConfig, RecursiveDenoiser, SeqSpec
from model.train import CheckpointError, load_state
from store import Store, digest, list_studies
from study.engine.evaluate import EvalRow, Evaluation, evaluate, now, write
from study.engine.rows import column_rows, passes_cost
from study.engine.kinds.ext import key_of
from study.spec.grid import EvalPoint
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
    try:
        found[0].refuse_links_out()  # weights, configs, evals: never loaded through a link out of the store
    except OSError as e:
        raise EvalError(e.strerror or str(e)) from None
    return found[0]


def load_run_model(store: Store, run_id: str, device: str | torch.device = "cpu"):
    """(resolved config, task, model) of a trained run, from its stored config and final weights."""
    cpath = store.path("configs", f"{run_id}.json")
    raw = store.read_bytes(cpath)
    if raw is None:
        why = store.unreadable.get(cpath, "missing")
        raise EvalError(f"{cpath}: no stored config of run {run_id!r} ({why}); `study run` on its grid rewrites it")
    try:
        cfg = loads_json(raw)
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
    wpath = store.weights_path(run_id)
    data = store.read_bytes(wpath)
    if data is None:
        raise EvalError(f"{wpath}: no final weights of run {run_id!r} ({store.unreadable.get(wpath, 'missing')})")
    bad = digest.weights_mismatch(wpath, data, store.run_row(run_id))
    if bad:
        raise EvalError(f"{bad}; refused, not loaded: `study run` on its grid retrains the run")
    try:
        sd = load_state(io.BytesIO(data), device, wpath)
    except CheckpointError as e:
        raise EvalError(str(e)) from None
    model.load_state_dict(sd["model"])
    return cfg, task, model


CHUNK = 4096  # puzzles read, sampled and scored at a time: memory stays bounded whatever the file's size
# the sampler's batch (sample_all's default, which study.engine.evaluate uses); CHUNK is a multiple of it, so
# chunking never changes an output
BATCH = 256
SAMPLES_KEPT = 1000  # puzzles whose text the samples table keeps by default: the file's first (--out holds all)


def evaluate_puzzles(run_id: str, puzzles: str, results: str = "results", study: str | None = None,
                     T: int | None = None, L_s: int | None = None, out: str | None = None,
                     sampler: str = "confidence", seed: int = 0, n_samples_kept: int | None = SAMPLES_KEPT,
                     device: str | None = None, chunk: int = CHUNK) -> dict:
    """Solve the examples (Sudoku puzzles) of `puzzles` with run `run_id`; write evals + samples rows (and `out`).

    The file is read, sampled and scored `chunk` puzzles at a time (the outputs are those of sampling the whole
    file at once), so its text is never held whole: each puzzle's scores and passes are kept as a number each,
    `out` is written as the chunks come (to a temp file renamed at the end). The samples table holds a row per
    puzzle (its scores and cost: `study verify` derives the evals rows from them), with the text of the first
    `n_samples_kept` (None: all). Nothing is written to the store until every puzzle is scored; `out` is
    checked before any work. Returns a summary: eval_key, n, T, L_s, metrics {name: (value, low, high)}, out."""
    if chunk < 1 or chunk % BATCH:
        raise ValueError(f"chunk must be a positive multiple of {BATCH} (got {chunk})")
    dest = _open_out(out) if out else None
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
        key = key_of(_file_digest(puzzles), T, L_s, sampler, seed)

        split = f"external:{os.path.basename(puzzles)}"
        # how to sample: the sampler's defaults (argmax, no remasking); n_examples: the file's, read as it comes
        pt = EvalPoint(T=T, L_s=L_s, sampler=sampler, temperature=0.0, remask=0.0, n_examples=0, split=split,
                       seed=seed)
        metrics, acc, passes, heads, samples, secs = None, {}, array("q"), 0, [], 0.0
        for pf in task.read_inputs(puzzles, chunk):
            x, cond = pf.x, pf.cond
            has_ref = pf.reference is not None  # the whole file has solutions or none (one CSV header)
            metrics = metrics or (task.metric_names if has_ref else task.metrics_without_reference())
            keep = len(x) if n_samples_kept is None else max(0, min(n_samples_kept - pf.start, len(x)))
            # a row per puzzle (its scores and cost); the text of the first n_samples_kept only. Seeded by the
            # index of the chunk's first puzzle (`start`): sample_all seeds batch i `seed + i`
            e = evaluate(model, task, pt, EvalSet(pf.reference if has_ref else x, cond), run_id,
                         keep=keep, key=key, split=split, inputs=x, reference=has_ref, start=pf.start,
                         metrics=metrics, kind="ext")
            secs += e.seconds
            passes.extend(e.got.passes.tolist())
            heads += e.got.head_calls
            for m in metrics:
                acc.setdefault(m, array("d")).extend(s[m] for s in e.scores)
            samples += e.samples
            if dest:
                dest.write(task.format_outputs(pf, e.got.x))

        n = len(passes)
        base = {"run_id": run_id, "eval_key": key, "T": T, "L_s": L_s, "sampler": sampler, "split": split,
                "eval_seconds": secs, "created_at": now(), "kind": "ext", **passes_cost(model, passes, heads)}
        rows = [EvalRow(**r) for r in column_rows(acc, base, task)]
        write(store, run_id, Evaluation(key, rows, samples, []))
        if dest:
            dest.commit()
    finally:
        if dest:  # an error before the end: no half-written --out is left behind (nothing after a commit)
            dest.discard()
    summary = {r.metric: (r.value, r.ci_low, r.ci_high) for r in rows}
    return {"study": store.study, "eval_key": key, "n": n, "T": T, "L_s": L_s, "metrics": summary, "out": out}


def _open_out(out: str) -> AtomicFile:
    """`out` opened as a temp file beside it: that `out` can be written is known before any work."""
    if os.path.isdir(out):
        raise EvalError(f"--out {out}: is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise EvalError(f"--out {out}: no such directory {parent}")
    try:
        return AtomicFile(out, "w", encoding="utf-8")
    except OSError as e:
        raise EvalError(f"--out {out}: cannot write there ({e.strerror or e})") from None


def _file_digest(path: str) -> str:
    """The first 16 hex digits of the file's SHA-256, read a block at a time."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]
