"""One run, start to finish, inside a Ray Tune trial (or any process).

The results store, not Tune's experiment state, decides what is done: final weights present
-> no training; a checkpoint present -> training continues from it; eval points already in
the store are not evaluated again.
"""
from __future__ import annotations

import functools
import io
import json
import os
import socket
import time
import traceback

import torch

from model import ModelConfig, SeqSpec, Trainer, TrainConfig
from model.train import CheckpointError, load_state
from store import Store, digest
from study.engine.options import TrialOptions
from study.engine.rows import STATE_KEYS, damaged_data, gpu_ids, node_info, run_row  # noqa: F401 (re-exported)
from study.engine import evaluate
from study.engine.evaluate import checkpoint_scores, now, write
from study.engine.kinds import KINDS
from study.spec.grid import EvalConfig, EvalPoint, Run, Resources
from tasks import TASKS, make_task


def attempts_path(store: Store, run_id: str) -> str:
    return store.path("logs", f"{run_id}.attempts")


def attempts_so_far(store: Store, run_id: str) -> int:
    """How many times the run's trial has started (by `study run` or `study tune`, retries included)."""
    return (store.read_bytes(attempts_path(store, run_id)) or b"").count(b"\n")


def start_attempt(store: Store, run_id: str, by: str) -> int:
    """Record one more start of the run's trial in logs/<run_id>.attempts; returns its number (1, 2, ...).

    `by` says which command started it ("run" or "tune"). Every start, first try or a retry
    after a crash, appends one line, so the count survives the trial's process."""
    path = attempts_path(store, run_id)
    prev = store.read_bytes(path) or b""
    attempt = prev.count(b"\n") + 1
    store.write_bytes(path, prev + f"start {attempt} {by} pid {os.getpid()} {time.time():.3f}\n".encode())
    return attempt


def evaluate_point(run, pt: EvalPoint, model, task, ev_full, store, precision: str = "float32") -> list:
    """Evaluate one eval point of a run (its first `pt.n_examples` examples of `ev_full`) by the kind its task's
    `eval_mode` names (study/engine/kinds), and write its rows; returns its evals rows (a likelihood point's
    generations' included)."""
    ev = ev_full.head(pt.n_examples)
    done = KINDS[task.eval_mode].evaluate(run.run_id, pt, model, task, ev, min(run.eval.n_samples_kept, len(ev)),
                                          precision)
    for e in done:
        write(store, run.run_id, e)
    return [r for e in done for r in e.evals]


def run_from_resolved(d: dict) -> Run:
    task_cls = TASKS[d["task"]["name"]][0]
    return Run(study=d["study"], task=task_cls.model_validate(d["task"]),
               model=ModelConfig.model_validate(d["model"]), train=TrainConfig.model_validate(d["train_full"]),
               eval=EvalConfig.model_validate(d["eval"]), resources=Resources.model_validate(d["resources"]),
               retries=d["retries"], group=d.get("group"))


def trial_payload(run: Run) -> dict:
    """What travels to a trial: enough to rebuild the exact Run."""
    d = run.resolved()
    d["task"] = run.task.model_dump()
    d["train_full"] = run.train.model_dump()
    return d


def pick_device(resources: Resources) -> torch.device:
    """CUDA when the grid asked for a GPU, else the CPU. A GPU asked for where CUDA is unavailable
    (a node without a driver, a CPU-only torch, an empty CUDA_VISIBLE_DEVICES) is an error: a run
    silently trained on the CPU would be slow and would record timings no one asked for. The grid
    key `resources.allow_cpu_fallback: true` trains on the CPU instead (Ray still accounts the GPU)."""
    if resources.gpu <= 0:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if resources.allow_cpu_fallback:
        return torch.device("cpu")
    raise RuntimeError(
        f"resources.gpu is {resources.gpu:g} but CUDA is not available on {socket.gethostname()} "
        f"(Ray assigned GPU ids {gpu_ids() or 'none'}, CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}, torch {torch.__version__}); "
        "set resources.allow_cpu_fallback: true to train on the CPU")


def execute(run: Run, store: Store, options: TrialOptions, report=None, attempt: int = 1) -> dict:
    """Train (or resume, or skip) and evaluate one run; write its rows. Returns its runs row.

    `options`: what the driver tells its trials (study/engine/options.py): the code version and the hash of
    the grid that dispatched the run (store/provenance.py), kept in its config and row."""
    run_id = run.run_id
    code_version, grid = options.code_version, options.grid
    device = pick_device(run.resources)
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(run.resources.cpu)))
    log = lambda msg: store.append_log(run_id, f"{now().isoformat(timespec='seconds')} {msg}")
    task = prepared_task(run, store, log)
    spec = SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes())
    store.write_config(run_id, {**run.resolved(), "code_version": code_version, "grid": grid})
    costs = run.costs()

    trainer = Trainer(run.model, run.train, spec, lambda step, g: task.train_batch(run.train.batch_size, g), device)
    with _Heartbeat(store, run_id, trainer, attempt, str(device)) as beat:
        # a damaged file (truncated, foreign, a git-lfs pointer, a refused pickle, the wrong keys) is set
        # aside in quarantine/ and the run goes on from the next good source: weights, checkpoint, the
        # previous checkpoint, step 0 (training is a pure function of the step: the same numbers)
        _set_aside_unrecorded(store, run_id, log)
        weights = _load_good(trainer, store, store.weights_path(run_id), device, log) is not None
        if weights:
            log(f"final weights found (step {trainer.state.step}): evaluating only")
            row, hist = store.run_row(run_id) or {}, store.read_file("history", f"{run_id}.parquet")
            if hist is not None and digest.edited_histories({run_id: row.get("history_sha256")}, hist):
                log(store.quarantine(store.path("history", f"{run_id}.parquet"), "edited: its rows are not those "
                                     "its runs row recorded"))
            if store.read_file("history", f"{run_id}.parquet") is None:  # missing or damaged: the weights carry it
                store.write_rows("history", _history_rows(run_id, trainer.state.history), f"{run_id}.parquet")
                log("history file was missing or unreadable: rewritten from the final weights")
        else:
            _train(run, store, trainer, task, beat, attempt, report, log, costs["n_params"])

        # a point whose samples file is missing, or scored from other weights (before a retraining), is redone
        done = store.eval_keys(run_id, whole=True, weights=digest.weights_sha256(store, run_id))
        points, t0 = [pt for pt in run.eval_points() if pt.key not in done], time.time()
        beat.update(phase="eval", eval={"started": t0, "done": 0, "of": len(points), "at": t0})  # the ETA's
        ev_full = _healing(store, store.data_dir(), lambda: task.eval_set(run.eval.split), log)
        for i, pt in enumerate(points, 1):
            evaluate_point(run, pt, trainer.model, task, ev_full, store, trainer.precision)
            beat.update(eval={"started": t0, "done": i, "of": len(points), "at": time.time()})
            log(f"evaluated {pt.key}")
            if report:
                report({"step": trainer.state.step, "phase": "eval", "eval": pt.key})
        evaluate.evaluate_run(run, task, trainer.model, store, done, lambda split: ev_full if split == run.eval.split
                              else _healing(store, store.data_dir(), lambda: task.eval_set(split), log),
                              trainer.precision, log)

    hist = trainer.state.history
    row = run_row(run, costs, status="done", code_version=code_version, device=device_name(device), attempts=attempt,
                  train_seconds=trainer.state.seconds, final_loss=hist[-1]["loss"] if hist else None, grid=grid,
                  attention=trainer.attention, precision=trainer.precision, **digest.run_digests(store, run_id))
    store.write_rows("runs", [row], f"{run_id}.parquet")
    return row


def _train(run: Run, store: Store, trainer: Trainer, task, beat: "_Heartbeat", attempt: int, report, log,
           n_params: int) -> None:
    """Train from the latest good checkpoint (else step 0) to the end, writing checkpoints, the history
    and the final weights; with eval.at_checkpoints, score each checkpoint on validation examples."""
    run_id, device = run.run_id, trainer.device
    val_set = functools.cache(lambda: _healing(store, store.data_dir(), lambda: task.eval_set("val"), log))
    owner = _owner(run)
    ckpt = next((p for p in (store.checkpoint_path(run_id), previous_checkpoint_path(store, run_id))
                 if _load_good(trainer, store, p, device, log, owner) is not None), None)
    if ckpt is not None:
        beat.update(checkpoint=trainer.state.step)
        log(f"resuming from checkpoint at step {trainer.state.step} (attempt {attempt})"
            + ("" if ckpt == store.checkpoint_path(run_id) else f" ({ckpt}, the one kept before it)"))
    else:
        log(f"training from step 0 on {device} ({n_params} parameters, attempt {attempt})")
    log(f"attention {trainer.attention}, precision {trainer.precision} ({trainer.paths['how']}"
        + (f": step seconds {trainer.paths['times']}" if trainer.paths["times"] else "") + ")")
    beat.update(phase="train")

    def monitor(row: dict) -> None:
        """The training curves' validation scores of this step (eval.at_checkpoints), into its
        history row, the log and Tune."""
        with trainer.untimed() as spent:  # monitoring, not training: kept out of train_seconds
            row["val"] = checkpoint_scores(run, trainer.model, task, val_set(), trainer.precision)
            if evaluate.scored(task):
                row["val"].update(evaluate.checkpoint_values(trainer.model, run_id, val_set().head(
                    run.eval.at_checkpoints), run.model.L, trainer.precision))
        log(f"step {row['step']} " + " ".join(f"{k} {v:.4f}" for k, v in row["val"].items())
            + f" (scored in {spent['seconds']:.1f} s, not counted in train_seconds)")
        if report:
            report({"step": row["step"], "phase": "val", **row["val"]})

    def on_log(row: dict) -> None:
        row["attempt"] = attempt  # the same dict is kept in the history: says who computed the step
        log(f"step {row['step']} loss {row['loss']:.4f} L_t {row['L_t']} lr {row['lr']:.2e}")
        if report:
            report({"step": row["step"], "loss": row["loss"], "phase": "train"})

    def on_checkpoint(tr: Trainer) -> None:
        if run.eval.at_checkpoints:  # before saving: the checkpoint's history holds the scores
            row = tr.state.history[-1] if tr.state.history and \
                tr.state.history[-1]["step"] == tr.state.last["step"] else None
            if row is None:  # the checkpoint's step is not a logged one: it gets a history row
                row = {**tr.state.last, "seconds": tr.state.seconds, "attempt": attempt}
                tr.state.history.append(row)
            monitor(row)
        save_checkpoint(store, run, tr.state_dict())
        store.write_rows("history", _history_rows(run_id, tr.state.history), f"{run_id}.parquet")
        beat.update(checkpoint=tr.state.step)

    trainer.train(on_log=on_log, on_checkpoint=on_checkpoint)
    if run.eval.at_checkpoints and trainer.state.history:  # the last step is always logged
        monitor(trainer.state.history[-1])
    store.write_rows("history", _history_rows(run_id, trainer.state.history), f"{run_id}.parquet")
    store.write_bytes(store.weights_path(run_id), _to_bytes(trainer.state_dict()))
    for p in (store.checkpoint_path(run_id), previous_checkpoint_path(store, run_id)):
        for q in (p, p + DIGEST):
            store.delete(q)
    log(f"trained {trainer.state.step} steps in {trainer.state.seconds:.1f}s")


def previous_checkpoint_path(store: Store, run_id: str) -> str:
    """The checkpoint before the latest, kept while a run trains (resumed from when the latest is damaged)."""
    return store.path("checkpoints", f"{run_id}.prev.pt")


def _set_aside_unrecorded(store: Store, run_id: str, log) -> None:
    """Final weights whose bytes are not those the run's row recorded (weights_sha256: another run's, or
    edited) are set aside in quarantine/, never loaded: the run trains again (the same numbers)."""
    path = store.weights_path(run_id)
    data = store.read_bytes(path)
    bad = digest.weights_mismatch(path, data, store.run_row(run_id)) if data is not None else None
    if bad:
        log(store.quarantine(path, bad.removeprefix(f"{path}: ")))


DIGEST = ".sha256"  # beside a checkpoint, written after it: the SHA-256 of its bytes


def save_checkpoint(store: Store, run: Run, state: dict) -> None:
    """Write the trainer's `state` as the run's checkpoint, naming the run inside (_owner), then its digest
    beside it; the one before is kept (with its digest) until this one is whole: a fallback if it rots."""
    path, prev = store.checkpoint_path(run.run_id), previous_checkpoint_path(store, run.run_id)
    if store.exists(path):
        store.delete(prev + DIGEST)
        for p in (path, path + DIGEST):
            if store.exists(p):
                store.fs.move(p, prev + p[len(path):])
    data = _to_bytes({**state, **_owner(run)})
    store.write_bytes(path, data)
    store.write_text(path + DIGEST, digest.sha256(data))


def _owner(run: Run) -> dict:
    """What a checkpoint names inside: the run it is of, and the hash of that run's training config."""
    return {"run_id": run.run_id, "config_sha256": digest.rows_sha256([run.training_config])}


def _load_good(trainer: Trainer, store: Store, path: str, device, log, owner: dict | None = None) -> str | None:
    """Load the weights or checkpoint at `path` into `trainer`; `path` when it loaded. A file that does not
    load whole, or whose state is not this run's trainer's (names, shapes, optimizer groups, RNG), is set
    aside (Store.quarantine, said in the log) before anything of it is applied: the trainer is left as it
    was (no copy of it is kept: checked first, then loaded). A checkpoint (`owner` given) must also be this
    run's (`owner`, named inside it) and hold the bytes its digest file recorded when it was written."""
    data = store.read_bytes(path)
    if data is None:
        if path not in store.unreadable:
            return None
        why = store.unreadable[path]
    else:
        try:
            sd = load_state(io.BytesIO(data), device, path)
            why = _state_problem(trainer, sd) or (_not_its(store, path, data, sd, owner) if owner else None)
        except CheckpointError as e:
            why = str(e).removeprefix(f"{path}: ").splitlines()[0][:200]
        if why is None:
            try:
                trainer.load_state_dict(sd)
            except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:  # checked: never expected
                log(store.quarantine(path, f"does not load: {type(e).__name__}: {str(e)[:160]}"))
                raise CheckpointError(f"{path}: did not load after its checks passed ({e}); set aside: the "
                                      f"next attempt starts without it") from None
            return path
    log(store.quarantine(path, why))
    return None


def _not_its(store: Store, path: str, data: bytes, sd: dict, owner: dict) -> str | None:
    """Why the checkpoint `sd` (bytes `data`) is not the one this run wrote at `path`, or None."""
    recorded = (store.read_bytes(path + DIGEST) or b"").decode(errors="replace").strip()
    if recorded != digest.sha256(data):
        return (f"its bytes are not those recorded in {path + DIGEST} when it was written "
                f"({'no record' if not recorded else recorded[:16] + '...'}): edited, or copied from elsewhere")
    for k, want in owner.items():
        if sd.get(k) != want:
            return f"a checkpoint of another run or configuration (its {k} is {str(sd.get(k))[:16]}, not {want[:16]})"
    return None


def _state_problem(trainer: Trainer, sd: dict) -> str | None:
    """Why a loaded state cannot be this run's trainer's (None when it fits): checked before any of it is
    applied, so a half-applied load never happens."""
    missing = [k for k in STATE_KEYS if k not in sd]
    if missing:
        return f"not a state of this project's trainer (no {', '.join(missing)})"
    want, got = trainer.model.state_dict(), sd["model"]
    if not isinstance(got, dict) or set(got) != set(want):
        return "its model's parameters are not this run's (other names)"
    for k, v in want.items():
        if not isinstance(got[k], torch.Tensor) or got[k].shape != v.shape:
            return f"its parameter {k} is {getattr(got[k], 'shape', type(got[k]).__name__)}, this run's is {tuple(v.shape)}"
    opt, mine = sd["opt"], trainer.opt.param_groups
    groups = opt.get("param_groups") if isinstance(opt, dict) else None
    if (not isinstance(groups, list) or not isinstance(opt.get("state"), dict) or len(groups) != len(mine)
            or any(not isinstance(g, dict) or len(g.get("params", ())) != len(m["params"]) for g, m in zip(groups, mine))):
        return "its optimizer state is not this run's"
    rng = sd["torch_rng"]
    if not isinstance(rng, torch.Tensor) or rng.dtype != torch.uint8:
        return "no torch RNG state"
    if (not isinstance(sd["step"], int) or not isinstance(sd["seconds"], (int, float))
            or not isinstance(sd["history"], list)):
        return "its step, seconds or history are not a trainer's"
    return None


def _healing(store: Store, data_dir: str, fn, log):
    """fn(); when it fails and cached task data is damaged, those files are set aside and fn() runs once more
    (the data are derived from the config, by seed: regenerated identical)."""
    try:
        return fn()
    except Exception:
        bad = damaged_data(data_dir)
        if not bad:
            raise
    for path, why in bad:
        if store.local and path.startswith(store.dir + "/"):
            log(store.quarantine(path, why))
        else:  # a remote store: the local cache's copy and the store's
            os.replace(path, f"{path}.damaged-{int(time.time())}")
            remote = store.path("data", os.path.basename(path))
            if store.exists(remote):
                log(store.quarantine(remote, why))
    return fn()


def prepared_task(run: Run, store: Store, log):
    """The run's task, its data prepared from the store's cache (damaged cache files set aside and made anew)."""
    def prepare():
        task = make_task(run.task)
        task.prepare(data_dir)
        return task

    with store.task_data() as data_dir:  # a local directory, mirrored to remote stores
        return _healing(store, data_dir, prepare, log)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})"
    return str(device)


class _Heartbeat:
    """progress/<run_id>.json, rewritten every few seconds by a thread while the run works.

    `study status` reads it: a fresh heartbeat means running; a stale one, interrupted.
    """

    def __init__(self, store: Store, run_id: str, trainer: Trainer, attempt: int, device: str,
                 every_s: float = 5.0):
        import threading

        self.store, self.run_id, self.trainer, self.every_s = store, run_id, trainer, every_s
        self.info = {"steps": trainer.cfg.steps, "attempt": attempt, "pid": os.getpid(), "device": device,
                     "phase": "start", "checkpoint": None, "started": time.time(), **node_info()}
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._loop, name="rmdm-heartbeat", daemon=True)

    def update(self, **info) -> None:
        with self.lock:
            self.info.update(info)
        self.write()

    def write(self) -> None:
        st = self.trainer.state
        with self.lock:
            info = {**self.info, "step": st.step, "train_seconds": st.seconds, "time": time.time()}
        try:
            self.store.write_progress(self.run_id, info)
        except OSError:
            pass  # a missed heartbeat only makes `study status` less precise

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            self.write()

    def __enter__(self) -> "_Heartbeat":
        self.write()
        self.thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop.set()
        self.thread.join()
        self.update(phase="done" if exc is None else "error")


def _history_rows(run_id: str, history: list[dict]) -> list[dict]:
    return [{"run_id": run_id, "step": h["step"], "loss": h["loss"], "loop_losses": h["loop_losses"],
             "L_t": h["L_t"], "lr": h["lr"], "seconds": h.get("seconds"), "attempt": h.get("attempt"),
             "val": json.dumps(h["val"], sort_keys=True) if h.get("val") else None}
            for h in history]


def _to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def format_error(e: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(e), e)).strip()
