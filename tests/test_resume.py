"""Resume with real processes: SIGKILL the `study run` driver mid-training, run it again.

Run: pytest tests/test_resume.py  (real local Ray started by a real `study run` process, twice)
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from study.spec.grid import load_grid
from study.commands.status import counts, snapshot
from store import Store
from tests.helpers import ROOT, check_resumed, descendants, held, kill_driver, study_cmd, tiny_grid


def listening(pids: list[int]) -> list[str]:
    """`ss -ltnp` lines of sockets listened on by `pids`."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


def local_address(ss_line: str) -> str:
    return ss_line.split()[3].rsplit(":", 1)[0]


# slow set (39 s of the default suite, measured under load); the default suite keeps test_store_heal's interrupted run resuming from its checkpoint
@pytest.mark.slow
def test_driver_sigkill_then_rerun_resumes_every_run_once(tmp_path):
    gpath = tmp_path / "resume.yaml"
    gpath.write_text(tiny_grid("resume", steps=120))
    results = str(tmp_path / "results")
    grid = load_grid(str(gpath))
    store = Store(results, "resume")
    env = {**os.environ, "PYTHONPATH": ROOT}
    # the first driver's trials wait before step 20 (after their checkpoint at 20) until killed: the kill
    # lands mid-training however fast this machine trains; the rerun (env without it) trains through
    drv = subprocess.Popen(study_cmd("run", str(gpath), "--results", results, "--num-cpus", "2",
                                     "--progress-every", "2"), cwd=ROOT, env={**env, **held(grid.runs, at=20)},
                           start_new_session=True,
                           stdout=open(tmp_path / "run1.out", "w"), stderr=subprocess.STDOUT)
    try:
        # wait for a checkpoint past step 0, reading the store as `study status` does meanwhile
        deadline, seen, bound = time.time() + 300, set(), []
        while time.time() < deadline:
            assert drv.poll() is None, (tmp_path / "run1.out").read_text()
            st = snapshot(grid, store)
            c = counts(st)
            assert sum(c.values()) == 2 and c["done"] == 0 and c["failed"] == 0
            seen |= {s.state for s in st}
            hist = store.read("history")  # rewritten at every checkpoint: read whole, never half
            assert hist.groupby("run_id").step.apply(lambda s: s.is_unique).all()
            if not bound and any(s.state == "running" for s in st):
                bound = listening([drv.pid, *descendants(drv.pid)])
            beats = store.read_progress()
            if any((b.get("checkpoint") or 0) >= 10 and b.get("phase") == "train" for b in beats.values()):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("no checkpoint within 300 s: " + (tmp_path / "run1.out").read_text())
        assert "running" in seen
        # the embedded Ray listens on loopback only
        assert bound and all(local_address(line) in ("127.0.0.1", "[::ffff:127.0.0.1]") for line in bound), bound
    finally:
        kill_driver(drv, [])  # Ray's agents outlive the driver for a while: end what this test started

    killed = [rid for rid, b in store.read_progress().items() if b.get("phase") == "train" and b.get("checkpoint")]
    at = sorted({int(store.read_progress()[rid]["checkpoint"]) for rid in killed})  # where the rerun resumes
    assert killed and store.read("runs").empty
    after_kill = snapshot(grid, store)
    assert {s.state for s in after_kill} <= {"interrupted", "pending"}, after_kill
    # `study status`, another process, says the same from the store
    r = subprocess.run(study_cmd("status", str(gpath), "--results", results), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "done 0/2  running 0" in r.stdout and "interrupted" in r.stdout, r.stdout

    r = subprocess.run(study_cmd("run", str(gpath), "--results", results, "--num-cpus", "2"), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600, start_new_session=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # the rerun says what it resumes, and from which step (the killed runs' checkpoints)
    said = f"{len(killed)} to resume (from step {at[0]})" if len(at) == 1 else \
        f"{len(killed)} to resume (from steps {at[0]} to {at[-1]})"
    assert said in r.stdout, r.stdout

    runs, evals, hist = check_resumed(store, grid, killed, steps=120)
    assert runs.node_id.notna().all() and (runs.node_ip == "127.0.0.1").all() and (runs.device == "cpu").all()
    assert len(evals) == 2 * 2 * 3
    for rid in killed:
        h = hist[hist.run_id == rid].sort_values("step")
        log = store.read_bytes(store.path("logs", f"{rid}.log")).decode()
        ckpt = int(log.split("resuming from checkpoint at step ")[1].split()[0])
        assert ckpt > 0 and f"resuming from checkpoint at step {ckpt} (attempt 2)" in log
        # steps before the checkpoint come from the killed process, the rest from the rerun
        assert (h[h.step < ckpt].attempt == 1).all() and (h[h.step >= ckpt].attempt == 2).all(), h
    assert all(s.state == "done" for s in snapshot(grid, store))
