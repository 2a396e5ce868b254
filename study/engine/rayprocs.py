"""The Ray processes an embedded Ray started, recorded in the study's store beside its lease, so that the
next driver of the study ends what a killed one (SIGKILL, a crash) left running.

A SIGKILLed driver takes its GCS and raylet with it, but the raylet's agents (DashboardAgent,
RuntimeEnvAgent) live on, and a rerun stalled on "Failed to connect to GCS". The driver writes
`<study>/lease/ray.json` (its PID and start time, the machine, and each descendant's PID, start time and
command line) once Ray has started; the next driver, which holds the lease (so the recorder is not
running the study), ends each recorded process that is still that process (same machine, same start
time, same command line) before it starts Ray: SIGTERM, then SIGKILL after GRACE_S. A PID reused by
another process since is never touched, nor, whatever the record says (anyone who can write to the store
writes it), a process that is not Ray's by the test that recorded it (a `ray::` worker, or a binary or
script of the Ray install this driver imports) or not of the recorded Ray session, the recorded driver's
(its session directory in the command line or, for a worker, a file of it open).
"""
from __future__ import annotations

import json
import os
import re
import signal
import time

from atomicio import loads_json
from store import Store
from store.lease import machine, proc_start

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
    for p in left:
        _signal(p["pid"], signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(proc_start(p["pid"]) == p["start"] for p in left) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in left:
        if proc_start(p["pid"]) == p["start"]:
            _signal(p["pid"], signal.SIGKILL)
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


def end_own(shutdown=lambda: None) -> None:
    """End this process's Ray processes (what a failed or interrupted start of an embedded Ray left), as they
    are before `shutdown` (ray.shutdown: it ends the raylet, whose agents would outlive it, orphaned):
    SIGTERM, then SIGKILL after GRACE_S."""
    mine = [(p, proc_start(p)) for p in ray_descendants()]
    shutdown()
    for p, _ in mine:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(proc_start(p) == s for p, s in mine) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p, s in mine:
        if proc_start(p) == s:
            _signal(p, signal.SIGKILL)
