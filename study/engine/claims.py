"""`study run` on a grid with a `claims:` section: seeds on demand (docs/DESIGN.md, "Claims").

Round after round: run (or resume) every model at the seeds it is owed with the runner's own entry point
(study.engine.runner.run_grid: ordinary runs, ids as ever, resumable), decide every claim from the store
(analysis/claims.py), and owe the two models of each undecided claim the seeds of its next look
(seeds.batch more), until every claim is decided or has spent seeds.max. Nothing is kept but the runs and
the claims.json spec: a rerun starts from the first round, finds those runs done, and reaches the same
decisions (a decision is a function of the stored evaluations alone); with a larger max it goes on.
"""
from __future__ import annotations

import dataclasses
import json

import tasks
from analysis.claims import CLAIMS_FILE, design_of, evaluate, lines
from analysis.load import load_study
from store import Store
from study.engine.options import RunOptions
from study.spec.grid import Grid


def write_spec(store: Store, spec: dict) -> None:
    store.write_text(store.path(CLAIMS_FILE), json.dumps(spec, indent=1, sort_keys=True) + "\n")


def next_seeds(table, spec: dict, owed: dict[str, int]) -> dict[str, int]:
    """The seeds each model is owed after this round: the next look of every undecided claim's two models."""
    looks = design_of(spec).looks
    new = dict(owed)
    for r in table.itertuples(index=False):
        if r.final:
            continue
        reached = max([n for n in looks if n <= r.seeds], default=0)
        nxt = next((n for n in looks if n > reached), looks[-1])
        for m in (r.A, r.B):
            new[m] = max(new.get(m, 0), nxt)
    return new


def run_claims(grid: Grid, results: str, options: RunOptions = RunOptions()) -> int:
    """Run a claims grid to its decisions (`options`: study.engine.runner.run_grid's, given to every round).
    Returns the exit code: run_grid's when a round fails or is interrupted, else 0 (undecided claims are an
    answer too)."""
    from study.engine.runner import run_grid

    echo = options.echo
    claims = grid.claims
    spec = claims.spec()
    write_spec(Store(results, grid.study), spec)
    owed = {m: claims.seeds.min for m in claims.models}
    for rnd in range(1, claims.seeds.max + 2):
        runs = {r.run_id: r for r in grid.runs}  # every model of the grid at seeds.min
        for m, n in owed.items():
            runs.update({r.run_id: r for r in claims.seeds_of(m, n)})
        echo(f"claims round {rnd}: " + ", ".join(f"{claims.models[m].model.K} x {claims.models[m].model.L}: "
                                                 f"{n} seeds" for m, n in owed.items()))
        code = run_grid(dataclasses.replace(grid, runs=list(runs.values())), results, options)
        if code != 0:
            echo("claims: the round did not finish; `study run` again resumes it and goes on")
            return code
        table = evaluate(spec, load_study(results, grid.study).evals)
        new = next_seeds(table, spec, owed)
        if new == owed:
            break
        owed = new
    rates = {c["metric"] for c in spec["claims"] if tasks.is_rate(c["metric"])}
    echo("claims (" + table["method"].iloc[0] + "):")
    for line in lines(table, rates):
        echo("  " + line)
    return 0
