"""`study run`: dispatch the runs a grid still owes to Ray Tune, one trial per run."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

from store import Store, digest
from study.engine.errors import root_cause
from study.engine.faults import fault_config
from study.spec.grid import Grid, Run
from study.engine.loggers import callbacks as logger_callbacks
from study.engine.nodeloss import unwatch_all, watcher
from study.engine.raytune import fit, make_tuner, record_unfinished
from study.commands.status import LiveView, retried_since
from study.engine.trial import trial_payload


def code_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("rmdm-study")
    except PackageNotFoundError:
        v = "0+unknown"
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", ""
    return f"{v}+g{sha}{'.dirty' if dirty else ''}" if sha else v


@dataclass
class Plan:
    done: list[Run]
    todo: list[Run]  # to train and/or evaluate
    failed: list[Run]  # failed earlier; skipped unless --retry-failed
    # run_id -> what its trial does and why, for runs whose row says done but that are not whole
    why: dict[str, str] = field(default_factory=dict)


def classify(grid: Grid, store: Store, retry_failed: bool = False, deep: bool = True) -> Plan:
    """Done, to do, failed. A run is done only when everything a done run must have is there and readable:
    its row says done, every eval point's evals (and samples) parse, its history parses, and (`deep`)
    its final weights load and configs/<run_id>.json parses and matches the run. Otherwise its trial redoes
    what is missing: re-evaluates from the weights, or retrains when they are damaged (`why` says which)."""
    done, todo, failed = [], [], []
    why: dict[str, str] = {}
    seen = store.summary()  # one pass over the store, not a few reads per run and point
    for run in grid.runs:
        row = seen.run_row(run.run_id)
        status = row["status"] if row else None
        missing = {p.key for p in run.eval_points()} - seen.eval_keys(run.run_id, whole=True)
        if status == "done":
            problem = (not_whole(store, run) or digest.recorded_weights_problem(store, row)) if deep else None
            if problem is None and missing:
                problem = f"re-evaluate: eval point(s) {', '.join(sorted(missing))} missing or unreadable"
            if problem is None and not seen.has_history(run.run_id):
                problem = (f"re-evaluate: history/{run.run_id}.parquet missing or unreadable (rewritten from the "
                           f"weights)")
            if problem is None:
                done.append(run)
                continue
            why[run.run_id] = problem
            todo.append(run)
        elif status == "failed" and not retry_failed and not retried_since(store, run.run_id, row):
            failed.append(run)  # (a --retry-failed that was interrupted is resumed, as status says)
        else:
            todo.append(run)
    return Plan(done, todo, failed, why)


def not_whole(store: Store, run: Run) -> str | None:
    """What a run whose row says done lacks, as "retrain: ..." (its final weights are missing or do not load)
    or "re-evaluate: ..." (its config file is missing, garbled or of another run); None when whole."""
    rid = run.run_id
    wpath = store.weights_path(rid)
    bad = weights_problem(store, wpath)
    if bad:
        return f"retrain: {wpath} {bad}"
    cpath = store.path("configs", f"{rid}.json")
    raw = store.read_bytes(cpath)
    if raw is None:
        return f"re-evaluate: {cpath} {store.unreadable.get(cpath, 'is missing')} (rewritten)"
    try:
        cfg = json.loads(raw)
    except ValueError as e:
        return f"re-evaluate: {cpath} is not JSON ({str(e)[:80]}) (rewritten)"
    want = json.loads(json.dumps(run.resolved(), sort_keys=True, default=str))
    if not isinstance(cfg, dict) or any(cfg.get(k) != want.get(k) for k in ("run_id", "task", "model", "train")):
        return f"re-evaluate: {cpath} is not this run's config (rewritten)"
    return None


def weights_problem(store: Store, path: str) -> str | None:
    """Why the final weights at `path` cannot be used ("is missing", "is not a whole torch file ..."), or None.

    Cheap, for every done run at every `study run` (the trial that loads them checks the rest): on a local
    disk the zip directory torch writes is read and its pickle (data.pkl, CRC-checked, no tensor read) must
    name the trainer's state keys (~0.6 ms a run); on an object store its first and last bytes are checked."""
    import zipfile

    import pyarrow.fs as pafs

    from study.engine.trial import STATE_KEYS

    info = store.fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return "is a dangling symlink" if store.local and os.path.islink(path) else "is missing"
    if info.type != pafs.FileType.File:
        return "is not a file"
    if not store.local:
        try:
            with store.fs.open_input_file(path) as f:
                size = f.size()
                head, tail = f.read_at(4, 0), f.read_at(min(22, size), max(0, size - 22))
        except OSError as e:
            return f"cannot be read ({e})"
        return None if head == b"PK\x03\x04" and tail[:4] == b"PK\x05\x06" else \
            "is not a whole torch file (truncated or foreign)"
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next((n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1), None)
            if pkl is None:
                return "is not a torch file (no data.pkl)"
            names = z.read(pkl)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as e:  # zlib/CRC errors too
        return f"is not a whole torch file (truncated or foreign: {type(e).__name__}: {str(e)[:100]})"
    lacking = [k for k in STATE_KEYS if k.encode() not in names]
    return f"does not hold this project's weights (no {', '.join(lacking)})" if lacking else None


def longest_first(runs: list[Run], store: Store) -> list[Run]:
    """Runs in decreasing order of the training left to them (trained runs only evaluate).

    Tune starts trials in the order given; starting the longest first keeps the last one to
    finish from being a long run started late (on 2 CPUs the demo's makespan drops ~20%).
    """
    def left(run: Run) -> int:
        return 0 if store.exists(store.weights_path(run.run_id)) else run.train_flops()

    return sorted(runs, key=left, reverse=True)  # stable: equal costs keep the grid's order


def _loopback_only() -> None:
    """Make a Ray started by this process bind 127.0.0.1 only (checked with `ss -ltnp` in the tests).

    Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when `ray._private.ray_constants` is imported:
    if ray was imported before (by a test, by Tune), the module constant is set too. The env
    var also reaches the GCS, raylet and workers that `ray.init` spawns.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if "ray._private.ray_constants" in sys.modules:
        sys.modules["ray._private.ray_constants"].ENABLE_RAY_CLUSTER = False


def check_address(address: str | None) -> None:
    """None (embedded Ray), auto, HOST:PORT or ray://HOST:PORT; anything else is an error."""
    host_port = r"(ray://)?([^\s:/\[\]]+|\[[0-9a-fA-F:.]+\]):\d{1,5}"  # IPv6 hosts in brackets
    if address is None or address == "auto" or re.fullmatch(host_port, address):
        return
    raise ValueError(f"--address {address!r}: use auto, HOST:PORT or ray://HOST:PORT")


START_ATTEMPTS = 3  # embedded Ray starts tried before `study run` gives up


def init_ray(address: str | None, num_cpus: int | None = None):
    """Join `address` (auto, HOST:PORT, ray://HOST:PORT), or start an embedded Ray on loopback only.

    Returns (ray, started): `started` says whether this call started Ray (and should shut it down).
    """
    if address is None:
        _loopback_only()  # an open Ray port runs anyone's code
    import ray

    if ray.is_initialized():
        return ray, False
    kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR")
    if address is None:
        # no RAY_ADDRESS leaking in from the environment: embedded means embedded
        os.environ.pop("RAY_ADDRESS", None)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                # "local": a new Ray, never a `ray start` cluster that ray.init(address=None) would join
                # (it reads /tmp/ray/ray_current_cluster) and that refuses num_cpus
                ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kw)
                break
            except Exception as e:
                # Ray gives a raylet a hard-coded 30 s to register; a crowded machine can miss it.
                # Nothing has run yet: shut down what this attempt started and start again.
                if "timed out during startup" not in str(e) or attempt == START_ATTEMPTS:
                    raise
                ray.shutdown()
                print(f"ray: the local node timed out during startup (attempt {attempt}/{START_ATTEMPTS}); "
                      "starting it again", file=sys.stderr)
    else:
        check_address(address)
        reachable(address)
        try:
            _join(ray, address, kw)
        except (ConnectionError, TimeoutError) as e:
            raise ClusterError(f"--address {address}: could not join the Ray cluster ({_first_line(e)})") from None
    return ray, True


def _join(ray, address: str, kw: dict) -> None:
    """ray.init(address=...), interruptible: Ray's join blocks in C++ for 30 s and more (a port that
    accepts TCP but is no Ray), where Python never sees a Ctrl-C. The join runs in a thread; the main
    thread waits on it, so Ctrl-C ends the process at once, saying so (nothing has run yet)."""
    import signal
    import threading

    box: dict = {}

    def join():
        try:
            ray.init(address=address, **kw)
        except BaseException as e:  # handed to the main thread
            box["error"] = e

    t = threading.Thread(target=join, name="ray-join", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.1)
    except KeyboardInterrupt:
        print(f"interrupted while joining the Ray cluster at {address}; nothing was run", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        os._exit(130)  # the join thread cannot be stopped, and Ray's exit hooks would wait on it
    if "error" in box:
        raise box["error"]
    if threading.current_thread() is threading.main_thread():  # what ray.init does on the main thread
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))


class ClusterError(ValueError):
    """The cluster cannot be reached, or cannot ever place what the grid asks for."""


REACH_TIMEOUT_S = 10.0  # TCP connect to --address; Ray's own join retries for minutes


def reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """A HOST:PORT (or ray://HOST:PORT) address accepts TCP connections, checked within `timeout_s`."""
    import socket

    shown = address
    if address == "auto":  # the GCS address Ray would join (RAY_ADDRESS, `ray start`'s file, a local GCS),
        address = _auto_address()  # checked like HOST:PORT: a stale one would hang ray.init for minutes
        shown = f"auto ({address})"
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ClusterError(f"--address {shown}: cannot reach the Ray cluster ({why} after at most "
                           f"{timeout_s:g}s); is it started (`ray start --head`) and is the port open?") from None


def _auto_address() -> str:
    """The HOST:PORT `--address auto` joins (ClusterError if none): $RAY_ADDRESS, else the cluster the last
    `ray start` recorded (<RAY_TMPDIR>/ray/ray_current_cluster), else the one Ray cluster running here.

    Ray itself prefers a single running GCS to the recorded file; we always take the file when there is
    one, so what `auto` joins does not depend on which other Ray instances happen to run on this machine."""
    import logging

    from ray._private.services import (canonicalize_bootstrap_address, canonicalize_bootstrap_address_or_die,
                                       find_bootstrap_address)

    if not os.environ.get("RAY_ADDRESS"):
        recorded = find_bootstrap_address(None)
        if recorded:
            try:
                return canonicalize_bootstrap_address(recorded)
            except ValueError as e:
                raise ClusterError(f"--address auto: {_first_line(e)}") from None

    log = logging.getLogger("ray._private.services")
    level = log.level
    log.setLevel(logging.ERROR)  # its "found multiple Ray instances" warning: the address chosen is named below
    try:
        return canonicalize_bootstrap_address_or_die("auto")
    except (ConnectionError, ValueError) as e:
        raise ClusterError(f"--address auto: {_first_line(e)}") from None
    finally:
        log.setLevel(level)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def node_resources(ray) -> list[dict]:
    """Resources of each alive node of the cluster."""
    return [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]


def unplaceable(runs: list[Run], nodes: list[dict]) -> list[str]:
    """One message per distinct request that no node of the cluster can ever hold (a trial's CPUs and
    GPUs are one placement-group bundle: they must fit on a single node)."""
    msgs, seen = [], set()
    cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    gpus = max((n.get("GPU", 0) for n in nodes), default=0)
    for run in runs:
        ask = (run.resources.cpu, run.resources.gpu)
        if ask in seen:
            continue
        seen.add(ask)
        if any(n.get("CPU", 0) >= ask[0] and n.get("GPU", 0) >= ask[1] for n in nodes):
            continue
        short = [f"resources.{k} = {v:g} (the largest node has {have:g})"
                 for k, v, have in (("cpu", ask[0], cpus), ("gpu", ask[1], gpus)) if v > have]
        if not short:
            short = [f"resources.cpu = {ask[0]:g} and resources.gpu = {ask[1]:g} together (no single node has both)"]
        n_runs = sum((r.resources.cpu, r.resources.gpu) == ask for r in runs)
        msgs.append(f"{n_runs} run(s) ask {', '.join(short)}; the cluster has {len(nodes)} node(s) with "
                    f"{sum(n.get('CPU', 0) for n in nodes):g} CPUs and {sum(n.get('GPU', 0) for n in nodes):g} "
                    f"GPUs in all: they could never start")
    return msgs


def refuse_unplaceable(ray, runs: list[Run], where: str, echo) -> bool:
    """The check before dispatch (`study run`, `study tune`): says why each request no node can hold
    would never start (Tune would leave it pending forever, without a word); True when there is one."""
    never = unplaceable(runs, node_resources(ray))
    for msg in never:
        echo(f"error: {where}: {msg}; lower `resources` in the grid or add nodes (nothing was run)")
    return bool(never)


WAITING_EVERY_S = 1.0  # the live line asks Ray what is free at most this often


def waiting_note(asks: list[tuple[float, float]], free: dict, total: dict) -> str:
    """Why runs wait, for the live line: each resource that some pending run (`asks`: its (cpu, gpu))
    needs more of than the cluster has free now, e.g. "waiting for cpu: 0 free of 2"; '' when every
    pending run would fit (Tune is about to start it). `free`, `total`: Ray's available and cluster
    resources."""
    short = [f"{name}: {free.get(key, 0):g} free of {total.get(key, 0):g}"
             for i, (name, key) in enumerate((("cpu", "CPU"), ("gpu", "GPU")))
             if any(a[i] > free.get(key, 0) for a in asks)]
    return f"waiting for {', '.join(short)}" if short else ""


def run_grid(grid: Grid, results: str, address: str | None = None, retry_failed: bool = False,
             num_cpus: int | None = None, echo=print, progress_every_s: float = 30.0, wait: bool = False,
             log: list | None = None) -> int:
    """Run or resume a grid. Returns the process exit code (1 if any run failed or is incomplete).
    `log`: the sinks of --log (study.engine.loggers.parse: MLflow, W&B, TensorBoard through Ray's logger callbacks).

    Holds the study's lease throughout (store/lease.py): while another driver holds it, raises
    store.lease.LeaseHeld naming that driver, or with `wait` waits until it is free."""
    from store.lease import acquire

    lease = acquire(Store(results, grid.study), "run", wait=wait, echo=echo, on_lost=_lease_lost(echo))
    try:
        return _run_grid(grid, results, address, retry_failed, num_cpus, echo, progress_every_s, lease, log=log)
    finally:
        lease.release()


def _quiet_trial_tracebacks() -> None:
    """Tune logs each failed trial with Ray's whole traceback: the run's log keeps it, and the terminal
    gets one line per failed run (root_cause) once the sweep ends."""
    import logging

    for name in ("ray.tune.execution.tune_controller", "ray.tune.tune"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def sigterm_as_ctrl_c() -> None:
    """A SIGTERM to the driver (`kill PID`, a scheduler stopping a job) does what Ctrl-C does: it calls the
    SIGINT handler of the moment (Tune's during a sweep: the trials stop, their checkpoints stay, the
    "interrupted" line is printed and the exit code is Ctrl-C's; elsewhere KeyboardInterrupt)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def term(signum, frame):
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, term)


def _lease_lost(echo):
    """What a driver does when a newer driver took its lease over (it sent no heartbeat in time): say so
    and stop its trials as Ctrl-C does; its trials stop on their own at their next report (the fence)."""
    import signal

    def lost(newer) -> None:
        echo(f"error: this driver lost the study's lease to {newer.describe()}; stopping (its finished runs are kept)")
        os.kill(os.getpid(), signal.SIGINT)

    return lost


def _run_grid(grid: Grid, results: str, address: str | None, retry_failed: bool, num_cpus: int | None, echo,
              progress_every_s: float, lease, log: list | None = None) -> int:
    store = Store(results, grid.study)
    links = store.links_out()  # never write through a symlink out of the store
    for line in links:
        echo(f"error: {line}")
    if links:
        return 2
    grid_sha = record_grid_file(store, grid, "run")
    plan = heal_and_plan(grid, store, retry_failed, echo)
    echo(f"study {grid.study}: {len(grid.runs)} runs: {len(plan.done)} done, {len(plan.todo)} to run, "
         f"{len(plan.failed)} failed earlier" + (" (use --retry-failed)" if plan.failed else ""))
    if not plan.todo:
        return 1 if plan.failed else 0

    faults = fault_config()  # a malformed spec fails here, before Ray starts
    t0 = time.time()
    try:
        ray, started = init_ray(address, num_cpus)
    except ClusterError as e:
        echo(f"error: {e}")
        return 2
    try:
        sigterm_as_ctrl_c()  # after ray.init, whose own handler (and its C-level stack dump) it replaces
        _quiet_trial_tracebacks()
        echo(f"ray: {'started a local Ray on 127.0.0.1' if started and address is None else f'joined {address}'} "
             f"in {time.time() - t0:.1f}s ({ray.cluster_resources().get('CPU', 0):g} CPUs, "
             f"{ray.cluster_resources().get('GPU', 0):g} GPUs)")
        if refuse_unplaceable(ray, plan.todo, grid.path, echo):
            return 2
        # a root every node reaches: an absolute path (shared disk) or the URI as given
        abs_results = results if "://" in results else os.path.abspath(results)
        trial_config = {"results": abs_results, "code_version": code_version(), "grid": grid_sha,
                        "lease": lease.fence, **faults}
        return _dispatch(grid, store, plan, ray, trial_config, lease, echo, progress_every_s, log or [])
    finally:
        if started:
            ray.shutdown()


def record_grid_file(store: Store, grid: Grid, command: str) -> str:
    """Keep the grid a `command` (run, tune) runs, by hash and logged with the time (store/provenance.py), and
    as the study's grid.yaml (replaced after: a study's older grid.yaml is adopted first). Returns its hash."""
    from store.provenance import record_grid
    from study.spec.overrides import grid_text

    text = grid_text(grid)  # after any command-line overrides, which it names in a comment header
    grid_sha = record_grid(store, text, command, grid.path)
    store.write_text(store.path("grid.yaml"), text)
    return grid_sha


def _dispatch(grid: Grid, store: Store, plan: Plan, ray, trial_config: dict, lease, echo, progress_every_s: float,
              log: list) -> int:
    """One Tune experiment over the runs still to do; their outcome, as `study run` says it."""
    from ray import tune

    by_id = {r.run_id: r for r in plan.todo}
    placement = _PlacementWatch(ray, by_id)
    view = LiveView(len(plan.todo), {r.run_id: r.train.steps for r in plan.todo}, echo=echo,
                    every_s=progress_every_s)
    trials: list = []  # Tune's trials as of its last step (their status is live)
    view.waiting = _waiting_note_of(ray, trials, by_id)
    payloads = [trial_payload(r) for r in longest_first(plan.todo, store)]
    tuner = make_tuner(
        # a new Tune experiment per invocation: the store, not Tune's state, says what is done
        f"{grid.study}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", store, _trial_resources,
        param_space={"run": tune.grid_search(payloads), **trial_config},
        # a trial lost with its node is retried without spending `retries` (study/engine/nodeloss.py)
        callbacks=[run_events(view, trials), watcher(store), placement.callback(),
                   *logger_callbacks(log, store, "run", echo)],  # --log (study/engine/loggers.py)
        max_failures=max(r.retries for r in plan.todo), stop=placement.stopper())
    try:
        aside = _quarantined(store)
        result_grid = fit(tuner, store)
        view.close()  # the terminal's live line ends before the lines that follow
        for path in sorted(_quarantined(store) - aside):
            echo(f"set aside (damaged; kept, never deleted): {path}; its run went on without it (see its log)")
        if lease.lost is not None:  # a newer driver owns the study now: its rows are its own to write
            echo(f"study {grid.study}: stopped: the lease was taken over by {lease.lost.describe()}")
            return 1
        if placement.reason:
            echo(f"error: {grid.path}: {placement.reason}; the cluster changed during the run: add nodes or lower "
                 f"`resources`, then run again (finished runs are kept)")
            return 2
        for res in result_grid:
            if res.error is not None:
                record_unfinished(store, by_id[res.config["run"]["run_id"]], "failed", res.error,
                                  trial_config["code_version"], trial_config["grid"])
        return _outcome(grid, store, echo)
    finally:
        view.close()
        unwatch_all()


def _trial_resources(config: dict):
    """A trial's placement group: one bundle with its run's CPUs and GPUs."""
    from ray.tune import PlacementGroupFactory

    res = config["run"]["resources"]
    bundle = {"CPU": res["cpu"]}
    if res["gpu"]:
        bundle["GPU"] = res["gpu"]  # fractional: several small trials share one GPU
    return PlacementGroupFactory([bundle])


def _waiting_note_of(ray, trials: list, by_id: dict):
    """The live line's note on why runs wait (waiting_note), asked of Ray at most every WAITING_EVERY_S."""
    note = {"at": 0.0, "text": ""}

    def waiting() -> str:
        if time.time() - note["at"] < WAITING_EVERY_S:  # the terminal bar redraws every Tune step
            return note["text"]
        note["at"], note["text"] = time.time(), ""
        if any(t.status == "RUNNING" for t in trials):  # Tune reserves the first trials' resources before they start
            asks = [(r.cpu, r.gpu) for r in (by_id[t.config["run"]["run_id"]].resources
                                             for t in trials if t.status == "PENDING")]
            if asks:
                note["text"] = waiting_note(asks, ray.available_resources(), ray.cluster_resources())
        return note["text"]

    return waiting


def _outcome(grid: Grid, store: Store, echo) -> int:
    """What the store says once the experiment ended: done, failed (each with its root cause), interrupted."""
    final = classify(grid, store)
    echo(f"study {grid.study}: {len(final.done)} done, {len(final.failed)} failed, "
         f"{len(final.todo)} incomplete; results in {store.dir}")
    for run in final.failed:
        echo(f"  failed {run.run_id}: {root_cause((store.run_row(run.run_id) or {}).get('error'))}  "
             f"(log: {store.path('logs', run.run_id + '.log')})")
    if final.todo:  # no error and not done: Tune stopped them (Ctrl-C)
        echo(f"interrupted: {len(final.todo)} run(s) not finished; `study run` again resumes them "
             f"(from their last checkpoint; finished runs are kept)")
    return 1 if (final.failed or final.todo) else 0


def heal_and_plan(grid: Grid, store: Store, retry_failed: bool, echo) -> Plan:
    """What `study run` does to a store before it dispatches: removes temp files of interrupted writes, sets
    damaged cached data aside and makes it anew, and plans, naming every unreadable file and every run
    whose row says done but that is not whole (re-evaluated or retrained, and why)."""
    gone = store.clean_temp()
    if gone:
        echo(f"removed {len(gone)} temp file(s) left by interrupted writes: {', '.join(gone[:3])}"
             + (", ..." if len(gone) > 3 else ""))
    heal_data(grid, store, echo)
    plan = classify(grid, store, retry_failed)
    for path, why in sorted(store.unreadable.items()):
        echo(f"unreadable: {path} ({why}): its run is redone")
    for rid, why in sorted(plan.why.items()):
        echo(f"run {rid}: {why}")
    return plan


def heal_data(grid: Grid, store: Store, echo) -> None:
    """Cached task data (data/*.npz) whose zip does not read is set aside and made anew now (it is derived
    from the grid's task configs, by seed), so a finished study heals too. Local stores."""
    from study.engine.trial import damaged_data, prepared_task

    if not store.local:
        return
    bad = damaged_data(store.data_dir(), deep=False)
    for path, why in bad:
        echo(store.quarantine(path, why))
    if bad:
        seen = set()
        for run in grid.runs:
            key = run.task.model_dump_json()
            if key not in seen:
                seen.add(key)
                task = prepared_task(run, store, echo)
                for split in {pt.split for pt in run.eval_points()}:
                    task.eval_set(split)
        echo(f"remade the cached task data of {len(seen)} task config(s)")


def _quarantined(store: Store) -> set[str]:
    import pyarrow.fs as pafs

    from store import QUARANTINE

    sel = pafs.FileSelector(f"{store.dir}/{QUARANTINE}", recursive=True, allow_not_found=True)
    return {i.path for i in store.fs.get_file_info(sel) if i.type == pafs.FileType.File}


class _PlacementWatch:
    """Checks, while trials wait, that each pending one still fits on some alive node (the cluster
    can shrink under a run); one that never can ends the experiment with a message instead of
    pending forever. Tune calls `callback()` every step and asks `stopper()` whether to stop all."""

    EVERY_S = 10.0

    def __init__(self, ray, by_id: dict):
        self.ray, self.by_id, self.reason, self.last = ray, by_id, None, time.time()

    def check(self, trials) -> None:
        if self.reason or time.time() - self.last < self.EVERY_S:
            return
        self.last = time.time()
        pending = [self.by_id[t.config["run"]["run_id"]] for t in trials if t.status == "PENDING"]
        if pending:
            never = unplaceable(pending, node_resources(self.ray))
            self.reason = "; ".join(never) or None

    def callback(self):
        from ray.tune import Callback

        watch = self

        class PlacementCheck(Callback):
            def on_step_end(self, iteration, trials, **info):
                watch.check(trials)

        return PlacementCheck()

    def stopper(self):
        from ray.tune import Stopper

        watch = self

        class PlacementStop(Stopper):
            def __call__(self, trial_id, result):
                return False

            def stop_all(self):
                return watch.reason is not None

        return PlacementStop()


def run_events(view: LiveView, trials: list):
    """A Ray Tune callback feeding `view` with the trials of a sweep (`study run`), keyed by run id, and
    keeping Tune's list of trials in `trials`."""
    from ray.tune import Callback

    seen = trials

    class RunEvents(Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            view.started(trial.config["run"]["run_id"])

        def on_trial_result(self, iteration, trials, trial, result, **info):
            view.result(trial.config["run"]["run_id"], result.get("step") if result.get("phase") == "train"
                        else None)

        def on_trial_complete(self, iteration, trials, trial, **info):
            view.finished(trial.config["run"]["run_id"], ok=True)

        def on_trial_error(self, iteration, trials, trial, **info):
            view.finished(trial.config["run"]["run_id"], ok=False)

        def on_step_end(self, iteration, trials, **info):
            seen[:] = trials
            view.show(force=False)

    return RunEvents()
