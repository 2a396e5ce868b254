"""Cluster scale on one CPU host: a worker node lost mid-sweep, GPUs packed by fractions.

Run: .venv/bin/python -m pytest -m slow tests/test_cluster_scale.py  (real Ray: a two-node
ray.cluster_utils.Cluster, and a local Ray that declares 2 GPUs; a few minutes)
"""
from __future__ import annotations

import os
import time

import pandas as pd
import pytest
import torch

from study.spec.grid import Resources, load_grid
from study.engine.raystart import _loopback_only
from study.engine.runner import run_grid
from study.commands.status import snapshot
from study.engine.trial import attempts_path, pick_device
from store import Store
from tests.helpers import alive, held, start_driver, wait_training
from tests.test_cluster import two_nodes  # noqa: F401  (the fixture)
from study.engine.options import RunOptions

TINY = """
task: {name: sudoku, n: 4, mask_rate: 0.4, n_train: 40, n_test: 16}
model: {d_model: 16, n_heads: 2}
eval: {T: [1], L_s: [train], n_examples: 16}
"""


def spans(store: Store, runs: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Each run's [first start, row written] in seconds since the epoch, from the store alone: the
    trial writes its start to logs/<run>.attempts and its runs row last, both while it holds its
    Ray resources, so runs whose spans overlap held their resources at the same time."""
    out = {}
    for r in runs.itertuples():
        first = store.read_bytes(attempts_path(store, r.run_id)).decode().splitlines()[0]
        out[r.run_id] = (float(first.split()[-1]), pd.Timestamp(r.created_at).timestamp())
    return out


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])  # an end before a start
    now = most = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def test_max_overlap_counts_runs_at_once():
    assert max_overlap([(0, 2), (1, 3), (2.5, 4)]) == 2
    assert max_overlap([(0, 1), (1, 2)]) == 1  # one ends as the next starts: never two at once
    assert max_overlap([(0, 9), (1, 8), (2, 7), (3, 6)]) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_a_gpu_asked_for_without_cuda_is_an_error_unless_fallback_is_allowed():
    with pytest.raises(RuntimeError, match="CUDA is not available.*allow_cpu_fallback: true"):
        pick_device(Resources(gpu=0.5))
    assert pick_device(Resources(gpu=0.5, allow_cpu_fallback=True)).type == "cpu"
    assert pick_device(Resources()).type == "cpu"


# ---- a node lost mid-sweep ---------------------------------------------------------------------------------

LOSS_GRID = """
study: nodeloss
train: {steps: 300, batch_size: 8, warmup: 2, checkpoint_every: 10, log_every: 5}
resources: {cpu: 1}
retries: 0  # a node loss must not need any: it is not the run's failure
axes:
  L: [1, 2]
""" + TINY


@pytest.mark.slow
def test_a_worker_node_lost_mid_sweep_is_retried_on_the_survivor_from_its_checkpoint(tmp_path, two_nodes):  # noqa: F811
    head_id = two_nodes.head_node.node_id
    (worker,) = list(two_nodes.worker_nodes)
    gpath = tmp_path / "nodeloss.yaml"
    gpath.write_text(LOSS_GRID)
    results = str(tmp_path / "results")
    grid = load_grid(str(gpath))
    store = Store(results, "nodeloss")
    out = tmp_path / "run.out"

    # both first attempts wait before step 15 (after the checkpoint at 10) until `release` exists: the node
    # is lost mid-training however fast this machine trains
    release = tmp_path / "release"
    drv = start_driver(gpath, results, two_nodes.address, out, env=held(grid.runs, release=release))
    try:
        beats = wait_training(drv, store, out, n=2)
        (lost_id,) = [rid for rid, b in beats.items() if b["node_id"] == worker.node_id]
        lost_pid = beats[lost_id]["pid"]

        two_nodes.remove_node(worker, allow_graceful=False)  # as a preempted instance: no warning
        # `study status` (the store alone): the lost run is interrupted, not running, until the
        # survivor's CPU frees up and its trial starts again there
        seen = None
        deadline = time.time() + 120
        while time.time() < deadline and seen is None:
            st = {s.run_id: s for s in snapshot(grid, store)}
            if st[lost_id].state == "interrupted":
                seen = st[lost_id]
            time.sleep(0.1)
        assert seen is not None and seen.checkpoint >= 10, "the lost run never showed as interrupted"
        release.touch()  # the survivor's run goes on; the lost run's retry (attempt 2) is not held
        assert not alive(lost_pid)
        assert drv.wait(timeout=600) == 0, out.read_text()  # finished with nobody's help
    finally:
        if drv.poll() is None:
            drv.kill()
            drv.wait()

    runs = store.read("runs")
    assert sorted(runs.run_id) == sorted(r.run_id for r in grid.runs)  # one row per run: none twice
    assert (runs.status == "done").all() and runs.error.isna().all()
    row = runs.set_index("run_id").loc[lost_id]
    assert row.node_id == head_id and row.attempts == 2  # retried on the surviving node
    log = store.read_bytes(store.path("logs", f"{lost_id}.log")).decode()
    assert f"lost its node {worker.node_id}" in log and "not counted against retries" in log
    ckpt = int(log.split("resuming from checkpoint at step ")[1].split()[0])
    assert ckpt >= seen.checkpoint
    hist = store.read("history")
    h = hist[hist.run_id == lost_id]
    assert sorted(h.step) == sorted({*range(0, 300, 5), 299})  # every logged step once
    assert (h[h.step < ckpt].attempt == 1).all() and (h[h.step >= ckpt].attempt == 2).all()


# ---- GPUs by fractions, on a local Ray that declares two GPUs -------------------------------------------------

@pytest.fixture(scope="module")
def two_gpus():
    """A local Ray with 8 CPUs and 2 GPUs in its accounting (this host has 2 cores and no GPU):
    Ray hands out GPU ids and CUDA_VISIBLE_DEVICES exactly as on a GPU box."""
    _loopback_only()
    import ray

    os.environ.pop("RAY_ADDRESS", None)
    ray.init(num_cpus=8, num_gpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield ray
    finally:
        ray.shutdown()


def sweep(tmp_path, name: str, body: str) -> tuple[int, Store, pd.DataFrame]:
    gpath = tmp_path / f"{name}.yaml"
    gpath.write_text(f"study: {name}\n{body}{TINY}")
    grid = load_grid(str(gpath))
    code = run_grid(grid, str(tmp_path / "results"), RunOptions(echo=lambda *a: None))
    store = Store(str(tmp_path / "results"), name)
    runs = store.read("runs")
    assert sorted(runs.run_id) == sorted(r.run_id for r in grid.runs)
    return code, store, runs


@pytest.mark.slow
def test_half_gpus_pack_four_trials_on_two_gpus(tmp_path, two_gpus):
    code, store, runs = sweep(tmp_path, "frac", """
train: {steps: 30, batch_size: 8, warmup: 2, checkpoint_every: 10, log_every: 5}
resources: {cpu: 1, gpu: 0.5, allow_cpu_fallback: true}  # Ray accounts the GPUs; the trials train on the CPU
axes: {seed: [0, 1, 2, 3, 4, 5]}
""")
    assert code == 0 and (runs.status == "done").all() and (runs.device == "cpu").all()
    assert set(runs.gpu_ids) == {"0", "1"}  # each trial saw the one id Ray gave it; both GPUs used
    span = spans(store, runs)
    assert 2 <= max_overlap(list(span.values())) <= 4  # 0.5 GPU each: never more than 4 at once
    for gpu, rows in runs.groupby("gpu_ids"):
        assert max_overlap([span[r] for r in rows.run_id]) <= 2  # two halves of one GPU
    for rid in runs.run_id:  # the heartbeat carries the id too (what `study status` sees)
        assert store.read_progress()[rid]["gpu_ids"] == runs.set_index("run_id").gpu_ids[rid]


@pytest.mark.slow
def test_whole_gpus_with_four_cpus_pack_two_trials_per_node(tmp_path, two_gpus):
    code, store, runs = sweep(tmp_path, "whole", """
train: {steps: 20, batch_size: 8, warmup: 2, checkpoint_every: 10, log_every: 5}
resources: {cpu: 4, gpu: 1, allow_cpu_fallback: true}
axes: {seed: [0, 1, 2, 3]}
""")
    assert code == 0 and (runs.status == "done").all()
    assert runs.node_id.nunique() == 1 and set(runs.gpu_ids) <= {"0", "1"}  # one node, one whole GPU per trial
    span = spans(store, runs)
    assert max_overlap(list(span.values())) <= 2  # 2 GPUs (and 8 CPUs / 4): two trials at once
    for a in runs.itertuples():  # trials that ran at the same time held different GPUs
        for b in runs.itertuples():
            (s1, e1), (s2, e2) = span[a.run_id], span[b.run_id]
            if a.run_id < b.run_id and s1 < e2 and s2 < e1:
                assert a.gpu_ids != b.gpu_ids


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_a_gpu_trial_without_cuda_fails_clearly_instead_of_training_on_the_cpu(tmp_path, two_gpus):
    code, store, runs = sweep(tmp_path, "nocuda", """
train: {steps: 20, batch_size: 8, warmup: 2, checkpoint_every: 10, log_every: 5}
resources: {cpu: 1, gpu: 0.5}
retries: 0
""")
    assert code == 1 and (runs.status == "failed").all()
    err = runs.error.iloc[0]
    assert "resources.gpu is 0.5 but CUDA is not available" in err and "allow_cpu_fallback: true" in err
    rid = runs.run_id.iloc[0]
    assert store.read("history").empty and not store.exists(store.checkpoint_path(rid))  # nothing trained
