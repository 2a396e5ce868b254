"""Starting or joining Ray for `study run` and `study tune`: an embedded Ray on loopback only, or a
cluster's address checked before it is joined; a SIGTERM to the driver turned into Ctrl-C; and the Ray
processes an embedded Ray started, recorded so that the next driver ends what a killed one left running."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time

from atomicio import loads_json
from store import Store
from store.lease import machine, proc_start

# the directory that holds the installed project's packages (study/, store/, ...): the source tree of an
# editable install, site-packages otherwise
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def workers_import_the_project():
    """Ray puts the driver's working directory first on every worker's sys.path (ray.init records it in the
    job's config): a folder there named like one of the project's packages (a results folder `store`)
    shadows the package, and every trial fails on import. While ray.init runs, the driver stands in
    PROJECT_ROOT instead, so that is what the workers put first; the working directory comes back after.
    (Tune moves each trial into its own trial directory anyway: no trial reads the driver's.)"""
    here = os.getcwd()
    os.chdir(PROJECT_ROOT)
    try:
        yield
    finally:
        os.chdir(here)


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


def init_ray(address: str | None, num_cpus: int | None = None, store=None, echo=print):
    """Join `address` (auto, HOST:PORT, ray://HOST:PORT), or start an embedded Ray on loopback only.

    With `store` (the study's, its lease held), an embedded start first ends the Ray processes a killed
    driver of the study left, then records its own (`record`, below).
    Returns (ray, started): `started` says whether this call started Ray (and should shut it down).
    """
    if address is None:
        _loopback_only()  # an open Ray port runs anyone's code
    import ray

    if ray.is_initialized():
        return ray, False
    kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR")
    if address is None:
        address_space_or_refuse()
        if store is not None:
            end_left_over(store, echo)
        # no RAY_ADDRESS leaking in from the environment: embedded means embedded
        os.environ.pop("RAY_ADDRESS", None)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                # "local": a new Ray, never a `ray start` cluster that ray.init(address=None) would join
                # (it reads /tmp/ray/ray_current_cluster) and that refuses num_cpus
                with workers_import_the_project():
                    ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kw)
                break
            except KeyboardInterrupt:  # a Ctrl-C during the start: nothing of it is left behind
                end_own(ray.shutdown)
                raise
            except Exception as e:
                # Ray gives a raylet a hard-coded 30 s to register; a crowded machine can miss it.
                # Nothing has run yet: shut down what this attempt started and start again.
                end_own(ray.shutdown)  # and what the shutdown of a half-started node leaves
                if "timed out during startup" not in str(e) or attempt == START_ATTEMPTS:
                    raise
                print(f"ray: the local node timed out during startup (attempt {attempt}/{START_ATTEMPTS}); "
                      "starting it again", file=sys.stderr)
        if store is not None:
            record(store)
    else:
        check_address(address)
        reachable(address)
        try:
            with workers_import_the_project():
                _join(ray, address, kw)
        except (ConnectionError, TimeoutError) as e:
            raise ClusterError(f"--address {address}: could not join the Ray cluster ({_first_line(e)})") from None
    return ray, True


WORKER_AS_BYTES = 4 << 30  # a trial worker's address space besides the object store it maps (3.5-4 GiB measured)


def address_space_or_refuse() -> None:
    """Refuse (ClusterError) to start Ray under an address-space limit (`ulimit -v`, `prlimit --as`) below
    what its processes map: the raylet and every worker map the whole object store (30% of the free memory
    by Ray's default) and a worker holds torch besides. Ray's own failure is an mmap error in raylet.out,
    seen on the terminal as a node that "timed out during startup" three times over (220 s)."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return
    from ray._private.utils import estimate_available_memory, resolve_object_store_memory

    store = resolve_object_store_memory(estimate_available_memory())
    if limit < store + WORKER_AS_BYTES:
        raise ClusterError(
            f"this process's address-space limit (ulimit -v) is {limit / 2**30:.1f} GiB, below the "
            f"{(store + WORKER_AS_BYTES) / 2**30:.1f} GiB a Ray worker maps ({store / 2**30:.1f} GiB of object store, "
            f"Ray's default of 30% of the free memory, and about 4 GiB of its own): Ray's mmap of the object store "
            f"would fail; raise the limit (`ulimit -v unlimited`) or shrink the store "
            f"(RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION=0.05)")


def _join(ray, address: str, kw: dict) -> None:
    """ray.init(address=...), interruptible: Ray's join blocks in C++ for 30 s and more (a port that
    accepts TCP but is no Ray), where Python never sees a Ctrl-C. The join runs in a thread; the main
    thread waits on it, so Ctrl-C ends the process at once, saying so (nothing has run yet)."""
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
        raise box["error"]  # (the driver's SIGTERM handler is set after the join: sigterm_as_ctrl_c)


class ClusterError(ValueError):
    """The cluster cannot be reached, or cannot ever place what the grid asks for."""


REACH_TIMEOUT_S = 10.0  # TCP connect to --address; Ray's own join retries for minutes


def reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """A HOST:PORT (or ray://HOST:PORT) address accepts TCP connections, checked within `timeout_s`."""
    shown = address
    if address == "auto":  # the GCS address Ray would join (RAY_ADDRESS, `ray start`'s file, a local GCS),
        address = _auto_address()  # checked like HOST:PORT: a stale one would hang ray.init for minutes
        shown = f"auto ({address})"
    host, _, port = address.removeprefix("ray://").rpartition(":")
    why = unreachable(host.strip("[]"), int(port), timeout_s)
    if why:
        raise ClusterError(f"--address {shown}: cannot reach the Ray cluster ({why} after at most "
                           f"{timeout_s:g}s); is it started (`ray start --head`) and is the port open?")


def unreachable(host: str, port: int, timeout_s: float) -> str | None:
    """Why `host`:`port` does not accept a TCP connection within `timeout_s` ("timed out", ...), or None."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
    return None


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


def sigterm_as_ctrl_c() -> None:
    """A SIGTERM to the driver (`kill PID`, a scheduler stopping a job) does what Ctrl-C does: it calls the
    SIGINT handler of the moment (Tune's during a sweep: the trials stop, their checkpoints stay, the
    "interrupted" line is printed and the exit code is Ctrl-C's; elsewhere KeyboardInterrupt)."""
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


# ---- the Ray processes of an embedded Ray -------------------------------------------------------
# The Ray processes an embedded Ray started, recorded in the study's store beside its lease, so that the
# next driver of the study ends what a killed one (SIGKILL, a crash) left running.
#
# A SIGKILLed driver takes its GCS and raylet with it, but the raylet's agents (DashboardAgent,
# RuntimeEnvAgent) live on, and a rerun stalled on "Failed to connect to GCS". The driver writes
# `<study>/lease/ray.json` (its PID and start time, the machine, and each descendant's PID, start time and
# command line) once Ray has started; the next driver, which holds the lease (so the recorder is not
# running the study), ends each recorded process that is still that process (same machine, same start
# time, same command line) before it starts Ray: SIGTERM, then SIGKILL after GRACE_S. A PID reused by
# another process since is never touched, nor, whatever the record says (anyone who can write to the store
# writes it), a process that is not Ray's by the test that recorded it (a `ray::` worker, or a binary or
# script of the Ray install this driver imports) or not of the recorded Ray session, the recorded driver's
# (its session directory in the command line or, for a worker, a file of it open).

RECORD = ("lease", "ray.json")
GRACE_S = 5.0  # SIGTERM to SIGKILL
WATCH_S = 2.0  # how often the record is brought up to date


def cmdline(pid: int) -> str | None:
    """The command line of process `pid` (its arguments joined by spaces), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (Linux; [] elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for d in names:
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def ray_s(cmd: str) -> bool:
    """Whether a command line is Ray's: a `ray::` worker, or a binary or script of the Ray install this
    process imports (.../site-packages/ray/core/src/ray/raylet/raylet, .../ray/dashboard/agent.py)."""
    import ray

    home = os.path.dirname(os.path.abspath(ray.__file__)) + os.sep
    return cmd.startswith("ray::") or any(arg.startswith(home) for arg in cmd.split(" ")[:3])


def in_session(pid: int, session: str) -> bool:
    """Whether process `pid` names Ray's session directory `session` in its command line (Ray's binaries and
    scripts) or has a file open in it (a `ray::` worker or agent, whose title replaced its command line,
    writes its logs there)."""
    if not (session.startswith("/") and os.path.basename(session).startswith("session_")):
        return False
    if re.search(re.escape(session) + r"(/|\s|$)", cmdline(pid) or ""):
        return True
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(session + os.sep):
                return True
        except OSError:
            continue
    return False


def ray_descendants() -> list[int]:
    """This process's descendants that are Ray's (ray_s): a driver inside a test or a notebook has other
    children, never touched."""
    return [p for p in descendants(os.getpid()) if ray_s(cmdline(p) or "")]


_watch = {"stop": None}  # the one thread keeping this process's record current


def record(store: Store, every_s: float = WATCH_S) -> None:
    """Write what this driver's Ray runs as (GCS, raylet, agents, monitors), and keep it current from a
    daemon thread (the workers Ray starts later for the trials), rewritten when the set of processes
    changes; the thread ends with Ray (no process left) or when a later call replaces it."""
    import threading

    if _watch["stop"] is not None:
        _watch["stop"].set()
    stop = _watch["stop"] = threading.Event()
    seen = {"pids": _write_record(store)}

    def keep() -> None:
        while not stop.wait(every_s):
            now = set(ray_descendants())
            if not now:
                return  # Ray was shut down: what the record names has ended
            if now != seen["pids"]:
                seen["pids"] = _write_record(store)

    threading.Thread(target=keep, name="study-ray-processes", daemon=True).start()


def _write_record(store: Store) -> set[int]:
    me = os.getpid()
    procs = [{"pid": p, "start": proc_start(p), "cmdline": cmdline(p)} for p in ray_descendants()]
    info = {"driver": me, "start": proc_start(me), "session": session_dir(), **machine(),
            "processes": [p for p in procs if p["start"] and p["cmdline"]]}
    try:
        store.write_bytes(store.path(*RECORD), json.dumps(info, sort_keys=True).encode())
    except OSError:
        pass  # a record that cannot be written costs only the clean-up of a later kill
    return {p["pid"] for p in procs}


def session_dir() -> str | None:
    """The session directory of the Ray this process started (None before ray.init)."""
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    return node.get_session_dir_path() if node is not None else None


def end_left_over(store: Store, echo) -> int:
    """End the recorded Ray processes of an earlier driver of this study that are still running (this
    driver holds the lease); says so through `echo`. Returns how many were ended."""
    raw = store.read_bytes(store.path(*RECORD)) if store.exists(store.path(*RECORD)) else None
    try:
        info = loads_json(raw) if raw else {}
    except ValueError:
        info = {}
    if not isinstance(info, dict) or not info.get("processes"):
        return 0
    me = machine()
    if not me["boot"] or any(info.get(k) != me[k] for k in ("host", "boot", "pidns")):
        return 0  # another machine's PIDs
    driver = info.get("driver")
    if isinstance(driver, int) and driver != os.getpid() and proc_start(driver) == info.get("start"):
        return 0  # its driver lives (a released lease, a driver still ending): its own shutdown ends them
    session = info.get("session") if isinstance(info.get("session"), str) else ""
    if not session.endswith(f"_{driver}"):
        return 0  # not the session of the recorded driver's own Ray (Ray names it after the driver's PID)
    left = [p for p in info["processes"] if isinstance(p, dict) and isinstance(p.get("pid"), int)
            and p["pid"] != os.getpid() and proc_start(p["pid"]) == p.get("start")
            and cmdline(p["pid"]) == p.get("cmdline") and ray_s(p["cmdline"]) and in_session(p["pid"], session)]
    _end([(p["pid"], p["start"]) for p in left])
    if left:
        names = sorted({os.path.basename(p["cmdline"].split(" ")[0]) for p in left})
        echo(f"ray: ended {len(left)} Ray process(es) left running by the earlier driver pid {driver} of this "
             f"study ({', '.join(names)}; PIDs {', '.join(str(p['pid']) for p in left)})")
    return len(left)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _end(procs: list[tuple[int, str | None]]) -> None:
    """End each (pid, start time) that is still that process: SIGTERM, then SIGKILL after GRACE_S."""
    for p, _ in procs:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(proc_start(p) == s for p, s in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p, s in procs:
        if proc_start(p) == s:
            _signal(p, signal.SIGKILL)


def end_own(shutdown=lambda: None) -> None:
    """End this process's Ray processes (what a failed or interrupted start of an embedded Ray left), as they
    are before `shutdown` (ray.shutdown: it ends the raylet, whose agents would outlive it, orphaned)."""
    mine = [(p, proc_start(p)) for p in ray_descendants()]
    shutdown()
    _end(mine)
