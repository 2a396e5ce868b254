"""The store on a real S3-compatible server: moto's standalone server on 127.0.0.1, driven through
pyarrow's own S3FileSystem (the store takes `s3://bucket/path?endpoint_override=...&scheme=http`).

Run: pytest tests/test_s3.py -q  (needs the test extra: `pip install -e '.[test]'`, which brings moto[server];
no network beyond 127.0.0.1: the endpoint is overridden and AWS's instance metadata lookup is off)
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pyarrow.fs as pafs
import pytest

from tests.helpers import ROOT, check_resumed, full_row, held, kill_driver, study_cmd, tiny_grid, wait_training

BUCKET = "rmdm"
GRID = tiny_grid("s3demo", steps=120)


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory):
    """Credentials and settings of a fake AWS account: no config file, no profile, no metadata service."""
    home = tmp_path_factory.mktemp("aws")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(home / "config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials")}
    saved = {k: os.environ.get(k) for k in [*env, "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"]}
    for k in saved:
        os.environ.pop(k, None)
    os.environ.update(env)
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def s3_root(s3_env):
    """`s3://rmdm/results?...` on a moto server started here, on 127.0.0.1 and a free port."""
    server, endpoint = _server()
    try:
        yield f"s3://{BUCKET}/results?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    finally:
        server.stop()


def _server():
    """A moto server on 127.0.0.1 and a free port, holding an empty bucket; (server, 'HOST:PORT')."""
    from moto.server import ThreadedMotoServer  # the test extra: pip install -e '.[test]'

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        assert host == "127.0.0.1"
        endpoint = f"127.0.0.1:{port}"
        # the bucket exists before the study, as a user's would (the store never creates buckets)
        pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1",
                          allow_bucket_creation=True).create_dir(BUCKET)
    except BaseException:
        server.stop()
        raise
    return server, endpoint


def test_store_tables_logs_and_data_on_s3(s3_root, tmp_path):
    from store import Store, list_studies

    store = Store(s3_root, "unit")
    assert not store.local and store.dir == f"{BUCKET}/results/unit"
    store.write_rows("runs", [full_row("runs", run_id="r1", study="unit", status="done")], "r1.parquet")
    store.write_rows("evals", [full_row("evals", run_id="r1", eval_key="k1", metric="vpr", value=0.5)],
                     "r1", "k1.parquet")
    assert store.run_row("r1")["status"] == "done"
    assert store.eval_keys("r1") == {"k1"}
    assert store.read("evals", filter_run="r1").value.tolist() == [0.5]
    # no temp file is left behind by the write-then-rename
    listing = store.fs.get_file_info(pafs.FileSelector(store.dir, recursive=True))
    assert not [i.path for i in listing if i.base_name.startswith(".")]
    store.append_log("r1", "one")
    store.append_log("r1", "two")  # S3 cannot append: the log is rewritten whole
    assert store.read_bytes(store.path("logs", "r1.log")) == b"one\ntwo\n"
    assert [s for s, _ in list_studies(s3_root)] == ["unit"]


def test_endpoint_from_the_environment(s3_root, monkeypatch):
    """`s3://bucket/path` plus AWS_ENDPOINT_URL is the same store as the endpoint in the URI."""
    from store import Store

    Store(s3_root, "env").write_text(Store(s3_root, "env").path("grid.yaml"), "study: env\n")
    endpoint = s3_root.split("endpoint_override=")[1].split("&")[0]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{endpoint}")
    plain = Store(f"s3://{BUCKET}/results", "env")
    assert plain.read_bytes(plain.path("grid.yaml")) == b"study: env\n"


def test_task_data_cached_on_this_machine_reaches_a_store_that_lacks_it(s3_root):
    """Task data is cached in a local directory per store; the store's `data/` must hold it all the same."""
    from store import Store

    store = Store(s3_root, "cached")
    with store.task_data() as d:  # the task writes its data once; it is mirrored to the bucket
        with open(os.path.join(d, "sudoku4-abc.npz"), "wb") as f:
            f.write(b"data")
    assert store.read_bytes(store.path("data", "sudoku4-abc.npz")) == b"data"

    store.fs.delete_dir_contents(store.path("data"))  # the store lost it (a study deleted and run again)
    with store.task_data() as d:
        assert os.listdir(d) == ["sudoku4-abc.npz"]  # cached here: the task generates nothing
    assert store.read_bytes(store.path("data", "sudoku4-abc.npz")) == b"data"

    # the same bucket and path on another server is another store, with a cache of its own
    other = _server()
    try:
        other_root = s3_root.split("?")[0] + f"?endpoint_override={other[1]}&scheme=http&region=us-east-1"
        twin = Store(other_root, "cached")
        assert twin.dir == store.dir and twin.data_dir() != store.data_dir()
    finally:
        other[0].stop()
        shutil.rmtree(store.data_dir(), ignore_errors=True)  # this test's cache, keyed by its server's port


@pytest.mark.slow  # a killed and resumed sweep on moto; also in part: the tests above, test_resume.py
def test_run_killed_resumed_status_and_report_on_s3(s3_root, s3_env, tmp_path):
    from store import Store
    from study.spec.grid import load_grid
    from study.commands.status import snapshot

    gpath = tmp_path / "s3demo.yaml"
    gpath.write_text(GRID)
    grid = load_grid(str(gpath))
    store = Store(s3_root, "s3demo")
    env = {**os.environ, **s3_env, "PYTHONPATH": ROOT}
    # first attempts wait before step 15 (after the checkpoint at 10): the kill lands mid-training
    drv = subprocess.Popen(study_cmd("run", str(gpath), "--results", s3_root, "--num-cpus", "2",
                                     "--progress-every", "2"), cwd=ROOT, env={**env, **held(grid.runs)},
                           start_new_session=True,
                           stdout=open(tmp_path / "run1.out", "w"), stderr=subprocess.STDOUT)
    try:
        # kill the driver once a run has checkpointed past step 0 (so it resumes mid-training)
        wait_training(drv, store, tmp_path / "run1.out", n=1, timeout=300)
    finally:
        kill_driver(drv, [])  # Ray's processes outlive the driver for a while: end what this test started

    killed = [rid for rid, b in store.read_progress().items() if b.get("phase") == "train" and b.get("checkpoint")]
    assert killed
    assert {s.state for s in snapshot(grid, store)} <= {"interrupted", "pending", "done"}

    r = subprocess.run(study_cmd("status", str(gpath), "--results", s3_root), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "interrupted" in r.stdout, r.stdout

    r = subprocess.run(study_cmd("run", str(gpath), "--results", s3_root, "--num-cpus", "2"), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600, start_new_session=True)
    assert r.returncode == 0, r.stdout + r.stderr

    runs, evals, _ = check_resumed(store, grid, killed, steps=120)
    assert len(evals) == 2 * 2 * 3
    for rid in runs.run_id:
        assert store.exists(store.weights_path(rid))
    # the task's data was generated once and mirrored into the bucket
    assert store.fs.get_file_info(pafs.FileSelector(store.path("data")))

    r = subprocess.run(study_cmd("status", str(gpath), "--results", s3_root), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "done 2/2" in r.stdout, r.stdout + r.stderr

    # every stored sample re-scored and the store's invariants checked, on the bucket
    r = subprocess.run(study_cmd("verify", "--study", "s3demo", "--results", s3_root), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

    shutil.rmtree(store.data_dir(), ignore_errors=True)  # the driver's cache of this server's study data

    out = tmp_path / "figures"
    # the report names the endpoint the other way, in the environment (a profile would do too)
    endpoint = s3_root.split("endpoint_override=")[1].split("&")[0]
    r = subprocess.run(study_cmd("report", "--study", "s3demo", "--results", f"s3://{BUCKET}/results",
                                 "--figure", "all", "--out", str(out)), cwd=ROOT,
                       env={**env, "AWS_ENDPOINT_URL": f"http://{endpoint}"}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "report.html").exists() and any(p.name.startswith("iso_param") for p in out.iterdir()), r.stdout
    assert "s3demo" in (out / "report.md").read_text()

