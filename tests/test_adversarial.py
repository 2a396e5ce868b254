"""The hostile user's table (issue 22, "Everything bounded" and "One line, exit 2"): every bad input
below is refused in one line naming the file, key or option, with exit 2, within seconds -- never a
traceback, an "internal error", a hang or memory without bound. Real CLI (typer's CliRunner on
`study.cli.app`), real files, FIFOs and devices, a real tiny trained 4x4 Sudoku run for `eval` and
`verify`. Grow the tables rather than adding one-off tests.

Run: pytest tests/test_adversarial.py -q
"""
from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
from typer.testing import CliRunner

from store import Store
from study.cli import app
from tests.helpers import TINY

TASK = "task: {name: sudoku, n: 4, mask_rate: 0.4, n_train: 40, n_test: 8}\n"
MODEL = "model: {d_model: 16, n_heads: 2}\n"
QUIZ = "1.3.3.1.2.4.4.2."
SECONDS = 15  # every refusal here comes well within this (the bugs took minutes, or never ended)


def cli(*args: str):
    t0 = time.monotonic()
    r = CliRunner().invoke(app, list(args))
    assert time.monotonic() - t0 < SECONDS, (args, time.monotonic() - t0)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output
    return r


def refused(*args: str, words: tuple[str, ...], code: int = 2) -> str:
    r = cli(*args)
    assert r.exit_code == code, (r.exit_code, r.output)
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and len(r.output.strip().splitlines()) <= 2, r.output  # one line (a warning at most)
    for w in words:
        assert w in lines[0], (w, r.output)
    return lines[0]


# ---- grids: sizes, numbers, keys -----------------------------------------------------------
BAD_GRIDS = [
    # sizes: bounded by explicit caps (study/spec/grid.py BOUNDS) or by the memory a step needs
    ("model: {d_model: 16, n_heads: 2, K: 100000}\n", ("model.K", "100000", "1,024")),
    ("model: {d_model: 16, n_heads: 2, L: 1000000000}\n", ("model.L", "1,024")),
    ("model: {d_model: 1000000000, n_heads: 2}\n", ("model.d_model", "65,536")),
    ("model: {d_model: 16384, n_heads: 2, K: 1000}\n", ("'model'", "GiB", "MAX_STEP_BYTES")),
    (MODEL + "train: {steps: 1000000000}\n", ("train.steps", "10,000,000")),
    (MODEL + "train: {batch_size: 1000000000000}\n", ("train.batch_size",)),
    (MODEL + "eval: {T: [1, 1000000000]}\n", ("eval.T[1]", "65,536")),
    (MODEL + "eval: {L_s: [100000000]}\n", ("eval.L_s[0]", "1,024")),
    (MODEL + "eval: {n_examples: 1000000000000}\n", ("eval.n_examples",)),
    (MODEL + "eval: {adaptive: [{max_loops: 100000000, threshold: 0.9}]}\n", ("eval.adaptive[0].max_loops",)),
    (MODEL + "train: {seed: 100000000000000000000000}\n", ("train.seed", "64-bit")),
    (MODEL + "retries: 1000000\n", ("retries",)),
    ("task: {name: text8, seq_len: 100000000}\n" + MODEL, ("task.seq_len", "65,536")),
    # numbers that only a trial would have found
    (MODEL + "train: {lr: .inf}\n", ("train.lr", "finite")),
    (MODEL + "train: {lr: .nan}\n", ("train.lr", "nan")),
    (MODEL + "train: {grad_clip: .inf}\n", ("train.grad_clip", "finite")),
    (MODEL + "eval: {temperature: .inf}\n", ("eval.temperature", "finite")),
    # keys
    (MODEL + "axes: {1: [1]}\n", ("axes.1", "not int")),
    ("model: {d_model: 16, n_heads: 2, d_model: 32}\n", ("duplicate key 'd_model'", "line 3")),
    (MODEL + "axes: {L: [1, 2], model.L: [3]}\n", ("axes.model.L", "'L'", "model.L")),
    (MODEL + "include: [{L: 2, model.L: 3}]\n", ("include[0].model.L", "again")),
    (MODEL + "groups: [{name: a, axes: {L: [1]}}, {name: a, axes: {L: [2]}}]\n", ("groups[1].name", "'a'",
                                                                                  "groups[0]")),
    # nesting
    (MODEL + "description: " + "[" * 5000 + "]" * 5000 + "\n", ("nested",)),
    (MODEL + "description: " + "[" * 40 + "]" * 40 + "\n", ("nested deeper than 32",)),
]


@pytest.mark.parametrize("body, words", BAD_GRIDS, ids=[f"grid{i}" for i in range(len(BAD_GRIDS))])
def test_bad_grid_is_one_line_exit_2(tmp_path, body, words):
    p = tmp_path / "g.yaml"
    p.write_text("study: g\n" + ("" if body.startswith("task:") else TASK) + body)
    refused("plan", str(p), words=(str(p), *words))


def test_bounds_leave_the_shipped_grids_alone():
    """Every grid of the repository still plans (the caps sit far above any study here)."""
    from glob import glob

    from study.spec.grid import load_grid

    for path in sorted(glob("grids/**/*.yaml", recursive=True)):
        assert load_grid(path).runs, path


# ---- grid and puzzle files that are no regular files, or too large -------------------------
def _fifo(tmp_path, name: str) -> str:
    p = str(tmp_path / name)
    os.mkfifo(p)
    return p


def test_grid_files_bounded(tmp_path):
    refused("plan", _fifo(tmp_path, "fifo.yaml"), words=("fifo.yaml", "FIFO"))
    refused("plan", "/dev/zero", words=("/dev/zero", "device"))
    big = tmp_path / "big.yaml"
    big.write_text("study: big\ndescription: " + "x" * 3_000_000 + "\n")
    refused("plan", str(big), words=(str(big), "1,048,576 bytes"))
    long = tmp_path / "long.yaml"
    long.write_text("study: long\ndescription: " + "x" * 100_000 + "\n" + TASK + MODEL)
    refused("plan", str(long), words=(f"{long}:2", "longer than 65,536"))


@pytest.mark.parametrize("kind", ["fifo", "huge", "deep"])
def test_defaults_from_file_bounded_like_a_grid(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    if kind == "fifo":
        os.mkfifo("best.yaml")
    elif kind == "huge":
        (tmp_path / "best.yaml").write_text("kind: x\ngroups: " + "x" * 2_000_000 + "\n")
    else:
        (tmp_path / "best.yaml").write_text("kind: " + "[" * 5000 + "]" * 5000 + "\n")
    p = tmp_path / "g.yaml"
    p.write_text("study: g\n" + TASK + MODEL + "defaults_from: {file: best.yaml, group: auto}\n")
    refused("plan", str(p), words=("defaults_from.file", "best.yaml"))

# ---- command-line values ---------------------------------------------------------------------
@pytest.fixture
def grid(tmp_path) -> str:
    p = tmp_path / "g.yaml"
    p.write_text("study: g\n" + TASK + MODEL + "train: {steps: 2, batch_size: 4}\neval: {T: [1], n_examples: 4}\n")
    return str(p)


@pytest.mark.parametrize("args, words", [
    (("--num-cpus", "0"), ("--num-cpus",)),
    (("--num-cpus", "-3"), ("--num-cpus",)),
    (("--progress-every", "-1"), ("--progress-every", "> 0")),
    (("--progress-every", "nan"), ("--progress-every",)),
])
def test_bad_run_options(tmp_path, grid, args, words):
    r = cli("run", grid, "--results", str(tmp_path / "r"), *args)
    assert r.exit_code == 2, r.output
    for w in words:
        assert w in r.output, (w, r.output)
    assert not (tmp_path / "r" / "g").exists()  # refused before anything ran


@pytest.mark.parametrize("args, words", [
    (("--flops-per-s", "inf"), ("--flops-per-s", "finite")),
    (("--flops-per-s", "nan"), ("--flops-per-s",)),
    (("--mfu", "0.5", "--peak-flops", "inf"), ("--peak-flops", "finite")),
    (("--mfu", "nan", "--device", "h100"), ("--mfu",)),
])
def test_bad_plan_options(grid, args, words):
    refused("plan", grid, *args, words=words)

@pytest.fixture(scope="module")
def trained(tiny_run, tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("results"))  # conftest.py: this module's copy of the session's run


@pytest.mark.parametrize("args, words", [
    (("--threshold", "nan"), ("--threshold", "(0, 1]")),
    (("--threshold", "2"), ("--threshold",)),
    (("--study", "nope"), ("no study 'nope'",)),
    (("--study", "../etc"), ("'../etc'", "not a study name")),
])
def test_bad_report_options(trained, tmp_path, args, words):
    root, _ = trained
    refused("report", "--results", root, "--out", str(tmp_path / "figs"), *args, words=words)


@pytest.mark.parametrize("cmd", ["report", "verify"])
def test_report_and_verify_on_an_empty_store(tmp_path, cmd):
    (tmp_path / "empty").mkdir()
    refused(cmd, "--results", str(tmp_path / "empty"), words=("no study",))
    refused(cmd, "--results", str(tmp_path / "empty"), "--study", "../etc", words=("not a study name",))


# ---- study eval and verify -----------------------------------------------------------------
def test_eval_puzzle_files_bounded(trained, tmp_path):
    root, run_id = trained
    refused("eval", run_id, "--puzzles", "/dev/zero", "--results", root, words=("/dev/zero", "device"))
    fifo = _fifo(tmp_path, "p.fifo")
    refused("eval", run_id, "--puzzles", fifo, "--results", root, words=(fifo, "FIFO"))
    long = tmp_path / "long.txt"
    long.write_text(QUIZ + "\n" + "." * 1_000_000 + "\n")
    refused("eval", run_id, "--puzzles", str(long), "--results", root, words=(f"{long}:2", "longer than"))


def test_a_writer_less_fifo_never_blocks_a_reader(trained, tmp_path):
    """open() of a FIFO with no writer blocks forever; the reader must refuse it without opening it so."""
    root, run_id = trained
    fifo = _fifo(tmp_path, "g.yaml")
    done = threading.Event()
    got = {}

    def plan():
        got["r"] = CliRunner().invoke(app, ["plan", fifo])
        done.set()

    threading.Thread(target=plan, daemon=True).start()
    if not done.wait(SECONDS):  # unblock the reader (a writer opens and closes) so the thread ends
        with open(fifo, "w"):
            pass
        done.wait(5)
        raise AssertionError("a FIFO grid blocked the reader")
    assert got["r"].exit_code == 2 and "FIFO" in got["r"].output


@pytest.mark.parametrize("opt, value, words", [
    ("--L-s", "100000000", ("--L-s", "1,024")),
    ("--T", "100000000", ("--T", "65,536")),
])
def test_eval_sizes_bounded(trained, tmp_path, opt, value, words):
    root, run_id = trained
    src = tmp_path / "p.txt"
    src.write_text(QUIZ + "\n")
    refused("eval", run_id, "--puzzles", str(src), "--results", root, opt, value, words=words)


def test_one_puzzle_file_under_two_names_is_one_eval_point(trained, tmp_path):
    root, run_id = trained
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(QUIZ + "\n")
    shutil.copy(a, b)
    for p in (a, b):
        r = cli("eval", run_id, "--puzzles", str(p), "--results", root)
        assert r.exit_code == 0, r.output
    evals = Store(root, TINY).read("evals", run_id)
    ext = evals[evals["split"].str.startswith("external:")]
    assert ext["eval_key"].nunique() == 1, ext[["eval_key", "split"]]


@pytest.mark.parametrize("damage", ["text", "symlink"])
def test_weights_that_are_text_or_a_system_file_are_named(tmp_path, trained, damage):
    root0, run_id = trained
    root = str(tmp_path / "r")
    shutil.copytree(root0, root)
    w = os.path.join(root, TINY, "weights", f"{run_id}.pt")
    os.remove(w)
    if damage == "text":
        with open(w, "w") as f:
            f.write("these are not weights\n")
    else:
        os.symlink("/etc/passwd", w)
    src = tmp_path / "p.txt"
    src.write_text(QUIZ + "\n")
    line = refused("eval", run_id, "--puzzles", str(src), "--results", root, words=(f"{run_id}.pt",))
    assert "passwd" not in line or damage == "symlink"
    r = cli("verify", "--results", root, "--study", TINY)
    assert r.exit_code == 1 and f"{run_id}.pt" in r.output, r.output


def test_weights_linked_to_dev_zero_are_not_read(tmp_path, trained):
    """A store file that links to a device is never read (it has no end); here in a child process
    whose memory is capped, so that a regression fails instead of eating the machine's memory."""
    import resource
    import subprocess
    import sys

    from tests.helpers import ROOT

    root0, run_id = trained
    root = str(tmp_path / "r")
    shutil.copytree(root0, root)
    w = os.path.join(root, TINY, "weights", f"{run_id}.pt")
    os.remove(w)
    os.symlink("/dev/zero", w)
    src = tmp_path / "p.txt"
    src.write_text(QUIZ + "\n")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    r = subprocess.run([sys.executable, "-m", "study.cli", "eval", run_id, "--puzzles", str(src), "--results", root],
                       env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=120,
                       preexec_fn=cap)
    assert r.returncode == 2 and f"{run_id}.pt" in r.stderr and "internal error" not in r.stderr, r.stderr

@pytest.mark.parametrize("config", ["[1]", "1", "{"])
def test_a_runs_row_with_a_bad_config_is_named_not_an_internal_error(tmp_path, trained, config):
    """Store damage, not a user mistake: the report reads on (the config file stands in), verify names
    the runs file (exit 1); neither is an "internal error"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root0, run_id = trained
    root = str(tmp_path / "r")
    shutil.copytree(root0, root)
    f = os.path.join(root, TINY, "runs", f"{run_id}.parquet")
    t = pq.read_table(f)
    t = t.set_column(t.schema.get_field_index("config"), "config", pa.array([config] * len(t), pa.string()))
    pq.write_table(t, f)
    r = cli("report", "--results", root, "--study", TINY, "--figure", "iso-param", "--out", str(tmp_path / "figs"))
    # the edited row (its row_sha256 fails) is left out and named: the study has no other run
    assert r.exit_code == 2 and f"{run_id}.parquet (edited" in r.output, r.output
    r = cli("verify", "--results", root, "--study", TINY)
    assert r.exit_code == 1 and run_id in r.output and "internal error" not in r.output, r.output

# ---- signals -------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_to_the_driver_is_ctrl_c(tmp_path):
    """A SIGTERM to `study run` while runs train (held at step 5): the same "interrupted" line, exit
    code and resumable store as Ctrl-C (tests/test_ray_start.py), no C-level stack dump, no traceback.
    Run: pytest -m slow tests/test_adversarial.py -k sigterm"""
    import signal
    import subprocess
    import sys

    from study.spec.grid import load_grid
    from tests.helpers import ROOT, descendants, held, kill_all, tiny_grid, unheld

    g = tmp_path / "g.yaml"
    g.write_text(tiny_grid("sigterm", axes="seed: [0, 1]"))
    runs = load_grid(str(g)).runs
    env = {**os.environ, "PYTHONPATH": ROOT, **held(runs, at=5)}
    cmd = [sys.executable, "-m", "study.cli", "run", str(g), "--results", str(tmp_path / "res"), "--num-cpus", "1"]
    progress = tmp_path / "res" / "sigterm" / "progress"
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tree: list[int] = []
    try:
        t0 = time.time()
        while not (progress.is_dir() and os.listdir(progress)):
            assert p.poll() is None and time.time() - t0 < 600, p.stdout.read() if p.poll() is not None else "slow"
            time.sleep(0.5)
        tree = descendants(p.pid)
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=120)[0]
    finally:
        if p.poll() is None:  # it outlived the test: end it and what it started (a clean exit shuts Ray down)
            tree = [*tree, *descendants(p.pid)]
            p.kill()
            p.communicate()
            kill_all(tree)
    assert p.returncode == 130 and "interrupted: 2 run(s) not finished" in out, out  # a SIGTERM is a Ctrl-C (issue 44: 130)
    assert "Traceback" not in out and "SIGTERM received" not in out and "***" not in out, out
    env = unheld(env)
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "2 done, 0 failed, 0 incomplete" in r.stdout, r.stdout + r.stderr


# ---- unreachable clusters and stores: bounded -------------------------------------------------
@pytest.mark.parametrize("other_ray", [False, True], ids=["alone", "beside-a-running-ray"])
def test_address_auto_with_a_stale_cluster_file_is_bounded(tmp_path, grid, other_ray):
    """`--address auto` joins what `ray start` left in <RAY_TMPDIR>/ray/ray_current_cluster: a GCS that is
    gone (here a closed local port) is refused within seconds, like HOST:PORT, instead of ray.init
    waiting minutes for it. The recorded cluster is the one taken even while another Ray instance runs
    on this machine (Ray's own `auto` would join that one instead)."""
    import socket
    import subprocess
    import sys

    from study.engine.raystart import init_ray
    from tests.helpers import ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=ROOT, RAY_TMPDIR=str(tmp_path))
    ray, started = init_ray(None, num_cpus=1) if other_ray else (None, False)  # a GCS running here
    try:
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "study.cli", "run", grid, "--results", str(tmp_path / "res"),
                            "--address", "auto"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    finally:
        if started:
            ray.shutdown()
    assert time.monotonic() - t0 < 60, r.stdout + r.stderr
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert f":{port}): cannot reach the Ray cluster" in out and "--address auto (" in out, out
    assert "Traceback" not in out and "WARNING" not in out, out


@pytest.mark.slow  # 40 s of the Google client's retries; a remote store's errors also: test_s3.py
def test_gs_store_without_network_is_bounded(tmp_path, grid):
    """A gs:// store that cannot be reached (no network or no credentials here) fails in one line
    within seconds, as s3:// does, instead of the Google client's 15 minutes of retries."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "study.cli", "status", grid, "--results", "gs://rmdm-no-such-bucket/r"],
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                       timeout=300)
    assert time.monotonic() - t0 < 90, r.stdout + r.stderr
    assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1, \
        r.stdout + r.stderr


@pytest.mark.slow
def test_a_failing_trial_is_one_line_with_its_root_cause(tmp_path):
    """What only a trial can find (here a NaN loss, injected) is one line per failed run naming the root
    cause, not Ray's traceback; the traceback stays in the run's log.
    Run: pytest -m slow tests/test_adversarial.py -k root_cause"""
    import subprocess
    import sys

    from study.spec.grid import load_grid
    from tests.helpers import faulty, tiny_grid

    g = tmp_path / "g.yaml"
    g.write_text(tiny_grid("nanrun", axes="seed: [0]", retries=0))
    rid = load_grid(str(g)).runs[0].run_id
    env = {**os.environ, **faulty(nan={rid: 3})}
    r = subprocess.run([sys.executable, "-m", "study.cli", "run", str(g), "--results", str(tmp_path / "res"),
                        "--num-cpus", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert f"failed {rid}: FloatingPointError: non-finite loss nan at step 3  (log: " in out, out
    assert "Traceback" not in out and "RayTaskError" not in out, out
    row = Store(str(tmp_path / "res"), "nanrun").run_row(rid)
    assert row["error"] == "FloatingPointError: non-finite loss nan at step 3", row["error"]
    log = (tmp_path / "res" / "nanrun" / "logs" / f"{rid}.log").read_text()
    assert "Traceback" in log and "RayTaskError" in log  # the whole story is kept
