"""`study run` on a grid with a `claims:` section: seeds on demand (docs/DESIGN.md, "Claims").

Round after round: run (or resume) every model at the seeds it is owed with the runner's own entry point
(study.engine.runner.run_grid: ordinary runs, ids as ever, resumable), decide every claim from the store
(analysis/claims.py), and owe the two models of each undecided claim the seeds of its next look
(seeds.batch more), until every claim is decided or has spent seeds.max. Nothing is kept but the runs and
the claims.json spec: a rerun starts from the first round, finds those runs done, and reaches the same
decisions (a decision is a function of the stored evaluations alone); with a larger max it goes on. One
lease and one Ray serve every round; each round says which claims are still open.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json

from analysis.claims import CLAIMS_FILE, design_of, evaluate, lines, method_lines
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
    Holds the study's lease and one Ray (started by the runner at the first round with runs to do, held in
    `hold`) for all its rounds.
    Returns the exit code: run_grid's when a round fails or is interrupted, else 0 (undecided claims are an
    answer too)."""
    from study.engine import runner

    echo, store = options.echo, Store(results, grid.study)
    with runner.leased(store, "run", options) as lease, contextlib.ExitStack() as hold:
        claims = grid.claims
        spec = claims.spec()
        write_spec(store, spec)
        owed, table = {m: claims.seeds.min for m in claims.models}, None
        for rnd in range(1, claims.seeds.max + 2):
            runs = {r.run_id: r for r in grid.runs}  # every model of the grid at seeds.min
            for m, n in owed.items():
                runs.update({r.run_id: r for r in claims.seeds_of(m, n)})
            names = [c["name"] for c in spec["claims"]] if table is None else list(table.claim[~table.final])
            echo(f"claims round {rnd}: {len(names)} of {len(spec['claims'])} claims open ({'; '.join(names)}); "
                 + ", ".join(f"{claims.models[m].model.K} x {claims.models[m].model.L}: {n} seeds"
                             for m, n in owed.items()))
            one = dataclasses.replace(grid, runs=list(runs.values()))
            code = runner.run_leased(one, store, results, options, lease, hold)  # one Ray for every round
            if code != 0:
                echo("claims: the round did not finish; `study run` again resumes it and goes on")
                return code
            table = evaluate(spec, load_study(results, grid.study).evals)
            new = next_seeds(table, spec, owed)
            if new == owed:
                break
            owed = new
    if rnd == 1 and table.why.str.startswith("constant").all():
        echo("claims: every model scored the same on every seed at each claim's point (did they learn?): "
             "nothing to decide, stopped at the first look")
    fixed = len(owed) * claims.seeds.max
    echo(f"claims: {sum(owed.values())} runs, {sum(owed.values()) / fixed:.0%} of a fixed {claims.seeds.max}-seed "
         f"design of the same models ({fixed} runs)")
    for line in method_lines(table):
        echo(line)
    for line in lines(table):
        echo("  " + line)
    return 0
