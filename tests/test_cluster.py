"""A real two-node Ray cluster on this machine: trials on both nodes, driver killed, sweep resumed.

Run: pytest -m slow tests/test_cluster.py  (two raylets from ray.cluster_utils.Cluster; a few minutes)
"""
from __future__ import annotations

import time

import pytest

from study.spec.grid import load_grid
from study.engine.raystart import _loopback_only
from store import Store
from tests.helpers import alive, held, kill_driver, start_driver, tiny_grid, wait_training

GRID = tiny_grid("cluster", steps=150, T="[1]", extra="resources: {cpu: 1}")


@pytest.fixture
def two_nodes():
    _loopback_only()  # both raylets on 127.0.0.1
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1},
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_sweep_on_two_nodes_survives_a_killed_driver(tmp_path, two_nodes):
    node_ids = {n.node_id for n in [two_nodes.head_node, *two_nodes.worker_nodes]}
    assert len(node_ids) == 2
    gpath = tmp_path / "cluster.yaml"
    gpath.write_text(GRID)
    results = str(tmp_path / "results")
    grid = load_grid(str(gpath))
    store = Store(results, "cluster")

    # each first attempt waits before step 15, after its checkpoint at 10: the kill lands mid-training
    drv = start_driver(gpath, results, two_nodes.address, tmp_path / "run1.out", env=held(grid.runs))
    try:
        beats = wait_training(drv, store, tmp_path / "run1.out", n=2)
        training = [b for b in beats.values() if b.get("phase") == "train"]
        # one trial per node (1 CPU each), each heartbeat names its Ray node
        assert {b["node_id"] for b in training} == node_ids
        trial_pids = [b["pid"] for b in training]
        kill_driver(drv, [])
        # the cluster ends the dead driver's trials itself (they are the cluster's processes, not the driver's)
        deadline = time.time() + 120
        while any(alive(p) for p in trial_pids) and time.time() < deadline:
            time.sleep(0.5)
        assert not any(alive(p) for p in trial_pids)
    finally:
        if drv.poll() is None:
            drv.kill()
            drv.wait()
    assert store.read("runs").empty

    drv = start_driver(gpath, results, two_nodes.address, tmp_path / "run2.out")
    assert drv.wait(timeout=600) == 0, (tmp_path / "run2.out").read_text()
    runs = store.read("runs")
    assert sorted(runs.run_id) == sorted(r.run_id for r in grid.runs) and (runs.status == "done").all()
    assert set(runs.node_id) == node_ids and runs.node_ip.notna().all()  # concurrent: one per node
    hist = store.read("history")
    for run in grid.runs:
        log = store.read_bytes(store.path("logs", f"{run.run_id}.log")).decode()
        ckpt = int(log.split("resuming from checkpoint at step ")[1].split()[0])
        h = hist[hist.run_id == run.run_id]
        assert ckpt >= 10 and sorted(h.step) == sorted({*range(0, 150, 5), 149})
        assert (h[h.step < ckpt].attempt == 1).all() and (h[h.step >= ckpt].attempt == 2).all()
