"""Fault injection for the tests; the product never imports it.

A test arms it through environment variables, each "RUN_ID:STEP[,RUN_ID:STEP...]" (helpers.faulty, held):
  RMDM_FAULT_NAN_AT       the run's weights turn to NaN before that training step, in every attempt that
                          reaches it: a diverging run, deterministic on any CPU
  RMDM_FAULT_HOLD_AT      the run's first attempt stops before that step and waits to be killed: a trial
                          sure to be mid-training when a test kills it, however fast the machine trains
  RMDM_FAULT_RELEASE_FILE with it, a held attempt goes on once this file exists
or writes them, as JSON, to the file $RMDM_FAULT_FILE names (conftest's `faults` fixture: read at every
run's start, it reaches the workers of a Ray started before the test set its faults).
A process whose PYTHONPATH holds this folder (a `study` subprocess, a Ray worker: helpers.faulty puts it
there, and in Ray's runtime environment for the workers of other nodes) loads it through sitecustomize.py;
the test process arms it in conftest.py. Armed, it wraps the batch function of every run's trainer once
the run's heartbeat starts (study.engine.trial._Heartbeat: it knows the run id and the attempt).
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time

FAULT_ENV, HOLD_ENV, RELEASE_ENV = "RMDM_FAULT_NAN_AT", "RMDM_FAULT_HOLD_AT", "RMDM_FAULT_RELEASE_FILE"
FILE_ENV = "RMDM_FAULT_FILE"


def setting(name: str) -> str:
    """A fault variable: from the file $RMDM_FAULT_FILE names where that sets it, else the environment."""
    try:
        with open(os.environ.get(FILE_ENV) or os.devnull) as f:
            return json.loads(f.read() or "{}").get(name) or os.environ.get(name, "")
    except OSError:
        return os.environ.get(name, "")
TRIAL = "study.engine.trial"


def injected_faults(spec: str | None = None, env: str = FAULT_ENV) -> dict[str, int]:
    """Run id -> step of one kind of fault, from `spec` (default: the environment variable `env`)."""
    spec = setting(env) if spec is None else spec
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        run_id, sep, step = item.partition(":")
        if not sep or not step.strip().isdigit():
            raise ValueError(f"${env}: {item!r}: use RUN_ID:STEP[,RUN_ID:STEP...]")
        out[run_id.strip()] = int(step)
    return out


def hold(step: int, attempt: int, at: int | None, release: str | None = None) -> None:
    """The first attempt waits at step `at` until its process is killed, or until the file `release` exists."""
    while step == at and attempt == 1 and not (release and os.path.exists(release)):
        time.sleep(0.2)


def poison(step: int, model, at: int | None) -> None:
    """At step `at`, every weight turns to NaN: that step's loss is NaN, on every machine."""
    import torch

    if step == at:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))


def patch(trial) -> None:
    """Wrap the trainer's batch function of every run whose id the environment names (read per run)."""
    beat = trial._Heartbeat
    if getattr(beat, "_faults_armed", False):
        return
    start = beat.__init__

    def __init__(self, store, run_id, trainer, attempt, *args, **kw):
        start(self, store, run_id, trainer, attempt, *args, **kw)
        nan, at = injected_faults().get(run_id), injected_faults(env=HOLD_ENV).get(run_id)
        if nan is None and at is None:
            return
        batch, release = trainer.batch_fn, setting(RELEASE_ENV) or None

        def faulty(step, g):
            hold(step, attempt, at, release)
            poison(step, trainer.model, nan)
            return batch(step, g)

        trainer.batch_fn = faulty

    beat.__init__, beat._faults_armed = __init__, True


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` as the module `name` is imported (before any other module binds its names)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec


def on_import(name: str, then) -> None:
    """then(module `name`) now if it is imported, else as it is: the tests' one import hook (faults here, the
    split audit of tests/test_tune.py)."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(isinstance(f, _OnImport) and (f.name, f.then) == (name, then) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnImport(name, then))


def arm() -> None:
    """Patch study.engine.trial now if imported, else when it is."""
    on_import(TRIAL, patch)
