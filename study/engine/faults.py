"""Fault injection for tests: the one place the product reads it, off unless an environment variable says.

Each variable holds "RUN_ID:STEP[,RUN_ID:STEP...]". The driver (`study run`, `study tune`) reads them
(`fault_config`: a field of the TrialOptions every trial is given, as the trials may run on other nodes,
where the driver's environment is not); a trial takes its run's hooks (`run_faults`, one `Faults` object,
through `TrialOptions.faults_of` in `study.engine.trial.execute`) and its training calls
`Faults.before_step` before every step.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

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
    """The faults this environment injects, as a driver sends them to its trials (TrialOptions.faults):
    {"nan": {run_id: step}, "holds": {run_id: step}, "release": path or None}."""
    return {"nan": injected_faults(), "holds": injected_faults(env=HOLD_ENV),
            "release": os.environ.get(RELEASE_ENV) or None}


@dataclass(frozen=True)
class Faults:
    """The fault hooks of one run's trial (none by default): its weights turn to NaN before step
    `nan_at_step`; its first attempt waits before step `hold_at_step` until killed, or until the file
    `hold_release` exists."""

    nan_at_step: int | None = None
    hold_at_step: int | None = None
    hold_release: str | None = None

    def before_step(self, step: int, attempt: int, model: torch.nn.Module) -> None:
        """Called before every training step: holds, then poisons, when the step is the one given."""
        hold(step, attempt, self.hold_at_step, self.hold_release)
        poison(step, model, self.nan_at_step)


NO_FAULTS = Faults()


def run_faults(faults: dict, run_id: str) -> Faults:
    """One run's hooks, from what its driver sent (see fault_config; {}: none)."""
    f = faults or {}
    return Faults(nan_at_step=f.get("nan", {}).get(run_id), hold_at_step=f.get("holds", {}).get(run_id),
                  hold_release=f.get("release"))


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
