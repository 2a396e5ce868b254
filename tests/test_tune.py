"""Optuna search through Ray Tune: real local Ray, real SQLite storage, real tiny models.

Run: pytest tests/test_tune.py   (the SIGINT test of a `study tune` process: pytest -m slow tests/test_tune.py)
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from study.spec.grid import GridError, expand, load_grid
from store import Store
from study.engine.tune import storage_url, tune_grid, tuning_run, with_values
from study.engine.options import RunOptions
from tests.test_cluster import two_nodes  # noqa: F401  (the fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = {
    "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 30, "n_test": 16},
    "model": {"d_model": 16, "n_heads": 2},
    "train": {"steps": 12, "batch_size": 8, "warmup": 2, "checkpoint_every": 6, "log_every": 4},
    "eval": {"T": [2], "L_s": ["train"], "n_examples": 16},
}
SEARCH = {"n_trials": 3, "metric": "val_loss", "mode": "min", "max_concurrent": 2, "seed": 3,
          "params": {"lr": {"dist": "loguniform", "low": 1e-4, "high": 1e-1}}}


def search_grid(study="tunetest", **search):
    return {"study": study, **copy.deepcopy(BASE), "search": {**copy.deepcopy(SEARCH), **search}}


def write(path, raw) -> str:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def ray_local():
    from study.engine.raystart import init_ray

    ray, started = init_ray(None, num_cpus=2)
    yield ray
    if started:
        ray.shutdown()


def trials(results, study, group):
    st = optuna.load_study(study_name=group, storage=storage_url(Store(results, study)))
    return st.get_trials(deepcopy=False)


@pytest.mark.slow  # three trials and a resumed search; a real search on Ray also: test_asha_stops_the_trial_...
def test_search_resumes_without_repeats_and_feeds_a_sweep(tmp_path, ray_local, monkeypatch):
    results = str(tmp_path / "results")
    gpath = write(tmp_path / "tunetest.yaml", search_grid())
    grid = load_grid(gpath)
    assert [g.name for g in grid.search_groups] == ["tunetest"]
    assert tune_grid(grid, results, RunOptions(echo=lambda *_: None)) == 0

    store = Store(results, "tunetest")
    first = trials(results, "tunetest", "tunetest")
    assert [t.state for t in first] == [TrialState.COMPLETE] * 3
    # every trial is a run of the store, its sampled lr part of its config and of its id
    runs = store.read("runs").set_index("run_id")
    for t in first:
        run = with_values(grid.search_groups[0].run, t.params)
        assert t.user_attrs["run_id"] == run.run_id and runs.loc[run.run_id, "status"] == "done"
        assert runs.loc[run.run_id, "lr"] == pytest.approx(t.params["train.lr"])
    assert len({t.params["train.lr"] for t in first}) == 3

    # an interrupted session leaves a trial RUNNING in the storage (asked, never told): resuming
    # fails it, runs its values again, keeps the finished ones and samples new values
    st = optuna.load_study(study_name="tunetest", storage=storage_url(store))
    cut = st.ask({"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)})
    grid5 = load_grid(write(tmp_path / "tunetest.yaml", search_grid(n_trials=5)))
    assert tune_grid(grid5, results, RunOptions(echo=lambda *_: None)) == 0
    after = trials(results, "tunetest", "tunetest")
    done = [t for t in after if t.state == TrialState.COMPLETE]
    assert len(done) == 5 and after[cut.number].state == TrialState.FAIL
    assert after[cut.number].user_attrs["interrupted"] is True
    assert any(t.params == cut.params and t.user_attrs.get("resumes_trial") == cut.number for t in done)
    lrs = [t.params["train.lr"] for t in done]
    assert len(set(lrs)) == 5, lrs  # no value proposed twice (the same seed would repeat the first three)
    for t in first:  # finished trials were not trained again
        log = open(store.path("logs", f"{t.user_attrs['run_id']}.log")).read()
        assert log.count("training from step 0") == 1 and "final weights found" not in log
    assert len(store.read("runs")) == 5

    # best.yaml -> a sweep grid by reference: the sweep's run is the best trial's run
    monkeypatch.chdir(tmp_path)  # defaults_from paths are relative to the working directory
    best = yaml.safe_load(open(store.path("best.yaml")))
    g = best["groups"]["tunetest"]
    assert g["value"] == pytest.approx(min(t.value for t in done))
    sweep = {**copy.deepcopy(BASE), "study": "sweep_after_tune",
             "defaults_from": {"file": "results/tunetest/best.yaml", "group": "auto"}}
    sg = expand(sweep, "sweep.yaml")
    assert len(sg.runs) == 1 and sg.runs[0].train.lr == g["best"]["train.lr"]
    assert sg.runs[0].run_id == g["run_id"]  # `study run` of this sweep finds it trained
    assert sg.tuned[g["run_id"]]["train.lr"]["group"] == "tunetest"
    r = subprocess.run([sys.executable, "-m", "study.cli", "plan", write(tmp_path / "sweep.yaml", sweep)],
                       capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    assert "train.lr = " in r.stdout and "from search group tunetest of results/tunetest/best.yaml" in r.stdout


@pytest.mark.parametrize("pruning, bad_lr", [
    # same seed -> same initial weights, batches and noise: at step 4 only the lr differs;
    # lr 1e-6 leaves the training loss where it started, lr 3e-2 has lowered it
    ({"metric": "loss", "grace_period": 4, "reduction_factor": 2}, 1e-6),
    # the search metric itself (val_loss), from an intermediate evaluation every 4 steps; at this
    # scale lr 1e-6 vs 3e-2 does not separate val_loss (measured: 1.098 vs 1.108 after 24 steps),
    # a far too large lr does
    pytest.param({"metric": "objective", "every": 4, "grace_period": 4, "reduction_factor": 2}, 3.0,
                 marks=pytest.mark.slow),
])
def test_asha_stops_the_trial_with_the_bad_loss(tmp_path, ray_local, pruning, bad_lr):
    raw = search_grid("prunetest", n_trials=2, max_concurrent=1, metric="val_loss",
                      points=[{"lr": 3e-2}, {"lr": bad_lr}],
                      params={"lr": {"dist": "loguniform", "low": 1e-7, "high": 10.0}}, pruning=pruning)
    raw["train"]["steps"] = 24
    results = str(tmp_path / "results")
    assert tune_grid(load_grid(write(tmp_path / "p.yaml", raw)), results, RunOptions(echo=lambda *_: None)) == 0
    good, bad = trials(results, "prunetest", "prunetest")
    assert good.state == TrialState.COMPLETE and bad.state == TrialState.PRUNED
    assert bad.params == {"train.lr": bad_lr}
    store = Store(results, "prunetest")
    row = store.run_row(bad.user_attrs["run_id"])
    assert row["status"] == "pruned" and "ASHA" in row["error"]
    assert not store.exists(store.weights_path(bad.user_attrs["run_id"]))  # it never finished training
    best = yaml.safe_load(open(store.path("best.yaml")))["groups"]["prunetest"]
    assert best["best"] == {"train.lr": 3e-2} and best["trials"] == {"complete": 1, "pruned": 1}


@pytest.mark.parametrize("change, key, hint", [
    ({"params": {"lr": {"dist": "logunif", "low": 1e-4, "high": 1e-2}}}, "search.params.lr.dist",
     "allowed: choice, int, loguniform, uniform"),
    ({"params": {"lr": [1e-3, 1e-2]}}, "search.params.lr", "grid-search axis"),
    ({"params": {"model.depth": {"dist": "int", "low": 1, "high": 3}}}, "search.params.model.depth",
     "allowed: K, L"),
    ({"params": {"lr": {"dist": "loguniform", "low": 0, "high": 1e-2}}}, "search.params.lr.low", "low > 0"),
    ({"params": {"lr": {"dist": "uniform", "low": 1e-2, "high": 1e-3}}}, "search.params.lr", "low < high"),
    ({"params": {"steps": {"dist": "uniform", "low": 10, "high": 20}}}, "search.params.steps.dist",
     "integer field"),
    ({"params": {"model.dropout": {"dist": "uniform", "low": 0.0, "high": 1.5}}}, "search.params.model.dropout",
     "invalid run"),
    ({"params": {"train.log_every": {"dist": "int", "low": 1, "high": 5}}}, "search.params.train.log_every",
     "nothing to search"),
    ({"metric": {"name": "vpr"}}, "search.metric.T", "give T"),
    ({"metric": {"name": "vpr", "T": 7}, "mode": "max"}, "search.metric", "not in the grid's `eval` section"),
    ({"metric": {"name": "rtr", "T": 2}, "mode": "max"}, "search.metric.name", "allowed: vpr, cell_acc, exact"),
    ({"mode": "maximize"}, "search.mode", "'max' or 'min'"),
    ({"trials": 3}, "search.trials", "allowed: max_concurrent, metric"),
    ({"pruning": {"metric": "loss", "grace_period": 50}}, "search.pruning.grace_period", "below train.steps"),
    ({"pruning": {"metric": "objective", "grace_period": 4}}, "search.pruning.every", "needs `every`"),
    ({"points": [{"lr": 5.0}]}, "search.points[0].train.lr", "outside"),
    ({"split": "train"}, "search.split", "must be val"),
    ({"split": "test"}, "search.split", "must be val (got 'test')"),
])
def test_malformed_search_sections_fail_naming_file_and_key(change, key, hint):
    raw = search_grid(**change)
    with pytest.raises(GridError) as e:
        expand(raw, "grids/bad_tune.yaml")
    msg = str(e.value)
    assert msg.startswith("grids/bad_tune.yaml: key '") and key in msg and hint in msg, msg


def test_a_search_key_that_is_also_an_axis_fails():
    raw = {**search_grid(), "axes": {"lr": [1e-3, 1e-2]}}
    with pytest.raises(GridError, match="search.params.train.lr.*also a grid-search axis"):
        expand(raw, "g.yaml")


def test_search_groups_one_per_architecture():
    raw = {**search_grid(), "couple": [[{"K": 1, "L": 2}, {"K": 2, "L": 1}]]}
    g = expand(raw, "g.yaml")
    assert [(s.name, s.point) for s in g.search_groups] == [
        ("K1_L2", {"model.K": 1, "model.L": 2}), ("K2_L1", {"model.K": 2, "model.L": 1})]


def best_file(tmp_path, groups, **extra) -> None:
    d = tmp_path / "results" / "t"
    d.mkdir(parents=True, exist_ok=True)
    doc = {"kind": "rmdm-study/best-values", "study": "t", "split": "val", "groups": groups, **extra}
    (d / "best.yaml").write_text(yaml.safe_dump({k: v for k, v in doc.items() if v is not None}))


@pytest.mark.parametrize("ref, extra, key, hint", [
    ({"file": "/etc/best.yaml", "group": "auto"}, {}, "defaults_from.file", "relative path"),
    ({"file": "../results/t/best.yaml", "group": "auto"}, {}, "defaults_from.file", "without '..'"),
    ({"file": "results/none/best.yaml", "group": "auto"}, {}, "defaults_from.file", "run `study tune` first"),
    ({"file": "results/t/best.yaml", "group": "K9"}, {}, "defaults_from.group", "groups: K1, K2"),
    ({"file": "results/t/best.yaml"}, {}, "defaults_from", "{file:"),
    ({"file": "results/t/best.yaml", "group": "auto"}, {"axes": {"K": [3]}}, "defaults_from.group",
     "0 search groups"),
    ({"file": "results/t/best.yaml", "group": "K1"}, {"axes": {"lr": [1e-3]}}, "defaults_from",
     "also an axis"),
])
def test_defaults_from_is_validated_strictly(tmp_path, monkeypatch, ref, extra, key, hint):
    monkeypatch.chdir(tmp_path)
    best_file(tmp_path, {"K1": {"point": {"model.K": 1}, "best": {"train.lr": 0.002}},
                         "K2": {"point": {"model.K": 2}, "best": {"train.lr": 0.004}}})
    with pytest.raises(GridError) as e:
        expand({**copy.deepcopy(BASE), "defaults_from": ref, **extra}, "sweep.yaml")
    msg = str(e.value)
    assert msg.startswith("sweep.yaml: key '") and key in msg and hint in msg, msg


@pytest.mark.parametrize("split, hint", [("test", "records split 'test'"),
                                         (None, "records no split (written before `study tune` scored on val")])
def test_best_values_not_selected_on_val_are_refused(tmp_path, monkeypatch, split, hint):
    """A best.yaml whose values were selected on the test split (or one from before searches recorded
    their split, when they were scored on test) never feeds a sweep."""
    monkeypatch.chdir(tmp_path)
    best_file(tmp_path, {"K1": {"point": {"model.K": 1}, "best": {"train.lr": 0.002}}}, split=split)
    with pytest.raises(GridError) as e:
        expand({**copy.deepcopy(BASE), "defaults_from": {"file": "results/t/best.yaml", "group": "K1"}}, "sweep.yaml")
    msg = str(e.value)
    assert msg.startswith("sweep.yaml: key 'defaults_from.file': results/t/best.yaml ") and hint in msg, msg
    assert "must come from a search scored on val" in msg and "\n" not in msg


def test_study_tune_refuses_search_split_test_in_one_line(tmp_path):
    gpath = write(tmp_path / "tt.yaml", search_grid("tt", split="test"))
    r = subprocess.run([sys.executable, "-m", "study.cli", "tune", gpath, "--results", str(tmp_path / "results")],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert gpath in r.stderr and "search.split" in r.stderr and "must be val (got 'test')" in r.stderr, r.stderr
    assert not (tmp_path / "results" / "tt").exists()


def test_defaults_from_auto_gives_each_architecture_its_own_values(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    best_file(tmp_path, {"K1": {"point": {"model.K": 1}, "best": {"train.lr": 0.002}},
                         "K2": {"point": {"model.K": 2}, "best": {"train.lr": 0.004, "train.warmup": 7}}})
    g = expand({**copy.deepcopy(BASE), "axes": {"K": [1, 2]},
                "defaults_from": {"file": "results/t/best.yaml", "group": "auto"}}, "sweep.yaml")
    got = {(r.model.K, r.train.lr, r.train.warmup) for r in g.runs}
    assert got == {(1, 0.002, 2), (2, 0.004, 7)}


@pytest.mark.slow
def test_sigint_interrupts_study_tune_and_a_second_call_resumes(tmp_path):
    """A real Ctrl-C on `study tune` while its third trial is mid-training, then `study tune` again.

    The third trial is held at step 8 (after its checkpoint at step 6) by a fault (tests/faults), so the
    Ctrl-C lands there however fast this machine trains (a tiny trial takes a tenth of a second)."""
    from tests.helpers import ctrl_c_when, faulty, unheld

    lrs = [3e-3, 1e-2, 2e-2]
    raw = search_grid("sig", n_trials=5, max_concurrent=1, points=[{"lr": v} for v in lrs])
    gpath = write(tmp_path / "sig.yaml", raw)
    grid = load_grid(gpath)
    ids = [with_values(tuning_run(grid.search_groups[0].run, grid.search), {"train.lr": v}).run_id for v in lrs]
    store = Store(str(tmp_path / "results"), "sig")
    cmd = [sys.executable, "-m", "study.cli", "tune", gpath, "--results", str(tmp_path / "results"),
           "--num-cpus", "2"]
    env = {**os.environ, **faulty(holds={ids[2]: 8})}
    # the third trial waits at step 8, its step-6 checkpoint written
    code, out = ctrl_c_when(cmd, tmp_path, env, lambda: os.path.exists(store.checkpoint_path(ids[2])), after=300)
    assert code == 130 and "interrupted after 2 of 5 trials" in out, out
    before = {t.number: t for t in trials(str(tmp_path / "results"), "sig", "sig")}
    finished = [t for t in before.values() if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["run_id"] for t in finished) == sorted(ids[:2]), [t.state for t in before.values()]
    assert before[2].state == TrialState.RUNNING and before[2].user_attrs["run_id"] == ids[2]

    env = unheld(env)
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "trial 2 was interrupted" in r.stdout, r.stdout + r.stderr
    after = trials(str(tmp_path / "results"), "sig", "sig")
    done = [t for t in after if t.state == TrialState.COMPLETE]
    assert len(done) == 5 and len({t.params["train.lr"] for t in done}) == 5
    for t in finished:  # never trained again
        assert after[t.number].state == TrialState.COMPLETE
        log = open(store.path("logs", f"{t.user_attrs['run_id']}.log")).read()
        assert log.count("training from step 0") == 1 and "final weights found" not in log
    log = open(store.path("logs", f"{ids[2]}.log")).read()  # the cut trial resumed from its checkpoint
    assert log.count("training from step 0") == 1 and "resuming from checkpoint at step 6" in log, log


AUDIT = '''
"""Loaded at startup by every Python process of the test's `study tune` (driver and Ray workers):
once `tasks` is imported, every task's eval_set appends the split it is asked for to a log."""
import os

import faultplug  # the tests' one import hook (tests/faults)


def audit(mod):
    for _, cls in mod.TASKS.values():
        real = cls.eval_set

        def eval_set(self, split="test", _real=real):
            with open(os.environ["RMDM_SPLIT_LOG"], "a") as f:
                f.write(f"{os.getpid()} {type(self).__name__} {split}\\n")
            return _real(self, split)

        cls.eval_set = eval_set


if os.environ.get("RMDM_SPLIT_LOG"):
    faultplug.on_import("tasks", audit)
'''


@pytest.mark.slow  # a real tune; the test split refused also: test_study_tune_refuses_search_split_test_in_one_line
def test_study_tune_never_reads_the_test_split(tmp_path):
    """A tiny copy of grids/tune_sudoku_lr.yaml (4x4, one group, ASHA on the objective, so trials
    are also scored mid-training) run by the real `study tune`: every eval_set call of the real
    Sudoku task, in the driver and in the Ray workers, asks for 'val', and every evals row says val."""
    with open(os.path.join(ROOT, "grids", "tune_sudoku_lr.yaml")) as f:
        raw = yaml.safe_load(f)
    raw.pop("axes")
    raw.update(study="tlr", model={"d_model": 16, "n_heads": 2})
    raw["task"].update(n=4, n_train=30, n_test=16, n_val=16)
    raw["train"].update(steps=12, batch_size=8, warmup=2, checkpoint_every=6, log_every=4)
    raw["eval"].update(n_examples=16)
    raw["search"].update(n_trials=2, max_concurrent=1, points=[{"lr": 3.0e-3}],
                         pruning={"scheduler": "asha", "metric": "objective", "every": 6, "grace_period": 6},
                         params={"lr": raw["search"]["params"]["lr"]})
    gpath = write(tmp_path / "tlr.yaml", raw)
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "sitecustomize.py").write_text(AUDIT)
    log = tmp_path / "splits.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(audit), os.path.join(ROOT, "tests", "faults"), ROOT]),
           "RMDM_SPLIT_LOG": str(log)}
    results = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "study.cli", "tune", gpath, "--results", str(results),
                        "--num-cpus", "2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    asked = [ln.split() for ln in log.read_text().splitlines()]
    assert asked and {split for _, _, split in asked} == {"val"}, asked
    assert len({pid for pid, _, _ in asked}) >= 1 and {name for _, name, _ in asked} == {"Sudoku"}
    evals = Store(str(results), "tlr").read("evals")
    assert len(evals) and set(evals["split"]) == {"val"}
    done = [t for t in trials(str(results), "tlr", "tlr") if t.state == TrialState.COMPLETE]
    for t in done:  # the objective is the val row of the trial's run
        row = evals[(evals.run_id == t.user_attrs["run_id"]) & (evals.metric == "vpr")]
        assert t.value == pytest.approx(float(row.value.iloc[0]))
    assert "split: val" in (results / "tlr" / "best.yaml").read_text()


# ---- the one driver: a search's trials are the run's (killed driver, lost node) ------------------------------

def _tune_ids(grid) -> list[str]:
    """The run ids of a search's enqueued points (its first trials)."""
    base = tuning_run(grid.search_groups[0].run, grid.search)
    return [with_values(base, p).run_id for p in grid.search.points]


def _trained_once(store: Store, ids: list[str], steps: int, log_every: int) -> None:
    """Every run done once, every logged step in its history once, trained from step 0 once and resumed once."""
    runs = store.read("runs")
    assert sorted(runs.run_id) == sorted(ids) and (runs.status == "done").all(), runs
    hist = store.read("history")
    for rid in ids:
        assert sorted(hist[hist.run_id == rid].step) == sorted({*range(0, steps, log_every), steps - 1}), rid
        log = open(store.path("logs", f"{rid}.log")).read()
        assert log.count("training from step 0") == 1 and "resuming from checkpoint at step" in log, log


def _checkpointed(drv, store: Store, out, ids: list[str], at: int, timeout: float = 400) -> dict:
    """Heartbeats once every run of `ids` trains with a checkpoint at step `at` or later (the driver lives)."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        assert drv.poll() is None, open(out).read()
        beats = store.read_progress()
        if all(beats.get(r, {}).get("phase") == "train" and (beats[r].get("checkpoint") or 0) >= at for r in ids):
            return beats
        time.sleep(0.2)
    raise AssertionError("no checkpoint in time: " + open(out).read())


@pytest.mark.slow
def test_a_killed_tune_driver_resumes_with_nothing_lost_and_nothing_trained_twice(tmp_path):
    """SIGKILL to `study tune` while both trials are mid-training (held at step 8, past their checkpoint at
    step 6), then `study tune` again: its lease is taken over (the only lock), the cut trials run their values
    again from their checkpoints, and every run trains each step once."""
    from tests.helpers import faulty, kill_driver, study_cmd

    raw = search_grid("tkill", n_trials=2, max_concurrent=2, points=[{"lr": 3e-3}, {"lr": 1e-2}])
    grid = load_grid(write(tmp_path / "tkill.yaml", raw))
    ids, results = _tune_ids(grid), str(tmp_path / "results")
    store, out = Store(results, "tkill"), tmp_path / "tune1.out"
    cmd = study_cmd("tune", str(tmp_path / "tkill.yaml"), "--results", results, "--num-cpus", "2")
    env = {**os.environ, "PYTHONPATH": ROOT}
    drv = subprocess.Popen(cmd, cwd=ROOT, env={**env, **faulty(holds={i: 8 for i in ids})}, start_new_session=True,
                           stdout=open(out, "w"), stderr=subprocess.STDOUT)
    try:
        _checkpointed(drv, store, out, ids, at=6)
    finally:
        kill_driver(drv, [])
    assert store.read("runs").empty
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, start_new_session=True)
    assert r.returncode == 0 and "lease: took over study tkill" in r.stdout, r.stdout + r.stderr
    done = [t for t in trials(results, "tkill", "tkill") if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["run_id"] for t in done) == sorted(ids)
    _trained_once(store, ids, steps=12, log_every=4)


@pytest.mark.slow
def test_a_node_lost_during_tune_is_retried_on_the_survivor_without_spending_retries(tmp_path, two_nodes):
    """Two trials, one per node, held mid-training; the worker node is removed (as a preempted instance):
    its trial is retried on the surviving node from its checkpoint, though the grid allows no retries."""
    import time

    from tests.helpers import alive, faulty, study_cmd

    raw = search_grid("tloss", n_trials=2, max_concurrent=2, points=[{"lr": 3e-3}, {"lr": 1e-2}])
    raw.update(resources={"cpu": 1}, retries=0)  # a node loss must not need any
    raw["train"].update(steps=40, checkpoint_every=10, log_every=5)
    gpath = write(tmp_path / "tloss.yaml", raw)
    grid = load_grid(gpath)
    ids, results = _tune_ids(grid), str(tmp_path / "results")
    store, out, release = Store(results, "tloss"), tmp_path / "tune.out", tmp_path / "release"
    (worker,) = list(two_nodes.worker_nodes)
    drv = subprocess.Popen(study_cmd("tune", gpath, "--results", results, "--address", two_nodes.address), cwd=ROOT,
                           env={**os.environ, **faulty(holds={i: 15 for i in ids}, release=release)},
                           start_new_session=True, stdout=open(out, "w"), stderr=subprocess.STDOUT)
    try:
        beats = _checkpointed(drv, store, out, ids, at=10)
        (lost,) = [r for r in ids if beats[r]["node_id"] == worker.node_id]
        lost_pid = beats[lost]["pid"]
        two_nodes.remove_node(worker, allow_graceful=False)
        deadline = time.time() + 120  # its trial's process ends with the node before the hold lifts
        while alive(lost_pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not alive(lost_pid)
        release.touch()  # the survivor goes on; the lost trial's retry (attempt 2) is not held
        assert drv.wait(timeout=600) == 0, out.read_text()
    finally:
        if drv.poll() is None:
            drv.kill()
            drv.wait()
    done = [t for t in trials(results, "tloss", "tloss") if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["run_id"] for t in done) == sorted(ids)
    row = store.read("runs").set_index("run_id").loc[lost]
    assert row.node_id == two_nodes.head_node.node_id and row.attempts == 2
    log = open(store.path("logs", f"{lost}.log")).read()
    assert f"lost its node {worker.node_id}" in log and "not counted against retries" in log
    hist = store.read("history")
    assert sorted(hist[hist.run_id == lost].step) == sorted({*range(0, 40, 5), 39})
