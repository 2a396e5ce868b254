"""The commands on a study's trained runs and on task data: `study verify`, `predict`, `eval` and
`text8-download`."""
from __future__ import annotations

import math
import os
from typing import Optional

import typer

from study.cli.base import RESULTS, STUDY, Command, app, fail
from study.cli.checks import grid_or_exit, links_out_or_exit, results_or_exit, study_or_exit


@app.command(cls=Command)
def verify(
    study: Optional[str] = STUDY,
    results: str = RESULTS,
    deep: bool = typer.Option(False, "--deep", help="also evaluate eval points again from the stored weights "
                              "(the stored seed, the run's precision) and require the same outputs and scores"),
    fraction: float = typer.Option(1.0, "--fraction", min=0.0, max=1.0, help="with --deep: the share of the stored "
                                   "eval points evaluated again (picked by a hash of their names; at least one)"),
    point: list[str] = typer.Option([], "--point", help="with --deep: RUN_ID/EVAL_KEY (or EVAL_KEY: every run's) "
                                    "to evaluate again instead of --fraction; repeatable"),
):
    """Re-score every stored sample and check the store's invariants; exit 1 on any disagreement."""
    from store import Store
    from study.commands.verify import PointError, verify_study

    if (point or fraction != 1.0) and not deep:
        fail("--fraction and --point choose what --deep evaluates again: add --deep")
    study = study_or_exit(study, results)
    links_out_or_exit(results, study, code=1)
    store = Store(results, study)
    try:
        verdict = verify_study(store, deep=deep, fraction=fraction, points=point)
    except PointError as e:
        fail(str(e))
    typer.echo(verdict.render())
    raise typer.Exit(0 if verdict.ok else 1)


@app.command(cls=Command)
def backfill(
    study: str = typer.Option(..., "--study", help="study name"),
    results: str = RESULTS,
):
    """Score the continuous quantities (ELBO, reference NLL: eval keys nll-test, nll-val) of done runs stored
    without them, from their final weights, under the study's lease; checkpoints are gone, so only the final."""
    from study.commands.backfill import backfill as run_backfill

    links_out_or_exit(results, study)
    run_backfill(results, study, echo=typer.echo)


@app.command(cls=Command)
def predict(
    study: Optional[str] = STUDY,
    results: str = RESULTS,
    hold_out: list[str] = typer.Option([], "--hold-out", help="RUN_ID (its model, every seed), 'largest' (the "
                                       "largest parameter count) or 'widest' (the largest width): left out of the "
                                       "fit and predicted; repeatable; default 'largest' (none with --target or "
                                       "--budget)"),
    target: Optional[str] = typer.Option(None, "--target", help="a grid YAML of models never trained: their "
                                         "predicted metric and training FLOPs (expanded as `study plan`, never run)"),
    budget: Optional[float] = typer.Option(None, "--budget", help="training FLOPs: the best (K, L, width) within "
                                           "them (candidates: --target's models, else the ladder's shapes)"),
    T: list[int] = typer.Option([], "--T", help="denoising steps T to print (default: every T of the ladder); "
                                "repeatable"),
    boot: int = typer.Option(400, "--boot", min=50, max=20000, help="bootstrap replicates"),
    law: str = typer.Option("preregistered", "--law", help="the law's form: 'preregistered' (z = ln N + beta ln L) "
                            "or 'depth-width' (z = ln d + kappa ln K + lambda ln L, a ceiling per T; post-hoc) "
                            "or 'two-step' (test ELBO from N, L, D, then VPR from the ELBO per T; "
                            "analysis/ladder/twostep.py); docs/DESIGN.md"),
    design: Optional[str] = typer.Option(None, "--design", help="a ladder grid YAML not trained yet: with --target, "
                                         "check before training that the targets' predicted loss lies inside the "
                                         "rungs' and checkpoints' range and warn on rungs at a metric floor or "
                                         "ceiling (the two-step law fitted on --study is the prior)"),
    plot: Optional[str] = typer.Option(None, "--plot", help="save the ladder figure here (PNG, PDF or SVG by the "
                                       "name): measured vs the law per T, held-out models and targets marked"),
):
    """Fit a scaling law of the primary metric in parameters, loops and T to a study's finished runs
    (analysis/ladder/), predict held-out models, targets and the best model for a budget."""
    from analysis.ladder import LAWS, LadderError
    from analysis.load import MissingData, load_study
    from study.commands.predict import predict as run_predict

    if law not in (*LAWS, "two-step"):
        fail(f"--law {law}: one of {', '.join((*LAWS, 'two-step'))}")
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        fail(f"--budget {budget}: a number of training FLOPs > 0 is meant")
    if any(t < 1 for t in T):
        fail(f"--T {min(T)}: denoising steps are >= 1")
    if design is not None and target is None:
        fail("--design GRID: give the targets to check it against with --target TARGET_GRID")
    results_or_exit(results)
    study = study_or_exit(study, results)
    grid = grid_or_exit(target, data=False) if target is not None else None
    hold_out = hold_out or ([] if (target or budget) else ["largest"])
    try:
        data = load_study(results, study)
        if design is not None:
            from study.commands.predict_two_step import design_check

            return design_check(data, grid_or_exit(design, data=False), grid, T or None, boot, typer.echo)
        if law == "two-step":
            from study.commands.predict import trained_study
            from study.commands.predict_two_step import predict_two_step

            trained = trained_study(results, grid.study) if grid is not None and grid.study != study else None
            return predict_two_step(data, hold_out, grid, T or None, boot, typer.echo, plot, trained, budget)
        run_predict(data, hold_out, grid, budget, T or None, boot, typer.echo, results, law, plot)
    except (LadderError, MissingData) as e:
        fail(str(e))


@app.command("eval", cls=Command)
def eval_cmd(
    run_id: str,
    puzzles: str = typer.Option(..., "--puzzles", help="the examples to solve, in the run's task's format (Sudoku: "
                                 "one puzzle per line, n*n cells of the run's grid size ('.' or '0' blanks), or "
                                 "CSV quizzes,solutions)"),
    T: Optional[int] = typer.Option(None, "--T", min=1, help="denoising steps (default: the run's largest eval T)"),
    L_s: Optional[int] = typer.Option(None, "--L-s", min=1,
                                      help="loops per step (default: the run's training depth)"),
    out: Optional[str] = typer.Option(None, "--out", help="write the completed grids here, input order and format"),
    study: Optional[str] = typer.Option(None, "--study", help="study holding the run (default: found by run id)"),
    keep: int = typer.Option(1000, "--samples", min=0, help="puzzles kept in the samples table (the file's first)"),
    results: str = RESULTS,
):
    """Solve an external puzzle file with a trained run; write evals and samples rows; report its metrics."""
    from study.commands.puzzles import EvalError, evaluate_puzzles
    from tasks import InputFileError

    from study.spec.bounds import BOUNDS

    for opt, v, cap in (("--T", T, BOUNDS["eval.T"]), ("--L-s", L_s, BOUNDS["eval.L_s"])):
        if v is not None and v > cap:
            fail(f"{opt} {v}: beyond the bound {cap:,} (study/spec/bounds.py BOUNDS, as for a grid's eval section)")
    results_or_exit(results)
    if os.path.isdir(puzzles):
        fail(f"--puzzles {puzzles}: is a directory; give a puzzle file")
    try:
        s = evaluate_puzzles(run_id, puzzles, results=results, study=study, T=T, L_s=L_s, out=out,
                             n_samples_kept=keep)
    except (EvalError, InputFileError) as e:
        fail(str(e))
    typer.echo(f"run {run_id} (study {s['study']}) on {s['n']} puzzles of {puzzles}, T={s['T']} L_s={s['L_s']}:")
    for m, (v, lo, hi) in s["metrics"].items():
        typer.echo(f"  {m:<9} {v:.4f}  [{lo:.4f}, {hi:.4f}]")
    if out:
        typer.echo(f"completed grids: {out}")


@app.command(cls=Command)
def migrate(
    study: str = typer.Option(..., "--study", help="the study to bring to the current store format"),
    results: str = RESULTS,
):
    """Rewrite a study's store to the current format version (lossless, idempotent; holds the lease)."""
    from store import OutsideStore
    from study.commands.migrate import migrate_study

    results_or_exit(results)
    try:
        changes = migrate_study(results, study, echo=typer.echo)
    except OutsideStore as e:
        fail(e.strerror or str(e))
    for line in changes:
        typer.echo(f"migrated {line}")
    typer.echo(f"study {study}: " + (f"{len(changes)} change(s); now" if changes else "already") +
               " of the current store format")


@app.command("text8-download", cls=Command)
def text8_download(
    dest: str = typer.Option("data", "--dest", help="directory for the unpacked `text8` file"),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="also require this SHA-256 of text8.zip"),
):
    """Download text8 (needs the network; tests never call it) and check it; prints the file's path."""
    from tasks.text8 import Text8Error, download_text8

    try:
        path = download_text8(dest, sha256=sha256)
    except (Text8Error, OSError) as e:
        fail(str(e), 1)
    typer.echo(path)
