"""One options object per layer: the flags of `study run` / `study tune` travel as one RunOptions (cli ->
run_grid / run_claims / tune_grid), what a driver tells its trials as one TrialOptions (one key of the trial
config -> trainable -> execute). Run: pytest tests/test_options.py -q (one tiny real training in-process)."""
from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from store import Store
from study.engine.options import OPTIONS_KEY, RunOptions, TrialOptions
from study.spec.grid import load_grid
from tests.helpers import tiny_grid


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_drivers_take_one_options_object_and_execute_one_trial_options():
    from study.engine.claims import run_claims
    from study.engine.runner import run_grid
    from study.engine.trial import execute
    from study.engine.tune import tune_grid

    for driver in (run_grid, run_claims, tune_grid):
        assert params(driver) == ["grid", "results", "options"], driver.__name__
        assert inspect.signature(driver).parameters["options"].default == RunOptions()
    assert params(execute) == ["run", "store", "options", "report", "attempt"]


@pytest.mark.parametrize("command", ["run", "tune"])
def test_every_flag_of_run_and_tune_is_a_field_of_run_options(command):
    """A flag added to `study run` or `study tune` without its RunOptions field fails here."""
    import typer.main

    from study.cli import app

    cmd = typer.main.get_command(app).commands[command]
    flags = {p.name for p in cmd.params} - {"grid", "overrides", "results"}
    named = {"progress_every": "progress_every_s"}  # the flag's name -> the field's, where they differ
    assert {named.get(f, f) for f in flags} <= {f.name for f in dataclasses.fields(RunOptions)} - {"echo"}
    assert flags, "the command's flags were not found"


def test_trial_options_are_one_plain_key_of_the_trial_config():
    opts = TrialOptions("v1", results="/r", grid="abc", lease={"id": "x", "epoch": 3})
    config = json.loads(json.dumps(opts.config()))  # plain data: it travels to trials on other nodes
    assert list(config) == [OPTIONS_KEY]
    assert TrialOptions.of_config({"run": {}, **config}) == opts


def test_trial_options_reach_execute(tmp_path, monkeypatch):
    """execute writes the options' code version and grid hash into the run's config and row; a fault the test
    injects (tests/faults: a NaN at step 5) fails the run there."""
    from study.engine.trial import execute

    (tmp_path / "o.yaml").write_text(tiny_grid("opts", steps=10, n_test=4, T="[1]", axes="seed: [0, 1]"))
    grid = load_grid(str(tmp_path / "o.yaml"))
    store = Store(str(tmp_path / "results"), grid.study)
    a, b = grid.runs
    row = execute(a, store, TrialOptions("v-opts", grid="g123"))
    assert (row["code_version"], row["grid"]) == ("v-opts", "g123")
    config = json.loads((tmp_path / "results" / "opts" / "configs" / f"{a.run_id}.json").read_text())
    assert (config["code_version"], config["grid"]) == ("v-opts", "g123")
    monkeypatch.setenv("RMDM_FAULT_NAN_AT", f"{b.run_id}:5")
    with pytest.raises(Exception):
        execute(b, store, TrialOptions("v-opts"))
    assert not store.exists(store.weights_path(b.run_id))


def test_a_flag_named_in_both_option_classes_reaches_the_trials(monkeypatch):
    """RunOptions.trial: the driver's values, and every flag TrialOptions names too, so a flag for the trials
    is one field in each class and nothing in between (none today: here a TrialOptions with --retry-failed)."""
    import study.engine.options as options

    @dataclasses.dataclass(frozen=True)
    class WithFlag(TrialOptions):
        retry_failed: bool = False

    opts = RunOptions(retry_failed=True)
    assert opts.trial(code_version="v", lease={"gen": 1}) == TrialOptions("v", lease={"gen": 1})
    monkeypatch.setattr(options, "TrialOptions", WithFlag)
    assert opts.trial(code_version="v") == WithFlag("v", retry_failed=True)
