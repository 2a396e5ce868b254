"""The options of one `study run` or `study tune`, each object built once and passed down whole.

`RunOptions` is what the command line says (built once in study/cli/run.py, given to `run_grid`,
`run_claims` and `tune_grid`); `TrialOptions` is what every trial of that invocation is told by its
driver (one key of the trial's config, OPTIONS_KEY, as the trials may run on other nodes), read back
by the trainable and given to `study.engine.trial.execute`. A new flag is one field here, one option
in the command line, and its one use.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

OPTIONS_KEY = "options"  # the one key of a trial's config that holds its TrialOptions


@dataclass(frozen=True)
class RunOptions:
    """The flags of `study run` and `study tune` (the defaults are the command line's)."""

    address: str | None = None  # --address: join a Ray cluster (None: start a local Ray)
    num_cpus: int | None = None  # --num-cpus: CPUs of the embedded local Ray
    retry_failed: bool = False  # --retry-failed: run again the runs recorded as failed (`study run`)
    wait: bool = False  # --wait: wait for another driver's lease instead of refusing
    progress_every_s: float = 30.0  # --progress-every: seconds between progress lines off a terminal
    log: tuple = ()  # --log: the sinks (study.engine.loggers.parse)
    echo: Callable[[str], None] = field(default=print, compare=False)  # where the driver's lines go

    def trial(self, **driver) -> "TrialOptions":
        """What this invocation's trials are told: `driver`'s (code version, store root, grid hash, lease) and
        each of these flags that TrialOptions names too (a flag for the trials: one field in each class)."""
        mine = {f.name for f in dataclasses.fields(self)} & {f.name for f in dataclasses.fields(TrialOptions)}
        return TrialOptions(**driver, **{k: getattr(self, k) for k in mine})


@dataclass(frozen=True)
class TrialOptions:
    """What a driver tells each of its trials: where the store is, the code version and grid hash its rows
    carry, and the lease that fences it (store/lease.py: Lease.fence; None: unfenced)."""

    code_version: str
    results: str | None = None  # the store's root as every node reaches it (an absolute path or a URI)
    grid: str | None = None  # content hash of the grid that dispatched the run (store/provenance.py)
    lease: dict | None = None

    def config(self) -> dict:
        """The trial config's share of these options: one key."""
        return {OPTIONS_KEY: dataclasses.asdict(self)}

    @classmethod
    def of_config(cls, config: dict) -> "TrialOptions":
        """The options a trial's config carries (see `config`)."""
        return cls(**config[OPTIONS_KEY])
