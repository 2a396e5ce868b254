"""The commands that run a grid or watch it: `study run`, `status`, `prune` and `tune`."""
from __future__ import annotations

import json
import math
from typing import Optional

import typer

from study.cli.base import RESULTS, Command, app, fail
from study.cli.checks import (LOG_HELP, OVERRIDES, grid_or_exit, links_out_or_exit, log_or_exit, override_note,
                              refuse_if_leased, results_or_exit, store_found_or_exit, store_of_run_or_exit)

# the options `run` and `tune` share
ADDRESS = typer.Option(None, "--address", help="join a Ray cluster: auto, HOST:PORT, ray://HOST:PORT")
NUM_CPUS = typer.Option(None, "--num-cpus", min=1, help="CPUs of the embedded local Ray")
WAIT = typer.Option(False, "--wait", help="if another driver is running this study, wait until it ends (default: "
                    "refuse, naming it)")
LOG = typer.Option([], "--log", help=LOG_HELP)


@app.command(cls=Command)
def run(
    ctx: typer.Context,
    grid: str,
    overrides: Optional[list[str]] = OVERRIDES,
    results: str = RESULTS,
    address: Optional[str] = ADDRESS,
    retry_failed: bool = typer.Option(False, "--retry-failed", help="run again the runs recorded as failed"),
    num_cpus: Optional[int] = NUM_CPUS,
    progress_every: float = typer.Option(30.0, "--progress-every",
                                         help="seconds between progress lines when not on a terminal"),
    wait: bool = WAIT,
    log: list[str] = LOG,
):
    """Run GRID (or resume it): every run not yet complete in the store, one Ray Tune trial each.
    One driver per study: a second one is refused (exit 2) unless --wait."""
    refuse_if_leased(grid, results, wait, overrides)  # first: a second driver is refused before torch is imported
    from study.engine.options import RunOptions
    from study.engine.raystart import check_address
    from study.engine.runner import run_grid

    if not (math.isfinite(progress_every) and progress_every > 0):
        fail(f"--progress-every {progress_every}: must be a number of seconds > 0")
    sinks = log_or_exit(log, results)  # --log: known, its package installed, an MLflow server reachable
    g = grid_or_exit(grid, overrides=overrides)
    if g.search is not None:
        fail(f"{grid} has a `search:` section: run it with `study tune`")
    store_of_run_or_exit(results, g.study, grid, ctx.get_parameter_source("results").name != "DEFAULT")
    results_or_exit(results, create=True)
    override_note(results, g)
    try:
        check_address(address)
    except ValueError as e:
        fail(str(e))
    try:
        go = run_grid
        if g.claims is not None:  # seeds on demand until each claim is decided (study/engine/claims.py)
            from study.engine.claims import run_claims as go
        code = go(g, results, RunOptions(address=address, num_cpus=num_cpus, retry_failed=retry_failed, wait=wait,
                                         progress_every_s=progress_every, log=tuple(sinks), echo=typer.echo))
    except KeyboardInterrupt:  # before the sweep (Ray's start: what it started is ended) or a second Ctrl-C
        interrupted("run")
    raise typer.Exit(code)


def interrupted(command: str):
    """A Ctrl-C outside a sweep's own handling: one line, exit 130 (what was started is ended on the way)."""
    typer.echo(f"interrupted: `study {command}` again resumes (finished runs are kept)", err=True)
    raise typer.Exit(130)


@app.command(cls=Command)
def status(
    grid: str,
    overrides: Optional[list[str]] = OVERRIDES,
    results: str = RESULTS,
    json_out: bool = typer.Option(False, "--json", help="one JSON object per run"),
):
    """Done / running / pending / failed runs of GRID with an ETA, from the store (also during a run)."""
    from dataclasses import asdict

    from study.commands.status import render, snapshot
    from store import Store

    g = grid_or_exit(grid, data=False, overrides=overrides)
    results_or_exit(results)
    store_found_or_exit(results, g.study, grid)
    links_out_or_exit(results, g.study)
    store = Store(results, g.study)
    override_note(results, g, store)
    statuses = snapshot(g, store)
    if json_out:
        for st in statuses:
            typer.echo(json.dumps(asdict(st)))
        for path, why in sorted(store.unreadable.items()):  # the text view lists them itself
            typer.echo(f"unreadable, skipped: {path} ({why})", err=True)
    else:
        typer.echo(render(g, store, statuses))
        from store.lease import status_line

        typer.echo(status_line(store))  # which driver holds the study, and whether it still beats


@app.command(cls=Command)
def prune(
    grid: str,
    overrides: Optional[list[str]] = OVERRIDES,
    results: str = RESULTS,
    apply: bool = typer.Option(False, "--apply", help="move the runs listed to <study>/pruned/<time>/ (never "
                               "deleted; default: only list them)"),
):
    """List the runs of GRID's study that no grid of the study asks for any more (failed or unfinished runs
    that GRID does not ask for, done runs that no grid of the study asks for); with --apply, move their
    files aside. Done runs that a grid of the study asks for are never touched."""
    from store import OutsideStore
    from study.commands.prune import prune as run_prune

    g = grid_or_exit(grid, data=False, overrides=overrides)
    results_or_exit(results)
    try:
        code = run_prune(g, results, apply, echo=typer.echo)
    except OutsideStore as e:
        fail(e.strerror or str(e))
    raise typer.Exit(code)


@app.command(cls=Command)
def tune(
    grid: str,
    overrides: Optional[list[str]] = OVERRIDES,
    results: str = RESULTS,
    address: Optional[str] = ADDRESS,
    num_cpus: Optional[int] = NUM_CPUS,
    wait: bool = WAIT,
    log: list[str] = LOG,
):
    """Optuna search of GRID's `search:` section through Ray Tune (resumable); writes best.yaml for sweeps."""
    refuse_if_leased(grid, results, wait, overrides)
    from study.engine.options import RunOptions
    from study.engine.tune import TuneError, tune_grid

    sinks = log_or_exit(log, results)
    g = grid_or_exit(grid, overrides=overrides)
    results_or_exit(results, create=True)
    links_out_or_exit(results, g.study)  # as `study run`: nothing read or written through a link out of the store
    try:
        code = tune_grid(g, results, RunOptions(address=address, num_cpus=num_cpus, wait=wait, log=tuple(sinks),
                                                echo=typer.echo))
    except TuneError as e:
        fail(str(e))
    except KeyboardInterrupt:
        interrupted("tune")
    raise typer.Exit(code)
