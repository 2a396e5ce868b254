"""Fault injection for tests: the one place the product reads it, off unless an environment variable says.

Each variable holds "RUN_ID:STEP[,RUN_ID:STEP...]". The driver (`study run`, `study tune`) reads them
(`fault_config`, in the trials' param space: the trials may run on other nodes, where the driver's
environment is not), a trial takes its run's steps (`fault_steps`, as `study.engine.trial.execute`'s arguments)
and its training calls `before_step` before every step.
"""
from __future__ import annotations

import os
import time

import torch

# the run's weights turn to NaN before that training step, in every attempt that reaches it: a diverging
# run, deterministic on any CPU (a huge lr overflows at a step that depends on the instruction set)
FAULT_ENV = "RMDM_FAULT_NAN_AT"
# the run's first attempt stops before that step and waits to be killed: a trial sure to be mid-training
# when a test kills it, however fast the machine trains
HOLD_ENV = "RMDM_FAULT_HOLD_AT"
# with it, a held attempt goes on once this file exists (a test that needs the held run to finish later
# creates it); without it, a held attempt waits until it is killed
RELEASE_ENV = "RMDM_FAULT_RELEASE_FILE"


def injected_faults(spec: str | None = None, env: str = FAULT_ENV) -> dict[str, int]:
    """Run id -> step of one kind of fault, from `spec` (default: the environment variable `env`)."""
    spec = os.environ.get(env, "") if spec is None else spec
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        run_id, sep, step = item.partition(":")
        if not sep or not step.strip().isdigit():
            raise ValueError(f"${env}: {item!r}: use RUN_ID:STEP[,RUN_ID:STEP...]")
        out[run_id.strip()] = int(step)
    return out


def fault_config() -> dict:
    """The faults this environment injects, as a driver sends them to its trials (in the param space)."""
    return {"faults": injected_faults(), "holds": injected_faults(env=HOLD_ENV),
            "release": os.environ.get(RELEASE_ENV) or None}


def fault_steps(config: dict, run_id: str) -> dict:
    """`execute`'s fault arguments for one run, from a trial's config (see fault_config)."""
    return {"nan_at_step": config.get("faults", {}).get(run_id), "hold_at_step": config.get("holds", {}).get(run_id),
            "hold_release": config.get("release")}


def before_step(step: int, attempt: int, model: torch.nn.Module, nan_at_step: int | None,
                hold_at_step: int | None, hold_release: str | None = None) -> None:
    """Called before every training step: holds, then poisons, when the step is the one given."""
    hold(step, attempt, hold_at_step, hold_release)
    poison(step, model, nan_at_step)


def hold(step: int, attempt: int, at: int | None, release: str | None = None) -> None:
    """The first attempt waits at step `at` until its process is killed, or until the file `release` exists
    (the heartbeat thread goes on: the test sees a run mid-training, however fast the machine trains)."""
    while step == at and attempt == 1 and not (release and os.path.exists(release)):
        time.sleep(0.2)


def poison(step: int, model: torch.nn.Module, at: int | None) -> None:
    """At step `at`, every weight turns to NaN: that step's loss is NaN, on every machine."""
    if step == at:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
