"""One driver per study (store/lease.py): a second driver is refused within 10 s naming the holder, or
waits (--wait); a dead holder's lease is taken over and no run trains twice; the same on moto S3.

The drivers are real `study run` processes; every wait below is on an observable state (a lease file,
a heartbeat, an output line), never on a sleep, so a slow machine only makes the tests slower. A first
attempt of each run is held mid-training (RMDM_FAULT_HOLD_AT) so the first driver cannot finish early.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from tests.helpers import ROOT, alive, check_resumed, descendants, held, kill_all, study_cmd, tiny_grid, wait_training
from tests.test_s3 import s3_env, s3_root  # noqa: F401  (the moto server fixtures, reused)
from study.engine.options import RunOptions

# short heartbeats so that they run during the tests; the timeout stays far above them (same-machine
# death is detected from the process itself, so nothing here waits for a timeout)
LEASE_ENV = {"RMDM_LEASE_BEAT_S": "1", "RMDM_LEASE_TTL_S": "60", "RMDM_LEASE_POLL_S": "0.5"}
HOLD_AT = 15  # after the checkpoint at step 10


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": ROOT, **LEASE_ENV, **extra}


def _start(gpath, results, out, env) -> subprocess.Popen:
    return subprocess.Popen(study_cmd("run", str(gpath), "--results", results, "--num-cpus", "2",
                                      "--progress-every", "2"), cwd=ROOT, env=env, start_new_session=True,
                            stdout=open(out, "w"), stderr=subprocess.STDOUT)


def _held_by(store, pid: int, drv, out, timeout: float = 300) -> dict:
    from store.lease import current

    deadline = time.time() + timeout
    while time.time() < deadline:
        assert drv.poll() is None, open(out).read()
        h = current(store)
        if h is not None and h.info.get("pid") == pid and h.info.get("state") == "held":
            return h.info
        time.sleep(0.2)
    raise AssertionError(f"no lease held by pid {pid} within {timeout:.0f} s: " + open(out).read())


def _refused_fast(gpath, results, holder_pid: int, env) -> str:
    """A second `study run` exits 2 within 10 s with one line naming the holder (host, PID, since)."""
    t0 = time.time()
    r = subprocess.run(study_cmd("run", str(gpath), "--results", results), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120, start_new_session=True)
    took = time.time() - t0
    assert r.returncode == 2, r.stdout + r.stderr
    assert took < 10, f"refused after {took:.1f} s"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and not r.stdout.strip(), r.stdout + r.stderr
    assert f"pid {holder_pid} " in lines[0] and socket.gethostname() in lines[0] and " since 20" in lines[0], lines
    assert "--wait" in lines[0]
    return lines[0]


def _attempts(store, run_id: str) -> list[str]:
    return (store.read_bytes(store.path("logs", f"{run_id}.attempts")) or b"").decode().splitlines()


def _held_trials(store, drv) -> list[int]:
    """PIDs of the held trials (from their heartbeats), each checked to be a process of `drv`."""
    pids = [int(b["pid"]) for b in store.read_progress().values() if b.get("phase") == "train"]
    mine = set(descendants(drv.pid))
    assert pids and set(pids) <= mine, (pids, sorted(mine))
    return pids


# ---- the lease itself, in this process -------------------------------------------------------------
def test_lease_refuses_releases_and_takes_over(tmp_path, monkeypatch):
    from store import Store
    from store.lease import LeaseHeld, LeaseLost, acquire, current, fence, status_line

    for k, v in LEASE_ENV.items():
        monkeypatch.setenv(k, v)
    store = Store(str(tmp_path), "unit")
    first = acquire(store, "run")
    with pytest.raises(LeaseHeld) as e:
        acquire(store, "run")
    assert f"pid {os.getpid()} " in str(e.value) and socket.gethostname() in str(e.value)
    assert "heartbeat fresh" in status_line(store)
    check = fence(store, first.fence)
    check()  # still ours
    first.release()
    assert "free" in status_line(store) and "released" in status_line(store)

    # released: the next one takes the next generation
    second = acquire(store, "tune")
    assert second.gen == first.gen + 1 and current(store).info["command"] == "tune"
    # a holder on another machine that stopped beating 61 s ago (its own clock) is taken over...
    second.release()
    third = acquire(store, "run")
    third._stop.set()  # its heartbeat stops, as a lost machine's would
    third._thread.join()
    forged = dict(third.info, host="elsewhere.example", beat=time.time() - 61)
    with open(third.path, "w") as f:
        json.dump(forged, f)
    assert "heartbeat stale" in status_line(store)
    said = []
    fourth = acquire(store, "run", echo=said.append)
    assert fourth.gen == third.gen + 1 and "no heartbeat for over 60s" in said[0] and "elsewhere.example" in said[0]
    # ... and the old holder, should it wake up, finds it lost the lease and stops; so do its trials
    assert third.beat() is False and third.lost.info["token"] == fourth.token
    third.lost = None
    third.release()  # marks nothing: a newer generation exists
    assert current(store).info["token"] == fourth.token and current(store).info["state"] == "held"
    with pytest.raises(LeaseLost):
        fence(store, third.fence)()
    # ... but one on another machine that beat a moment ago holds it
    fourth._stop.set()
    fourth._thread.join()
    with open(fourth.path, "w") as f:
        json.dump(dict(fourth.info, host="elsewhere.example", beat=time.time()), f)
    with pytest.raises(LeaseHeld):
        acquire(store, "run")

    # a holder on this machine whose process is gone is taken over at once, whatever its heartbeat says
    gone = subprocess.Popen(["true"])
    gone.wait()
    with open(fourth.path, "w") as f:
        json.dump(dict(fourth.info, pid=gone.pid, beat=time.time()), f)
    assert "process has ended" in status_line(store)
    said.clear()
    fifth = acquire(store, "run", echo=said.append)
    assert "its process has ended" in said[0]
    fourth.release()  # a lease taken over is not marked released by its old holder
    assert current(store).info["token"] == fifth.token and current(store).info["state"] == "held"
    fifth.release()
    # old generations are pruned: the newest and the one it replaced remain
    assert len(os.listdir(tmp_path / "unit" / "lease")) == 2


def test_one_taker_of_a_dead_holders_lease_on_disk(tmp_path, monkeypatch):
    """Four contenders at once for a lease whose holder died: exactly one takes it (an exclusive link)."""
    from store import Store
    from store.lease import LeaseHeld, acquire, current

    for k, v in LEASE_ENV.items():
        monkeypatch.setenv(k, v)
    gone = subprocess.Popen(["true"])
    gone.wait()
    for round_ in range(3):
        store = Store(str(tmp_path), "race")
        old = acquire(store, "run")
        old.release()
        with open(old.path, "w") as f:  # its holder died holding it
            json.dump(dict(old.info, state="held", pid=gone.pid), f)
        barrier = threading.Barrier(4)
        got, refused, errors = [], [], []

        def contend():
            barrier.wait()
            try:
                got.append(acquire(Store(str(tmp_path), "race"), "run", echo=lambda m: None))
            except LeaseHeld as e:
                refused.append(str(e))
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

        threads = [threading.Thread(target=contend) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and len(got) == 1 and len(refused) == 3, (round_, got, refused, errors)
        assert current(store).info["token"] == got[0].token and got[0].gen == old.gen + 1
        got[0].release()


def test_study_tune_shares_the_lease_with_study_run(tmp_path, monkeypatch):
    """`study tune` on a study a driver holds is refused in one line, exit 2, as `study run` is; the
    full check (past the early one of the command line) refuses too."""
    from store import Store
    from store.lease import LeaseHeld, acquire
    from study.spec.grid import load_grid
    from study.engine.tune import tune_grid
    from tests.test_tune import search_grid, write

    for k, v in LEASE_ENV.items():
        monkeypatch.setenv(k, v)
    results = str(tmp_path / "results")
    gpath = write(tmp_path / "tunelease.yaml", search_grid("tunelease"))
    with acquire(Store(results, "tunelease"), "run"):
        r = subprocess.run(study_cmd("tune", gpath, "--results", results), cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stdout + r.stderr
        assert f"`study run` on {socket.gethostname()} pid {os.getpid()} " in r.stderr, r.stderr
        with pytest.raises(LeaseHeld):
            tune_grid(load_grid(gpath), results, RunOptions(echo=lambda *_: None))


def test_bad_lease_settings_are_one_line(tmp_path, monkeypatch):
    from store import Store
    from store.lease import acquire

    monkeypatch.setenv("RMDM_LEASE_TTL_S", "nan")
    with pytest.raises(ValueError, match="RMDM_LEASE_TTL_S"):
        acquire(Store(str(tmp_path), "bad"), "run")
    monkeypatch.setenv("RMDM_LEASE_TTL_S", "1")
    monkeypatch.setenv("RMDM_LEASE_BEAT_S", "1")
    with pytest.raises(ValueError, match="at least twice"):
        acquire(Store(str(tmp_path), "bad"), "run")


# ---- two real drivers ------------------------------------------------------------------------------
@pytest.mark.slow  # three real drivers; the refusal is also held by test_lease_refuses_releases_and_takes_over
def test_second_driver_refused_then_waits_then_runs(tmp_path):
    """Driver A holds the study (its runs held mid-training); B is refused within 10 s naming A; W
    (--wait) waits; status names A; once A ends (its held trials killed, retried, finished), W and then C
    run and find nothing to do: every run was started by A only (attempt logs)."""
    from store import Store
    from study.spec.grid import load_grid

    gpath = tmp_path / "lease.yaml"
    gpath.write_text(tiny_grid("lease", steps=30))
    grid = load_grid(str(gpath))
    results = str(tmp_path / "results")
    store = Store(results, "lease")
    a = _start(gpath, results, tmp_path / "a.out", _env(**held(grid.runs, at=HOLD_AT)))
    w = None
    try:
        info = _held_by(store, a.pid, a, tmp_path / "a.out")
        wait_training(a, store, tmp_path / "a.out", n=2)
        line = _refused_fast(gpath, results, a.pid, _env())
        assert time.strftime("%Y-%m-%d", time.gmtime(info["since"])) in line

        w = subprocess.Popen(study_cmd("run", str(gpath), "--results", results, "--wait"), cwd=ROOT, env=_env(),
                             start_new_session=True, stdout=open(tmp_path / "w.out", "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while "waiting for it to end" not in (tmp_path / "w.out").read_text():
            assert w.poll() is None and time.time() < deadline, (tmp_path / "w.out").read_text()
            time.sleep(0.2)

        r = subprocess.run(study_cmd("status", str(gpath), "--results", results), cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert f"lease: held by `study run` on {socket.gethostname()} pid {a.pid} " in r.stdout, r.stdout
        assert "heartbeat fresh" in r.stdout, r.stdout

        kill_all(_held_trials(store, a))  # A's first attempts end; Tune retries them and they finish
        assert a.wait(timeout=600) == 0, (tmp_path / "a.out").read_text()
        assert w.wait(timeout=300) == 0, (tmp_path / "w.out").read_text()
    finally:
        for p in (a, w):
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
    assert "2 done" in (tmp_path / "a.out").read_text()
    assert "2 done, 0 to run" in (tmp_path / "w.out").read_text()

    r = subprocess.run(study_cmd("run", str(gpath), "--results", results), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300, start_new_session=True)
    assert r.returncode == 0 and "2 done, 0 to run" in r.stdout, r.stdout + r.stderr
    for run in grid.runs:
        starts = _attempts(store, run.run_id)
        assert len(starts) == 2 and all(" run pid " in s for s in starts), starts  # A's held attempt, A's retry
    runs = store.read("runs")
    assert sorted(runs.run_id) == sorted(r.run_id for r in grid.runs) and (runs.status == "done").all()
    hist = store.read("history")
    assert not hist.duplicated(["run_id", "step"]).any()
    r = subprocess.run(study_cmd("status", str(gpath), "--results", results), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert "lease: free" in r.stdout and "released" in r.stdout, r.stdout


@pytest.mark.slow  # a real driver; the release itself also: test_lease_refuses_releases_and_takes_over
def test_sigterm_releases_the_lease(tmp_path):
    """SIGTERM (a scheduler stopping the job) ends the driver as Ctrl-C does: the lease is released."""
    from store import Store
    from store.lease import current
    from study.spec.grid import load_grid

    gpath = tmp_path / "term.yaml"
    gpath.write_text(tiny_grid("term", steps=30, axes="L: [1]"))
    grid = load_grid(str(gpath))
    results = str(tmp_path / "results")
    store = Store(results, "term")
    a = _start(gpath, results, tmp_path / "a.out", _env(**held(grid.runs[:1], at=HOLD_AT)))
    tree: list[int] = []
    try:
        _held_by(store, a.pid, a, tmp_path / "a.out")
        wait_training(a, store, tmp_path / "a.out", n=1)
        tree = descendants(a.pid)
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=300)
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGKILL)
            a.wait()
        kill_all([p for p in tree if alive(p)])
    h = current(store)
    assert h.info["pid"] == a.pid and h.info["state"] == "released", (h.info, (tmp_path / "a.out").read_text())


@pytest.mark.slow  # a real driver; a lease lost once replaced: also the conditional-lease test below (S3)
def test_driver_that_lost_its_lease_stops(tmp_path):
    """A driver that finds a newer generation of its lease (it was taken over while it stalled) stops its
    trials as Ctrl-C does, writes no `failed` rows and leaves the newer holder's lease alone."""
    from store import Store
    from store.lease import current, lease_dir
    from study.spec.grid import load_grid

    gpath = tmp_path / "lost.yaml"
    gpath.write_text(tiny_grid("lost", steps=30, axes="L: [1]"))
    grid = load_grid(str(gpath))
    results = str(tmp_path / "results")
    store = Store(results, "lost")
    a = _start(gpath, results, tmp_path / "a.out", _env(**held(grid.runs[:1], at=HOLD_AT)))
    tree: list[int] = []
    try:
        info = _held_by(store, a.pid, a, tmp_path / "a.out")
        wait_training(a, store, tmp_path / "a.out", n=1)
        tree = descendants(a.pid)
        # another driver (this test's process: alive, on this machine) took the next generation
        newer = dict(info, gen=info["gen"] + 1, token="f" * 32, pid=os.getpid(), since=time.time(), beat=time.time())
        with open(f"{lease_dir(store)}/g{info['gen'] + 1:010d}.json", "w") as f:
            json.dump(newer, f)
        code = a.wait(timeout=300)
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGKILL)
            a.wait()
        kill_all([p for p in tree if alive(p)])
    out = (tmp_path / "a.out").read_text()
    assert code == 1 and f"lost the study's lease to `study run` on {socket.gethostname()} pid {os.getpid()} " in out, out
    assert store.read("runs").empty, store.read("runs")  # no failed row from the driver that lost
    assert current(store).info["token"] == "f" * 32 and current(store).info["state"] == "held"


def _killed_holder_taken_over(gpath, grid, results, store, tmp_path, env_extra: dict) -> None:
    """A holds the study mid-training; B is refused; A is SIGKILLed by its handle; C takes over at once
    (A's process is gone), resumes every run from its checkpoint, and no run trains twice."""

    a = _start(gpath, results, tmp_path / "a.out", _env(**env_extra, **held(grid.runs, at=HOLD_AT)))
    tree: list[int] = []
    try:
        _held_by(store, a.pid, a, tmp_path / "a.out")
        wait_training(a, store, tmp_path / "a.out", n=2)
        _refused_fast(gpath, results, a.pid, _env(**env_extra))
        tree = descendants(a.pid)
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGKILL)
            a.wait()
    try:
        r = subprocess.run(study_cmd("status", str(gpath), "--results", results), cwd=ROOT, env=_env(**env_extra),
                           capture_output=True, text=True, timeout=120)
        assert f"pid {a.pid} " in r.stdout and "process has ended" in r.stdout, r.stdout + r.stderr
        first = {r.run_id: _attempts(store, r.run_id) for r in grid.runs}
        assert all(len(v) == 1 for v in first.values()), first

        r = subprocess.run(study_cmd("run", str(gpath), "--results", results, "--num-cpus", "2"), cwd=ROOT,
                           env=_env(**env_extra), capture_output=True, text=True, timeout=600, start_new_session=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"lease: took over study {grid.study} from `study run` on {socket.gethostname()} pid {a.pid} " \
               in r.stdout and "its process has ended" in r.stdout, r.stdout
    finally:
        kill_all([p for p in tree if alive(p)])  # Ray's processes of the killed driver, if any outlived it
    for run in grid.runs:
        starts = _attempts(store, run.run_id)
        # one start by the killed driver, one by the next: never two drivers on one run
        assert len(starts) == 2 and starts[0] == first[run.run_id][0], starts
    check_resumed(store, grid, [r.run_id for r in grid.runs], steps=30)


@pytest.mark.slow  # real drivers; held in part by test_one_taker_of_a_dead_holders_lease_on_disk, test_resume.py
def test_killed_holder_is_taken_over_and_no_run_trains_twice(tmp_path):
    from store import Store
    from study.spec.grid import load_grid

    gpath = tmp_path / "killed.yaml"
    gpath.write_text(tiny_grid("killed", steps=30))
    results = str(tmp_path / "results")
    _killed_holder_taken_over(gpath, load_grid(str(gpath)), results, Store(results, "killed"), tmp_path, {})


# ---- on S3 (moto) ----------------------------------------------------------------------------------
@pytest.fixture
def lease_root(s3_root):  # noqa: F811
    """A results root of its own in the moto bucket: moto keeps one in-process state across servers, and
    tests/test_s3.py lists the studies under its own root."""
    return s3_root.replace("/results?", "/lease-results?", 1)


@pytest.mark.parametrize("mode", ["conditional", "settle", "mixed"])
def test_one_of_two_simultaneous_takers_wins_on_s3(lease_root, monkeypatch, mode):
    """Two contenders at the same moment on the object store, each with conditional writes (If-None-Match,
    If-Match through boto3), neither (the claim/settle protocol: boto3 missing) or one of each: exactly one
    holds. The conditional holder's file is the generation's own (no token in its name)."""
    import store.lease as lease_mod
    from store import Store
    from store.lease import LeaseHeld, acquire, current

    for k, v in LEASE_ENV.items():
        monkeypatch.setenv(k, v)
    probe = lease_mod.conditional_writes
    plain = {"conditional": (), "settle": ("t0", "t1"), "mixed": ("t1",)}[mode]
    monkeypatch.setattr(lease_mod, "conditional_writes",
                        lambda st: None if threading.current_thread().name in plain else probe(st))
    for round_ in range(3):
        barrier = threading.Barrier(2)
        got, refused, errors, said = [], [], [], []

        def contend():
            store = Store(lease_root, f"race-{mode}")
            barrier.wait()
            try:
                got.append(acquire(store, "run", echo=said.append))
            except LeaseHeld as e:
                refused.append(str(e))
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

        threads = [threading.Thread(target=contend, name=f"t{i}") for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and len(got) == 1 and len(refused) == 1, (round_, got, refused, errors)
        h = current(Store(lease_root, f"race-{mode}"))
        assert h.info["token"] == got[0].token
        assert (got[0].cas is not None) == (h.path.endswith(f"g{h.gen:010d}.json")), h.path
        assert ("takes no conditional writes" in " ".join(said)) == bool(plain), said
        got[0].release()
    if mode == "conditional":
        assert got[0].cas is not None


def test_a_conditional_lease_renews_if_unchanged_and_is_lost_once_replaced(lease_root, monkeypatch):
    """S3 with conditional writes: each heartbeat rewrites the lease file If-Match its last ETag; a file
    that someone else rewrote (its ETag changed) is a lost lease, not one written over."""
    from store import Store
    from store.lease import acquire, current

    for k, v in LEASE_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("RMDM_LEASE_BEAT_S", "30")  # the test beats by hand
    store = Store(lease_root, "renew")
    lost = []
    lease = acquire(store, "run", on_lost=lost.append)
    try:
        assert lease.cas is not None and lease.etag
        first = lease.etag
        assert lease.beat() and lease.etag != first and current(store).info["beat"] == lease.info["beat"]
        with store.fs.open_output_stream(lease.path) as f:  # another writer, unconditional
            f.write(json.dumps({**lease.info, "pid": -1}).encode())
        assert not lease.beat() and lease.lost is not None and lost
        assert current(store).info["pid"] == -1  # not written over
    finally:
        lease.release()
    assert current(store).info["pid"] == -1 and current(store).info["state"] == "held"  # release wrote nothing


@pytest.mark.slow
def test_two_drivers_and_a_killed_holder_on_s3(lease_root, s3_env, tmp_path):  # noqa: F811
    from store import Store
    from study.spec.grid import load_grid

    gpath = tmp_path / "s3lease.yaml"
    gpath.write_text(tiny_grid("s3lease", steps=30))
    store = Store(lease_root, "s3lease")
    try:
        _killed_holder_taken_over(gpath, load_grid(str(gpath)), lease_root, store, tmp_path, s3_env)
    finally:
        import shutil

        shutil.rmtree(store.data_dir(), ignore_errors=True)  # this server's study data cached here
