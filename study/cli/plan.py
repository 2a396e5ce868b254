"""`study plan`: every run of a grid and what the grid will cost, running nothing."""
from __future__ import annotations

import json
import os
from typing import Optional

import typer

from study.cli.base import Command, app, fail
from study.cli.checks import OVERRIDES, grid_or_exit

WIDTH = 100  # a terminal's columns: every line of the plan fits them (as analysis.summary.WIDTH)


@app.command(cls=Command)
def plan(
    grid: str,
    overrides: Optional[list[str]] = OVERRIDES,
    json_out: bool = typer.Option(False, "--json", help="one JSON object per run, then one with \"totals\": true"),
    resolved: bool = typer.Option(False, "--resolved", help="print each run's fully resolved configuration (every "
                                  "default filled in, overrides applied: what the run stores as its config) as one "
                                  "YAML document per run, or with --json one JSON object per run"),
    measure: bool = typer.Option(False, "--measure", help="time a few training steps of each distinct shape here "
                                 "(cached per machine and shape) for time and peak memory"),
    remeasure: bool = typer.Option(False, "--remeasure", help="--measure, ignoring the cache"),
    flops_per_s: Optional[float] = typer.Option(None, "--flops-per-s", help="the target hardware's rate, FLOP/s"),
    mfu: Optional[float] = typer.Option(None, "--mfu", help="fraction of --device/--peak-flops a run reaches"),
    device: Optional[str] = typer.Option(None, "--device", help="a device's bf16 dense peak for --mfu: h100, a100, "
                                         "l4, ... (see model/costs.py BF16_PEAK_TFLOPS)"),
    peak_flops: Optional[float] = typer.Option(None, "--peak-flops", help="a device's peak FLOP/s for --mfu"),
    results: str = typer.Option("results", "--results", help="a claims grid: the store whose seeds are its pilot"),
):
    """List every run of GRID (id, K, L_t, parameters, FLOPs, eval points) and what the grid will cost
    (training and evaluation FLOPs, time at a given or measured rate, a training step's peak memory);
    run nothing. Eval FLOPs are an upper bound (T x L_s passes; the sampler may stop sooner)."""
    from study.spec import cost

    g = grid_or_exit(grid, overrides=overrides)
    if resolved:
        return _echo_resolved(g, json_out)
    try:
        rate = cost.given_rate(flops_per_s, mfu, device, peak_flops)
    except ValueError as e:
        fail(str(e))
    for line in cost.t_warnings(g.runs, grid):
        typer.echo(line, err=True)
    measured = cost.measure(g.runs, echo=lambda m: typer.echo(m, err=True), refresh=remeasure) \
        if (measure or remeasure) else {}
    rows = [_plan_row(g, r, measured.get(r.run_id), rate) for r in g.runs]
    how = rate[1] if rate else ("measured here (--measure)" if measured else None)
    totals = _plan_totals(g, rows, how)
    if json_out:
        for row in rows:
            typer.echo(json.dumps(row))
        typer.echo(json.dumps(totals))
        return
    _echo_plan(g, grid, rows, totals)
    if g.claims is not None:
        _echo_claims_plan(g, results)


def _echo_claims_plan(g, results: str) -> None:
    """Per claim: the pilot's difference and spread, the expected seeds and the chance of a decision."""
    from analysis.claims import plan_lines

    evals = None
    if os.path.isdir(os.path.join(results, g.study)) or "://" in results:
        from analysis.load import MissingData, load_study

        try:
            evals = load_study(results, g.study).evals
        except (MissingData, OSError, ValueError):
            evals = None
    from analysis.summary import fit

    for line in plan_lines(g.claims.spec(), evals):
        typer.echo("\n".join(fit(line)))  # 100 columns


def _echo_resolved(g, json_out: bool) -> None:
    """`study plan --resolved`: each run's resolved configuration (Run.resolved, as stored in configs/), YAML or JSON."""
    import yaml

    for i, r in enumerate(g.runs):
        conf = json.loads(json.dumps(r.resolved(), default=str))
        if json_out:
            typer.echo(json.dumps(conf, sort_keys=True))
        else:
            typer.echo(("---\n" if i else "") + f"# run {r.run_id} of study {g.study}\n"
                       + yaml.safe_dump(conf, sort_keys=False), nl=False)


def _plan_row(g, r, m: dict | None, rate: tuple | None) -> dict:
    """`study plan`'s row of run `r`: its shape, costs and eval points, timed at `rate` (given) or by `m`
    (measured here; None: not measured)."""
    from study.spec import cost

    row = {"run_id": r.run_id, "study": g.study, "group": r.group, "task": r.task.name, "K": r.model.K,
           "L_t": r.model.L, "d_model": r.model.d_model, "schedule": r.train.schedule,
           "loss": r.train.loss, "seed": r.train.seed, **r.costs(),
           "eval_points": [{"T": p.T, "L_s": p.L_s, "sampler": p.label} for p in r.eval_points()],
           "tuned": g.tuned.get(r.run_id, {}), **cost.run_costs(r)}
    if m is not None:
        row.update(memory_bytes=m["memory"], memory_how=m["memory_how"])
    if rate is not None:
        return cost.with_time(row, rate[0], rate[0])
    return cost.with_time(row, m and m["train"], m and m["eval"])


def _plan_totals(g, rows: list[dict], how: str | None) -> dict:
    """The grid's totals: FLOPs, time (None unless every run is timed) and the largest training step."""
    secs = [row["seconds"] for row in rows]
    biggest = max(rows, key=lambda row: row["memory_bytes"], default=None)
    return {"totals": True, "study": g.study, "runs": len(rows),
            "train_flops": sum(row["train_flops"] for row in rows),
            "eval_flops": sum(row["eval_flops"] for row in rows),
            "seconds": sum(secs) if rows and None not in secs else None, "rate": how,
            "memory_bytes_max": biggest["memory_bytes"] if biggest else None,
            "memory_how": biggest["memory_how"] if biggest else None,
            "memory_run_id": biggest["run_id"] if biggest else None}


def _echo_plan(g, grid: str, rows: list[dict], totals: dict) -> None:
    """`study plan`'s table: the search groups (a search grid), a line per run, then the totals; every line
    fits 100 columns (analysis.summary.fit: each column as wide as its widest cell, what is past 100 wrapped)."""
    import textwrap

    from store.paths import human_bytes
    from study.spec import cost

    def echo(text: str, indent: int = 6) -> None:  # as analysis.summary.fit wraps (not imported here: it brings
        # the analysis tables in, a quarter of a second of `study plan`)
        for line in text.split("\n"):
            lead = " " * (len(line) - len(line.lstrip(" ")) + indent)
            typer.echo("\n".join(textwrap.wrap(line, WIDTH, subsequent_indent=lead, break_on_hyphens=False) or [line]))

    if g.search is not None:  # a search grid: its runs are the base configurations of the search groups
        from study.engine.tune import describe_search

        for line in describe_search(g):
            echo(line)
    echo(f"study {g.study}: {len(rows)} runs from {grid}")
    heads = ("run_id", "task", "K", "L_t", "d", "params", "FLOPs/fwd", "train FLOPs", "eval FLOPs", "step mem", "time")
    cells = [(row["run_id"], row["task"], f"{row['K']}", f"{row['L_t']}", f"{row['d_model']}", f"{row['n_params']:,}",
              f"{row['flops_per_forward']:.3g}", f"{row['train_flops']:.3g}", f"{row['eval_flops']:.3g}",
              human_bytes(row["memory_bytes"]), cost.human_seconds(row["seconds"])) for row in rows]
    widths = [max(len(c) for c in col) for col in zip(heads, *cells)]

    def line(cols) -> str:  # run_id and task to the left, the numbers to the right
        return " ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))

    points = [f"T={sorted({p['T'] for p in row['eval_points']})} L_s={sorted({p['L_s'] for p in row['eval_points']})}"
              for row in rows]
    # the eval points beside each run when every one fits there, else on a line of their own below it
    sep = "  " if len(line(heads)) + 2 + max(map(len, points), default=0) <= WIDTH else "\n" + " " * (widths[0] + 1)
    echo(line(heads) + sep + "eval points", widths[0] + 1)
    for row, cols, pts in zip(rows, cells, points):
        echo(line(cols) + sep + pts, widths[0] + 1)
        for k, src in row["tuned"].items():  # values taken from a search's best.yaml (`defaults_from`)
            # two spaces in, not under the run's columns: a float's repr and a path fit 100 columns unwrapped
            echo(f"  {k} = {src['value']!r} from search group {src['group']} of {src['file']}")
    echo(f"total: {totals['train_flops']:.3g} training FLOPs, {totals['eval_flops']:.3g} evaluation FLOPs "
         f"(at most: T x L_s forward passes per example)")
    if totals["seconds"] is not None:
        echo(f"time: {cost.human_seconds(totals['seconds'])} on one device, runs one after another, "
             f"at {totals['rate']}")
    else:
        echo("time: give --flops-per-s, --mfu with --device/--peak-flops, or --measure for an estimate")
    if totals["memory_run_id"] is not None:
        echo(f"peak memory of a training step: {human_bytes(totals['memory_bytes_max'])} "
             f"({totals['memory_how']}; run {totals['memory_run_id']})")
