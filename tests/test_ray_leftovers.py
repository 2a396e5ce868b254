"""No Ray process outlives the driver that started it: under an address-space limit `study run` refuses in
one line before Ray starts; a failed start ends what it started; the next driver of a study ends what a
SIGKILLed one left (by the PIDs it recorded, checked by start time and command line).

Run: pytest tests/test_ray_leftovers.py   (the SIGKILLed driver: pytest -m slow tests/test_ray_leftovers.py)
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from store import Store
from store.lease import machine, proc_start
from study.engine import raystart
from tests.helpers import ROOT, alive, descendants, held, kill_all, study_cmd, tiny_grid, wait_training


def in_session(sid: int) -> list[int]:
    """Live processes of session `sid` (a child started with start_new_session: its descendants keep the
    session when they are reparented)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 4 and int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(d))
    return out


def run_to_end(args: list[str], out) -> tuple[int, int, str]:
    """`args` in a session of its own, run to its end: (exit code, session id, output)."""
    p = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, stdout=open(out, "w"),
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = p.wait(timeout=600)
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    return code, p.pid, open(out).read()


def test_study_run_under_an_address_space_limit_refuses_in_one_line_before_ray_starts(tmp_path):
    """Was: three "timed out during startup" attempts over up to 220 s, "GCS has become overloaded", and
    `mmap failed: Cannot allocate memory` only in raylet.out. The limit is a real one on the driver
    (prlimit --as), 2 GiB over the object store Ray would map: room for Python, not for a worker."""
    from ray._private.utils import estimate_available_memory, resolve_object_store_memory

    limit = resolve_object_store_memory(estimate_available_memory()) + (2 << 30)
    gpath = tmp_path / "g.yaml"
    gpath.write_text(tiny_grid("aslimit"))
    code, sid, out = run_to_end(["prlimit", f"--as={limit}",
                                 *study_cmd("run", str(gpath), "--results", str(tmp_path / "r"))], tmp_path / "out")
    left = in_session(sid)
    kill_all(left)
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1, out
    assert "address-space limit (ulimit -v)" in errors[0] and "mmap" in errors[0] and "ulimit -v unlimited" in errors[0]
    assert "timed out" not in out and "Traceback" not in out and "ray: started" not in out, out
    assert not left, out


# slow set (8 s under load); the default suite keeps the address-space refusal before Ray starts)
@pytest.mark.slow
def test_a_failed_embedded_start_ends_what_it_started(monkeypatch):
    """Every attempt's Ray is started for real and then reported failed as a raylet that missed its window
    is: after the last, no Ray process of this test's process is left (the last attempt's stayed up)."""
    import ray

    assert not ray.is_initialized(), "an earlier test left its Ray running"
    real_init = ray.init

    def late(*a, **kw):
        real_init(*a, **kw)
        raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.setattr(ray, "init", late)
    monkeypatch.setattr(raystart, "START_ATTEMPTS", 2)
    with pytest.raises(Exception, match="timed out during startup"):
        raystart.init_ray(None, num_cpus=1)
    assert not ray.is_initialized()
    assert not raystart.ray_descendants()


def _session(driver: int) -> str:
    """A session directory as Ray names the one a driver's embedded Ray runs in (time, then the driver's PID)."""
    return f"/tmp/ray/session_2026-01-01_00-00-00_000000_{driver}"


def _record(store: Store, driver: int, driver_start, procs: list[dict], session: str) -> None:
    store.write_bytes(store.path(*raystart.RECORD), json.dumps(
        {"driver": driver, "start": driver_start, "session": session, **machine(), "processes": procs}).encode())


def _like_ray(session: str) -> subprocess.Popen:
    """A process that is Ray's by the recorder's test: named as a binary of the Ray install this process
    imports, with a session directory on its command line (a Python that sleeps)."""
    import ray

    raylet = os.path.join(os.path.dirname(os.path.abspath(ray.__file__)), "core", "src", "ray", "raylet", "raylet")
    return subprocess.Popen([raylet, "-c", "import time; time.sleep(300)", f"--session-dir={session}"],
                            executable=sys.executable)


def _entry(p: subprocess.Popen) -> dict:
    for _ in range(50):  # its command line as /proc says it once Python has started
        if "--session-dir=" in (raystart.cmdline(p.pid) or ""):
            break
        time.sleep(0.1)
    return {"pid": p.pid, "start": proc_start(p.pid), "cmdline": raystart.cmdline(p.pid)}


def _dead() -> int:
    """The PID of a process that has ended (a driver gone)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_forged_record_never_ends_a_process_that_is_not_ray_s(tmp_path):
    """Was: a record naming a `sleep 600` of this user (its real PID, start time and command line, readable
    by anyone from /proc) under a dead driver made the next `study run` end it. Only a process that is Ray's
    (a `ray::` worker, a binary or script of this Ray install) of the recorded session is ever ended."""
    store, gone, other_driver = Store(str(tmp_path), "s"), _dead(), _dead()
    sleep, other = subprocess.Popen(["sleep", "600"]), _like_ray(_session(other_driver))
    try:
        _record(store, gone, "1", [{"pid": sleep.pid, "start": proc_start(sleep.pid), "cmdline": "sleep 600"},
                                   _entry(other)], _session(gone))
        lines: list[str] = []
        assert raystart.end_left_over(store, lines.append) == 0 and not lines
        assert alive(sleep.pid) and alive(other.pid)  # not Ray's; Ray's, of another session
        for session in ("/etc", _session(other_driver)):  # no Ray session; another driver's
            _record(store, gone, "1", [_entry(other)], session)
            assert raystart.end_left_over(store, lines.append) == 0 and alive(other.pid)
    finally:
        for p in (sleep, other):
            p.kill()
            p.wait()


def test_only_the_recorded_processes_of_a_dead_driver_are_ended(tmp_path):
    """A recorded PID is ended only while it is the same process (start time and command line) and its
    driver is gone; a live driver's record, a reused PID and another machine's record end nothing."""
    store = Store(str(tmp_path), "s")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a driver that has ended
    victim = _like_ray(_session(gone.pid))
    try:
        me = _entry(victim)
        lines: list[str] = []
        _record(store, os.getppid(), proc_start(os.getppid()), [me], _session(gone.pid))  # its driver lives
        assert raystart.end_left_over(store, lines.append) == 0 and alive(victim.pid)
        _record(store, gone.pid, "1", [{**me, "start": "1"}], _session(gone.pid))  # the PID was reused since
        assert raystart.end_left_over(store, lines.append) == 0 and alive(victim.pid)
        _record(store, gone.pid, "1", [{**me, "cmdline": me["cmdline"] + "1"}], _session(gone.pid))
        assert raystart.end_left_over(store, lines.append) == 0 and alive(victim.pid)
        info = {**machine(), "boot": "another-boot"}
        store.write_bytes(store.path(*raystart.RECORD), json.dumps(
            {"driver": gone.pid, "start": "1", **info, "processes": [me]}).encode())
        assert raystart.end_left_over(store, lines.append) == 0 and alive(victim.pid)
        assert not lines
        _record(store, gone.pid, "1", [me], _session(gone.pid))
        assert raystart.end_left_over(store, lines.append) == 1
        victim.wait(timeout=10)
        assert lines == [f"ray: ended 1 Ray process(es) left running by the earlier driver pid {gone.pid} of this "
                         f"study (raylet; PIDs {victim.pid})"]
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


@pytest.mark.slow
def test_a_rerun_ends_the_ray_processes_a_sigkilled_driver_left(tmp_path):
    """Was: the raylet's agents (DashboardAgent, RuntimeEnvAgent) outlived a SIGKILLed driver, and a rerun
    stalled on "Failed to connect to GCS". The rerun ends them by the PIDs the killed driver recorded."""
    from study.spec.grid import load_grid

    gpath = tmp_path / "k.yaml"
    gpath.write_text(tiny_grid("killed", steps=30))
    grid, results = load_grid(str(gpath)), str(tmp_path / "results")
    store = Store(results, "killed")
    a = subprocess.Popen(study_cmd("run", str(gpath), "--results", results), cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT, **held(grid.runs, at=15)}, start_new_session=True,
                         stdout=open(tmp_path / "a.out", "w"), stderr=subprocess.STDOUT)
    left: list[int] = []
    try:
        wait_training(a, store, tmp_path / "a.out", n=2)
        tree = descendants(a.pid)
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        time.sleep(2)  # what dies with the driver (its GCS, raylet, workers) has died by now
        left = [p for p in tree if alive(p)]
        agents = [p for p in left if raystart.cmdline(p) in ("ray::DashboardAgent", "ray::RuntimeEnvAgent")]
        recorded = {p["pid"] for p in json.loads(store.read_bytes(store.path(*raystart.RECORD)))["processes"]}
        assert set(left) <= recorded, (left, recorded)
        code, _, out = run_to_end(study_cmd("run", str(gpath), "--results", results, "--num-cpus", "2"),
                                  tmp_path / "b.out")
        assert code == 0, out
        assert "Failed to connect to GCS" not in out, out
        assert not [p for p in left if alive(p)], (left, out)
        if agents:  # the trials' workers may end on their own before the rerun; the agents never do
            assert re.search(rf"ray: ended \d+ Ray process\(es\) left running by the earlier driver pid {a.pid} "
                             rf"of this study \(.*ray::DashboardAgent", out), out
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGKILL)
            a.wait()
        kill_all([p for p in left if alive(p)])


def _ctrl_c(tmp_path, ready, env: dict | None = None) -> tuple[int, str, list[int]]:
    """`study run` of a tiny grid in a session of its own; once `ready(pid)`, SIGINT to its whole process group
    (as a terminal's Ctrl-C); (exit code, output, processes of its session still alive 5 s after it exited).
    Everything it left is killed by PID."""
    gpath = tmp_path / "g.yaml"
    gpath.write_text(tiny_grid("ctrlc", steps=60))
    out = tmp_path / "out"
    p = subprocess.Popen(study_cmd("run", str(gpath), "--results", str(tmp_path / "r"), "--num-cpus", "1"), cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT, **(env or {})}, stdout=open(out, "w"),
                         stderr=subprocess.STDOUT, start_new_session=True)
    left: list[int] = []
    try:
        deadline = time.time() + 300
        while not ready(p.pid) and p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGINT)
        code = p.wait(timeout=120)
        time.sleep(5)
        left = [q for q in in_session(p.pid) if alive(q)]
    finally:
        if p.poll() is None:
            left.append(p.pid)
        kill_all(left)
    return code, open(out).read(), left


def _one_interrupted_line(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("interrupted") and "again resumes" in ln]


@pytest.mark.slow
def test_a_ctrl_c_during_ray_start_exits_130_and_leaves_no_process(tmp_path):
    """Was: a Ctrl-C while Ray started printed only `^C` and left the raylet's two agents running (parent
    PID 1). The Ctrl-C lands once the driver's GCS exists and before Ray says it started."""
    def starting(pid: int) -> bool:
        return any("gcs_server" in (raystart.cmdline(q) or "") for q in descendants(pid))

    code, out, left = _ctrl_c(tmp_path, starting)
    assert "ray: started" not in out, out  # the Ctrl-C came during the start
    assert code == 130 and len(_one_interrupted_line(out)) == 1 and "Traceback" not in out, out
    assert not left, (out, [raystart.cmdline(q) for q in left])


@pytest.mark.slow
def test_a_ctrl_c_in_training_exits_130_with_one_line_and_leaves_no_process(tmp_path):
    """Was: exit 1 in one try and 130 in another. Both runs are held mid-training (a fault) when the Ctrl-C
    reaches the driver's whole process group."""
    from study.spec.grid import load_grid

    (tmp_path / "g0.yaml").write_text(tiny_grid("ctrlc", steps=60))
    runs = load_grid(str(tmp_path / "g0.yaml")).runs
    progress = tmp_path / "r" / "ctrlc" / "progress"

    def training(pid: int) -> bool:
        return progress.is_dir() and len(os.listdir(progress)) >= 1

    code, out, left = _ctrl_c(tmp_path, training, env=held(runs, at=15))
    assert code == 130 and len(_one_interrupted_line(out)) == 1 and "Traceback" not in out, out
    assert "interrupted: " in out and "`study run` again resumes" in out, out
    assert not left, (out, [raystart.cmdline(q) for q in left])
