"""`study run --log mlflow=URI --log tensorboard` against a real MLflow tracking server that the test starts on
127.0.0.1 (the mlflow package's own `mlflow server`, SQLite backend), as the S3 tests use moto: a tiny sweep,
then the server's API lists one MLflow run per trial with its parameters, its loss curve and its final
metrics, equal to what the store holds; TensorBoard event files are where the README says. And the
mistakes: an unknown --log, a value where none is taken, a missing package, an unreachable server: one
line, exit 2, before Ray starts.

Run: .venv/bin/python -m pytest tests/test_loggers.py -q
"""
from __future__ import annotations

import glob
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.helpers import study, tiny_grid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """`mlflow server` on 127.0.0.1 at a free port; its URI once /health answers. Ended by its handle (its
    own process group: the server's workers with it)."""
    port = _free_port()
    cmd = [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--host", "127.0.0.1",
           "--port", str(port), "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db",
           "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1"]
    log = open(tmp_path / "server.log", "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert p.poll() is None, open(tmp_path / "server.log").read()[-3000:]
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "mlflow server did not answer: " + open(tmp_path / "server.log").read()[-3000:]
            time.sleep(0.5)
        yield uri
    finally:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            if p.poll() is not None:
                break
            os.killpg(p.pid, sig)  # the group this test's Popen leads (start_new_session)
            try:
                p.wait(wait)
            except subprocess.TimeoutExpired:
                pass
        log.close()


def event_tags(path: str) -> set[str]:
    """The scalar tags of a TensorBoard event file (TFRecords of Event protos: length, its CRC, the proto,
    its CRC)."""
    import struct

    from tensorboardX.proto import event_pb2

    tags, data = set(), open(path, "rb").read()
    at = 0
    while at + 12 <= len(data):
        (n,) = struct.unpack("<Q", data[at:at + 8])
        ev = event_pb2.Event.FromString(data[at + 12:at + 12 + n])
        tags |= {v.tag for v in ev.summary.value}
        at += 12 + n + 4
    return tags


@pytest.mark.slow  # a real MLflow server and a two-run sweep: 1.5 min on a loaded 2-core machine
def test_tiny_sweep_logs_to_a_real_mlflow_server_and_tensorboard(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    from store import Store
    from study.spec.grid import load_grid

    gpath = tmp_path / "g.yaml"
    gpath.write_text(tiny_grid("mlf", steps=10))  # loss at steps 0, 5, 9
    results = str(tmp_path / "results")
    r = study("run", str(gpath), "--results", results, "--num-cpus", "2", "--log", f"mlflow={mlflow_server}",
              "--log", "tensorboard", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"mlflow: one run per trial in experiment 'mlf' at {mlflow_server}" in r.stdout, r.stdout
    grid = load_grid(str(gpath))
    store = Store(results, "mlf")
    hist, evals = store.read("history"), store.read("evals")

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("mlf")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    # one MLflow run per trial, named by its model and seed (issue 44: was its run id, still its run_id tag),
    # and one for the study's figures
    trial_runs = [x for x in runs if x.info.run_name != "study mlf"]
    assert sorted(x.data.tags["run_id"] for x in trial_runs) == sorted(x.run_id for x in grid.runs)
    by_name = {x.data.tags["run_id"]: x for x in trial_runs}
    for run in grid.runs:
        m = by_name[run.run_id]
        assert m.info.status == "FINISHED"
        assert m.info.run_name == f"({run.model.K} x {run.model.L}) d16 seed {run.train.seed}"
        p = m.data.params
        # the run's resolved config as parameters, named as the store's runs table names them (issue 44: were
        # model.K, model.L, model.d_model, train.lr, train.seed, train.steps, task.name)
        assert p["run_id"] == run.run_id and p["study"] == "mlf"
        assert (p["K"], p["L_t"], p["d_model"]) == (str(run.model.K), str(run.model.L), "16")
        assert (float(p["lr"]), p["seed"], p["steps"]) == (run.train.lr, str(run.train.seed), "10")
        assert p["task"] == "sudoku" and "model.L" not in p and "model.mlp_ratio" in p
        # and whole, as an artifact
        import json as _json

        got_cfg = _json.load(open(client.download_artifacts(m.info.run_id, "config.json", str(tmp_path))))
        assert got_cfg == _json.loads(_json.dumps(run.resolved()))
        # the loss curve: every logged training step, the values the store holds, the training step as step
        curve = sorted((h.step, h.value) for h in client.get_metric_history(m.info.run_id, "loss"))
        mine = hist[hist.run_id == run.run_id].sort_values("step")
        assert len(curve) > 1
        assert curve == [(int(s), float(v)) for s, v in zip(mine.step, mine.loss)]
        # final metrics: final_loss, train_seconds, and every metric of every eval point with its interval, as
        # stored, named by what runs share (issue 33: was eval/<eval_key>/vpr, primary only; changed here)
        got = m.data.metrics
        assert got["final_loss"] == float(mine.loss.iloc[-1])
        assert got["train_seconds"] == float(store.run_row(run.run_id)["train_seconds"]) and "time_total_s" not in got
        mine_ev = evals[evals.run_id == run.run_id]
        assert set(mine_ev.metric) >= {"vpr"} and len(mine_ev) > len(run.eval_points())  # more than the primary
        for e in mine_ev.itertuples(index=False):
            if e.sampler == "likelihood":  # the test / validation ELBO and reference NLL: no T, named by split
                name = e.metric + ("" if e.split == "test" else f"/{e.split}")
            else:
                name = f"{e.metric}/T{e.T}" + ("" if e.L_s == run.model.L else f"/Ls{e.L_s}")
            assert got[name] == pytest.approx(float(e.value), abs=0, rel=1e-12), name
            assert got[f"{name}/ci_low"] == pytest.approx(float(e.ci_low), abs=0, rel=1e-12), name
            assert got[f"{name}/ci_high"] == pytest.approx(float(e.ci_high), abs=0, rel=1e-12), name
        assert m.data.tags["interval.vpr"].startswith("95% Wilson") and "L_s = L_t" in m.data.tags["eval.L_s"]
    # a looped and a single-pass model at one T land in one column
    assert all(f"vpr/T{t}" in by_name[x.run_id].data.metrics for x in grid.runs for t in (1, 2))
    assert "View run" not in r.stdout + r.stderr
    # the study's figures, as `study report --figure all` draws them, in a run of their own
    (fig_run,) = [x for x in runs if x.info.run_name == "study mlf"]
    pngs = {a.path for a in client.list_artifacts(fig_run.info.run_id, "figures") if a.path.endswith(".png")}
    assert "figures/iso_param.png" in pngs and "figures/training_curves.png" in pngs, pngs

    # TensorBoard: one event file per trial under <results>/<study>/.ray/<experiment>/<trial>/ (README)
    assert f"tensorboard --logdir {results}/mlf/.ray" in r.stdout, r.stdout
    events = glob.glob(f"{results}/mlf/.ray/*/*/events.out.tfevents.*")
    assert len(events) == len(grid.runs) and all(os.path.getsize(e) > 0 for e in events), events
    # our tags apart from Ray's: study/<MLflow's name>, Ray Tune's bookkeeping under ray/tune/ (and the trial's
    # parameters in TensorBoard's HParams records, _hparams_/); short trial folders
    by_run = {os.path.basename(os.path.dirname(e)).split("_")[0]: event_tags(e) for e in events}
    assert sorted(by_run) == sorted(x.run_id for x in grid.runs), events
    for rid, tags in by_run.items():
        assert {"study/loss", "study/final_loss", "study/train_seconds", "study/vpr/T1", "study/vpr/T2",
                "study/vpr/T1/ci_low"} <= tags, tags
        assert all(t.startswith(("study/", "ray/tune/", "_hparams_/")) for t in tags), tags  # _hparams_: Tune's
        ray_tags = {t for t in tags if t.startswith("ray/tune/")}
        assert ray_tags and not {t.removeprefix("ray/tune/") for t in ray_tags} & {"loss", "final_loss", "step"}, tags
    assert all(len(os.path.basename(os.path.dirname(e))) <= 40 for e in events), events
    assert "/tmp/ray" not in r.stdout + r.stderr  # no hint pointing at Ray's temporary staging directory
    assert "INFO mlflow" not in r.stdout + r.stderr


@pytest.mark.parametrize("value,says", [
    ("neptune", "--log 'neptune': unknown; use mlflow[=URI], wandb or tensorboard"),
    ("tensorboard=/x", "tensorboard takes no value"),
    ("mlflow=", "give a tracking URI"),
])
def test_log_mistakes_are_one_line_exit_2(tmp_path, value, says):
    gpath = tmp_path / "g.yaml"
    gpath.write_text(tiny_grid("mistake"))
    r = study("run", str(gpath), "--results", str(tmp_path / "r"), "--log", value, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not os.path.exists(tmp_path / "r" / "mistake")  # nothing started


def test_unreachable_server_and_missing_package_exit_2(tmp_path):
    gpath = tmp_path / "g.yaml"
    gpath.write_text(tiny_grid("mistake"))
    port = _free_port()  # nothing listens there
    r = study("tune", str(gpath), "--results", str(tmp_path / "r"), "--log", f"mlflow=http://127.0.0.1:{port}",
              timeout=120)
    assert r.returncode == 2 and "cannot reach the MLflow tracking server" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    if importlib.util.find_spec("wandb") is None:  # not in the test extra: the missing-package message
        r = study("run", str(gpath), "--results", str(tmp_path / "r"), "--log", "wandb", timeout=120)
        assert r.returncode == 2 and "pip install 'rmdm-study[wandb]'" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_mlflow_needs_a_uri_beside_a_remote_store(monkeypatch):
    from study.engine.loggers import LogError, Sink, parse

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(LogError, match="is not local: give a tracking URI"):
        parse(["mlflow"], "s3://bucket/results")
    assert parse(["mlflow=sqlite:///x.db", "tensorboard", "tensorboard"], "s3://bucket/results") == [
        Sink("mlflow", "sqlite:///x.db"), Sink("tensorboard")]  # a URI given: fine; repeated: once


def test_tracker_names_say_what_differs_from_the_shared_column():
    from study.engine.loggers import metric_name
    from study.spec.grid import expand

    g = expand({"task": {"name": "sudoku", "n": 4}, "model": {"d_model": 16, "n_heads": 2, "L": 2},
                "eval": {"T": [1], "L_s": ["train", 1]}}, "n.yaml")
    run = g.runs[0]
    first = run.eval.sampler[0]
    assert metric_name("vpr", 4, 2, first, "test", run) == "vpr/T4"  # at L_s = L_t: the column runs share
    assert metric_name("vpr", 4, 1, first, "test", run) == "vpr/T4/Ls1"
    assert metric_name("cell_acc", 1, 2, "other", "val", run) == "cell_acc/T1/other/val"


def test_intervals_stay_inside_the_metrics_bounds_in_the_evals_rows_and_in_mlflow(tmp_path):
    """cell_acc (a mean of 0..1 scores) has a normal interval that can pass 1 (issue 44: ci_high 1.0013 in the
    evals Parquet and in MLflow): the rows are clipped to the metric's declared bounds, and a store written
    before that is clipped on its way to a tracker; a metric without bounds (nll) is not clipped."""
    from store import Store
    from study.engine.loggers import run_label, run_params, tracker_metrics
    from study.engine.rows import metric_rows
    from study.spec.grid import expand
    from tasks import TASKS
    from tests.helpers import full_row

    sudoku = TASKS["sudoku"][1]
    scores = [{"cell_acc": 1.0}] * 9 + [{"cell_acc": 0.9}]
    (raw,), (row,) = metric_rows(scores, ["cell_acc"], {}), metric_rows(scores, ["cell_acc"], {}, sudoku)
    assert raw["ci_high"] > 1 and row["ci_high"] == 1.0 and row["ci_low"] == raw["ci_low"] < row["value"]
    g = expand({"task": {"name": "sudoku", "n": 4}, "model": {"d_model": 16, "n_heads": 2, "L": 2},
                "train": {"seed": 3}, "eval": {"T": [1]}}, "c.yaml")
    run = g.runs[0]
    store = Store(str(tmp_path), run.study)
    key = run.eval_points()[0].key
    store.write_rows("evals", [full_row("evals", run_id=run.run_id, eval_key=key, T=1, L_s=2, split="test",
                                        sampler=run.eval.sampler[0], metric="cell_acc", value=0.99,
                                        ci_low=0.97, ci_high=1.0013)], run.run_id, f"{key}.parquet")
    # `study verify` derives the clipped row again (a store written before, unclipped, is migrated first:
    # study migrate clips it; verify reads the current format only)
    from study.engine.kinds import KINDS

    for stored, ok in ((row["ci_high"], True), (raw["ci_high"], False), (0.999, False)):
        want = KINDS["sample"].derive(None, "p", {**row, "ci_high": stored}, scores, sudoku)
        assert (want["ci_high"] == stored) == ok, (stored, want)
    got, _ = tracker_metrics(store, run)
    assert got["cell_acc/T1"] == 0.99 and got["cell_acc/T1/ci_low"] == 0.97 and got["cell_acc/T1/ci_high"] == 1.0
    # MLflow's names for the run (issue 44: a hash, and model.L where the store says L_t)
    assert run_label(run) == "(1 x 2) d16 seed 3"
    p = run_params(_config_of(run))
    assert (p["K"], p["L_t"], p["d_model"], p["seed"], p["task"]) == (1, 2, 16, 3, "sudoku") and "model.L" not in p


def _config_of(run) -> dict:
    """A trial's config as the runner hands it to Tune (study.engine.raytune.trial_payload)."""
    from study.engine.trial import trial_payload

    return {"run": trial_payload(run)}
