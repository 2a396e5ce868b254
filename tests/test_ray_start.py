"""Starting the embedded Ray, joining a cluster, resources and Ctrl-C.

Run: pytest tests/test_ray_start.py   (the SIGINT test on an embedded Ray: pytest -m slow tests/test_ray_start.py)
"""
from __future__ import annotations

import os

import pytest

from study.engine.raystart import init_ray
from study.engine.options import RunOptions


def test_embedded_ray_start_that_times_out_is_tried_again(monkeypatch, capsys):
    """A raylet that misses Ray's 30 s registration window (a crowded box) costs a retry, not the sweep."""
    import ray

    assert not ray.is_initialized(), "an earlier test left its Ray running"
    real_init, calls = ray.init, []

    def flaky_init(*a, **kw):  # the first start fails the way Ray reports it; the second is real
        calls.append(kw)
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen because ...")
        return real_init(*a, **kw)

    monkeypatch.setattr(ray, "init", flaky_init)
    r, started = init_ray(None, num_cpus=1)
    try:
        assert started and r.is_initialized() and len(calls) == 2
        assert "timed out during startup (attempt 1/3)" in capsys.readouterr().err
    finally:
        r.shutdown()
    # any other start error is not retried
    calls.clear()
    monkeypatch.setattr(ray, "init", lambda *a, **kw: calls.append(kw) or (_ for _ in ()).throw(ValueError("bad")))
    with pytest.raises(ValueError):
        init_ray(None, num_cpus=1)
    assert len(calls) == 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


TINY = ("task: {name: sudoku, n: 4, mask_rate: 0.4, n_train: 40, n_test: 8}\nmodel: {d_model: 16, n_heads: 2}\n"
        "train: {steps: 2, batch_size: 4}\neval: {T: [1], n_examples: 4}\n")


def test_unreachable_address_fails_fast_with_a_message(tmp_path):
    """`--address` to a cluster nobody runs: exit 2 within a bounded time, never a hang or a traceback; the
    refused run leaves nothing `study verify` calls damage (was: grids/<hash>.yaml and grids/log.jsonl of a
    grid never run, "the store disagrees with itself")."""
    import time

    import ray
    from typer.testing import CliRunner

    from study.cli import app

    assert not ray.is_initialized(), "an earlier test left its Ray running"
    g = tmp_path / "g.yaml"
    g.write_text("study: far\n" + TINY)
    t0 = time.time()
    addr = f"127.0.0.1:{_free_port()}"
    r = CliRunner().invoke(app, ["run", str(g), "--results", str(tmp_path / "res"), "--address", addr])
    assert r.exit_code == 2 and "cannot reach the Ray cluster" in r.output and addr in r.output, r.output
    assert time.time() - t0 < 60 and not ray.is_initialized()  # bounded: a refused TCP connect, no Ray retries
    assert not (tmp_path / "res" / "far" / "grids").exists()
    v = CliRunner().invoke(app, ["verify", "--study", "far", "--results", str(tmp_path / "res")])
    assert v.exit_code == 0 and "PROBLEM" not in v.output, v.output


@pytest.mark.parametrize("res, words", [
    ("{gpu: 1}", ("resources.gpu = 1", "the largest node has 0")),
    ("{cpu: 64}", ("resources.cpu = 64", "the largest node has 1")),
])
def test_resources_the_cluster_lacks_fail_before_dispatch(tmp_path, res, words):
    """A run no node can hold would stay pending forever: refused before anything runs, nothing recorded."""
    import ray

    from store import Store
    from study.spec.grid import load_grid
    from study.engine.runner import run_grid

    g = tmp_path / "g.yaml"
    g.write_text(f"study: big\n{TINY}resources: {res}\n")
    lines: list[str] = []
    assert run_grid(load_grid(str(g)), str(tmp_path / "res"), RunOptions(num_cpus=1, echo=lines.append)) == 2
    text = "\n".join(lines)
    assert all(w in text for w in words) and "could never start" in text and "nothing was run" in text, text
    assert not ray.is_initialized()  # the Ray it started is shut down again
    store = Store(str(tmp_path / "res"), "big")
    assert store.read("runs").empty and not store.exists(store.path("logs"))


def test_embedded_ray_never_joins_a_ray_start_cluster(monkeypatch):
    """ray.init() without an address joins the cluster recorded by `ray start` (and then refuses num_cpus):
    the embedded Ray must start its own, whatever else runs on the machine."""
    import shutil
    import tempfile

    import ray

    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live below it
    try:
        with open(f"{tmp}/ray_current_cluster", "w") as f:
            f.write(f"127.0.0.1:{_free_port()}")  # what `ray start --head` leaves behind
        monkeypatch.setenv("RAY_TMPDIR", tmp)
        r, started = init_ray(None, num_cpus=1)
        try:
            assert started and r.cluster_resources().get("CPU") == 1
        finally:
            r.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# slow set (10 s under load); the default suite keeps test_resources_the_cluster_lacks_fail_before_dispatch)
@pytest.mark.slow
def test_a_cluster_that_shrinks_under_waiting_runs_ends_the_run(tmp_path, monkeypatch):
    """Resources are checked again while trials wait: when no alive node can hold a pending run any
    more (here: the cluster reports no node after dispatch), `study run` ends with exit 2 and says why."""
    import study.engine.placement as placement
    import study.engine.runner as runner
    from study.spec.grid import load_grid

    real, calls = placement.node_resources, []

    def shrinking(ray):
        calls.append(1)
        return real(ray) if len(calls) == 1 else []  # the pre-dispatch check sees the node; later, it is gone

    monkeypatch.setattr(placement, "node_resources", shrinking)
    monkeypatch.setattr(placement.SweepWatch, "EVERY_S", 0.0)
    g = tmp_path / "g.yaml"
    g.write_text("study: shrink\n" + TINY.replace("steps: 2", "steps: 30") + "axes:\n  seed: [0, 1, 2]\n")
    lines: list[str] = []
    assert runner.run_grid(load_grid(str(g)), str(tmp_path / "res"), RunOptions(num_cpus=1, echo=lines.append)) == 2
    text = "\n".join(lines)
    assert "could never start" in text and "the cluster changed during the run" in text, text
    assert len(calls) >= 2


def test_study_tune_refuses_resources_the_cluster_lacks(tmp_path):
    """`study tune` makes the check `study run` makes before dispatch: exit 2, naming the resource, the
    ask and what the cluster has; no trial ran."""
    import ray
    from typer.testing import CliRunner

    from store import Store
    from study.cli import app

    g = tmp_path / "g.yaml"
    g.write_text(f"study: bigtune\n{TINY}resources: {{cpu: 64}}\n"
                 "search: {n_trials: 2, metric: val_loss, mode: min, params: {lr: {dist: loguniform, low: 0.0001, "
                 "high: 0.1}}}\n")
    r = CliRunner().invoke(app, ["tune", str(g), "--results", str(tmp_path / "res"), "--num-cpus", "1"])
    assert r.exit_code == 2, r.output
    assert "resources.cpu = 64" in r.output and "the largest node has 1" in r.output, r.output
    assert "1 CPUs and 0 GPUs in all" in r.output and "nothing was run" in r.output, r.output
    assert not ray.is_initialized()
    assert Store(str(tmp_path / "res"), "bigtune").read("runs").empty


# slow set (11 s under load); the default suite keeps test_resources_the_cluster_lacks_fail_before_dispatch)
@pytest.mark.slow
def test_progress_line_says_runs_wait_for_resources(tmp_path, monkeypatch):
    """More runs than CPUs: while one trains the others wait, and the live line says for what."""
    import study.engine.placement as placement
    from study.spec.grid import load_grid
    from study.engine.runner import run_grid

    monkeypatch.setattr(placement, "WAITING_EVERY_S", 0.0)  # every line asks Ray (however fast the runs end)

    g = tmp_path / "g.yaml"
    g.write_text("study: waits\n" + TINY.replace("steps: 2", "steps: 30") + "axes:\n  seed: [0, 1, 2]\n")
    lines: list[str] = []
    assert run_grid(load_grid(str(g)), str(tmp_path / "res"), RunOptions(num_cpus=1, echo=lines.append,
                    progress_every_s=0.0)) == 0
    waiting = [ln for ln in lines if "waiting for cpu: 0 free of 1" in ln]
    assert waiting and all("pending 0" not in ln for ln in waiting), "\n".join(lines)


def test_waiting_note_names_each_short_resource():
    from study.engine.placement import waiting_note

    assert waiting_note([(1, 0), (2, 0)], {"CPU": 1.0}, {"CPU": 2.0}) == "waiting for cpu: 1 free of 2"
    assert waiting_note([(1, 0.5)], {"CPU": 0.0, "GPU": 0.25}, {"CPU": 4.0, "GPU": 1.0}) == \
        "waiting for cpu: 0 free of 4, gpu: 0.25 free of 1"
    assert waiting_note([(1, 0)], {"CPU": 3.0}, {"CPU": 4.0}) == ""  # it fits: about to start


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ctrl_c_while_joining_a_cluster_ends_at_once(tmp_path):
    """`study run --address` to a port that accepts TCP but is no Ray: Ray's join blocks in C++ (30 s
    and more, deaf to Ctrl-C). A real SIGINT, sent once Ray's join has connected to the port, ends the
    process at once with a message; the store stays readable."""
    import signal
    import socket
    import subprocess
    import sys

    g = tmp_path / "g.yaml"
    g.write_text("study: joining\n" + TINY)
    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))  # Ray may dial the machine's own address rather than 127.0.0.1
    srv.listen(16)
    srv.settimeout(120)
    with srv:
        addr = f"127.0.0.1:{srv.getsockname()[1]}"
        p = subprocess.Popen([sys.executable, "-m", "study.cli", "run", str(g), "--results", str(tmp_path / "res"),
                              "--address", addr], cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            held = [srv.accept()[0], srv.accept()[0]]  # the reachability probe, then Ray's own connection
            p.send_signal(signal.SIGINT)
            out = p.communicate(timeout=60)[0]  # bound: Ray alone would go on for 30 s or more
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        for c in held:
            c.close()
    assert p.returncode == 130 and f"interrupted while joining the Ray cluster at {addr}" in out, out
    assert "Traceback" not in out, out
    r = subprocess.run([sys.executable, "-m", "study.cli", "status", str(g), "--results", str(tmp_path / "res")],
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "pending 1" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_ctrl_c_ends_study_run_on_an_embedded_ray(tmp_path):
    """A real SIGINT to `study run` while a run trains (held before step 5 until stopped): the process
    ends within a bounded time, says the runs were interrupted and how to resume, the store reads, and
    a second `study run` finishes them. Run: pytest -m slow tests/test_ray_start.py -k ctrl_c"""
    import subprocess
    import sys

    from study.spec.grid import load_grid
    from tests.helpers import ctrl_c_when, held, unheld

    g = tmp_path / "g.yaml"
    g.write_text("study: sigrun\n" + TINY.replace("steps: 2", "steps: 20") + "axes:\n  seed: [0, 1]\n")
    runs = load_grid(str(g)).runs
    env = {**os.environ, "PYTHONPATH": ROOT, **held(runs, at=5)}
    cmd = [sys.executable, "-m", "study.cli", "run", str(g), "--results", str(tmp_path / "res"), "--num-cpus", "1"]
    progress = tmp_path / "res" / "sigrun" / "progress"  # heartbeats: a run is training (held at step 5)
    code, out = ctrl_c_when(cmd, tmp_path, env, lambda: progress.is_dir() and bool(os.listdir(progress)))
    assert code == 130 and "interrupted: 2 run(s) not finished" in out and "Traceback" not in out, out
    r = subprocess.run([sys.executable, "-m", "study.cli", "status", str(g), "--results", str(tmp_path / "res")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "done 0/2" in r.stdout, r.stdout + r.stderr
    env = unheld(env)
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "2 done, 0 failed, 0 incomplete" in r.stdout, r.stdout + r.stderr
