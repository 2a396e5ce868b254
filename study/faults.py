"""Fault injection for tests, through the product path: the driver reads the faults from its environment
and sends them to its trials in the param space; a trial hands its run's to `study.trial.execute`."""
from __future__ import annotations

import os

# "RUN_ID:STEP[,RUN_ID:STEP...]"
FAULT_ENV = "RMDM_FAULT_NAN_AT"  # the run's weights turn to NaN before that training step (every attempt)
HOLD_ENV = "RMDM_FAULT_HOLD_AT"  # the run's first attempt stops before that step and waits to be killed


def fault_config() -> dict:
    """The faults this environment injects, as a driver sends them to its trials (in the param space)."""
    return {"faults": injected_faults(), "holds": injected_faults(env=HOLD_ENV)}


def fault_steps(config: dict, run_id: str) -> dict:
    """`execute`'s fault arguments for one run, from a trial's config (see fault_config)."""
    return {"nan_at_step": config.get("faults", {}).get(run_id), "hold_at_step": config.get("holds", {}).get(run_id)}


def injected_faults(spec: str | None = None, env: str = FAULT_ENV) -> dict[str, int]:
    """Runs and steps of a fault: a deterministic diverging run on any CPU (where a huge lr overflows
    at a step that depends on the instruction set), or a trial guaranteed to be mid-training when a
    test kills it (however fast the machine trains)."""
    spec = os.environ.get(env, "") if spec is None else spec
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        run_id, sep, step = item.partition(":")
        if not sep or not step.strip().isdigit():
            raise ValueError(f"${env}: {item!r}: use RUN_ID:STEP[,RUN_ID:STEP...]")
        out[run_id.strip()] = int(step)
    return out
