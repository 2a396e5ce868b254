"""`study report`: figures, tables, the report and the verdicts, from the store (never trains)."""
from __future__ import annotations

import math
from typing import Optional

import typer

from analysis.catalog import figure_names
from study.cli.base import RESULTS, STUDY, Command, app, fail
from study.cli.checks import links_out_or_exit, results_or_exit, study_or_exit, writable_dir_or_exit


@app.command(cls=Command)
def report(
    figure: str = typer.Option("iso-param", "--figure", help=", ".join(figure_names()) + ", or 'all' (every "
                               "figure the data supports, report.html/.md and the verdicts)"),
    study: Optional[str] = STUDY,
    results: str = RESULTS,
    out: Optional[str] = typer.Option(None, "--out", help="output directory (default: the study's figures/)"),
    fmt: str = typer.Option("svg", "--format", help="second format beside PNG: svg or pdf"),
    threshold: Optional[float] = typer.Option(None, "--threshold",
                                              help="pareto threshold (default 0.95 for VPR, 0.70 for RTR)"),
    T: Optional[int] = typer.Option(None, "--T", min=1, help="cross-depth: denoising steps T of the heatmap"),
    pareto_x: str = typer.Option("T", "--pareto-x", help="pareto: T (at L_s = L_t) or forward_passes (T*L_s)"),
    split: str = typer.Option("test", "--split", help="the evaluation split every figure and table reads "
                              "(one per report, never mixed)"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="processes drawing figures at once (default: "
                                       "one per core for a study of 200 runs or more, else 1)"),
    compare: list[str] = typer.Option([], "--compare", help="RUN_A:RUN_B: also compare these two models (any "
                                      "seed's run id names its model) with a paired interval and a verdict; "
                                      "repeatable"),
    redraw: bool = typer.Option(False, "--redraw", help="draw every figure (every report does: kept for scripts "
                                "that pass it)"),
):
    """Render figures and tables from the Parquet store (never trains)."""
    from analysis.options import Options

    names = _report_options_or_exit(figure, fmt, pareto_x, split, threshold)
    results_or_exit(results)
    study = study_or_exit(study, results)
    links_out_or_exit(results, study)
    if len(names) > 1 and jobs != 1:
        from analysis.render import prestart

        prestart()  # the drawing workers' fork server imports while the store is read
    data = _report_data_or_exit(results, study)
    named = _compare_pairs_or_exit(data, compare)
    opts = Options(fmt=fmt, threshold=threshold, T=T, pareto_x=pareto_x, split=split, compare=tuple(named))
    out_dir = out or (f"{data.dir}/figures" if data.store.local else f"figures/{data.name}")
    if out is not None or data.store.local:
        writable_dir_or_exit(out_dir, "--out")  # before drawing anything
    from analysis.derived import Derived
    from analysis.render import auto_jobs, draw_all
    from study.engine.raystart import sigterm_as_ctrl_c

    derived = Derived(data)  # the tables figures, report and verdicts share, each computed once
    sigterm_as_ctrl_c()  # a SIGTERM (`kill`, a scheduler) stops the report as Ctrl-C does
    try:  # files are written into out_dir only once all are (analysis.render.staged)
        drawn, pages = draw_all(data, names, out_dir, opts, jobs if jobs is not None else auto_jobs(data, len(names)),
                                derived, report=figure == "all")
    except KeyboardInterrupt:
        typer.echo(f"interrupted: nothing written to {out_dir} (it is as it was); `study report` again draws it all",
                   err=True)
        raise typer.Exit(130)
    for n, got in drawn.items():
        if isinstance(got, str):
            typer.echo(f"{n}: not drawn: {got}", err=True)
        else:
            for p in got:
                typer.echo(p)
    for p in pages:
        typer.echo(p)
    missing = sum(isinstance(v, str) for v in drawn.values())
    typer.echo(f"{len(drawn)} figure{'s' if len(drawn) != 1 else ''}: {len(drawn) - missing} drawn"
               + (f", {missing} not drawn" if missing else ""))
    if figure == "all" or named:
        _print_comparisons(data, opts, derived)
    _print_claims(data)
    raise typer.Exit(1 if missing == len(names) else 0)


def _report_options_or_exit(figure: str, fmt: str, pareto_x: str, split: str, threshold: float | None) -> list[str]:
    """The figures `study report` draws (every one for 'all'), once every option is known good; else exit 2."""
    from analysis.options import FORMATS

    if figure.replace("_", "-") in figure_names():  # iso_param, the PNG's own name, is iso-param
        names = [figure.replace("_", "-")]
    else:
        from analysis.figures import FIGURES  # in the report's order

        if figure != "all":
            fail(f"unknown figure {figure!r}; known: {', '.join(FIGURES)}, all")
        names = list(FIGURES)
    from tasks.base import SPLITS

    for option, value, allowed in (("--format", fmt, FORMATS), ("--pareto-x", pareto_x, ("T", "forward_passes")),
                                   ("--split", split, SPLITS)):
        if value not in allowed:
            fail(f"unknown {option} {value!r}; allowed: {', '.join(allowed)}")
    if threshold is not None and not (math.isfinite(threshold) and 0 < threshold <= 1):
        fail(f"--threshold {threshold}: a success rate in (0, 1] is meant (VPR or RTR)")
    return names


def _report_data_or_exit(results: str, study: str):
    """The study's tables for the figures (the unreadable files it skipped named on stderr), or exit."""
    from analysis.load import MissingData, load_study
    from tasks import UnknownTask

    try:
        data = load_study(results, study)
    except (MissingData, UnknownTask) as e:  # no runs yet (what `study run` would write is missing), a plugin's task
        fail(str(e))
    except ValueError as e:  # the store itself is damaged
        fail(str(e), 1)
    for path, why in sorted(data.store.unreadable.items()):
        typer.echo(f"unreadable, skipped: {path} ({why}); `study run` redoes what it held", err=True)
    if data.not_done is not None and not data.not_done.empty:
        from analysis.load import not_done_summary

        typer.echo(f"left out, not finished: {not_done_summary(data.not_done)} (only done runs are analysed)", err=True)
    return data


def _compare_pairs_or_exit(data, compare: list[str]) -> list[tuple[str, str]]:
    """The --compare RUN_A:RUN_B pairs, each checked against the study before anything is drawn; else exit 2."""
    from analysis.load import MissingData

    named = []
    for c in compare:
        a, sep, b = c.partition(":")
        if not sep or not a or not b:
            fail(f"--compare {c!r}: expected RUN_A:RUN_B (two run ids)")
        named.append((a, b))
    if named:
        from analysis.compare import study_pairs

        try:
            study_pairs(data, named)  # unknown runs or runs of two tasks: refused before drawing
        except MissingData as e:
            fail(str(e))
    return named


def _print_claims(data) -> None:
    """The claims table (analysis/claims.py), when the study's grid declared claims."""
    from analysis.claims import claims_table, lines, method_lines, read_spec

    if read_spec(data.store) is None:
        return
    table = claims_table(data)
    for line in method_lines(table) + ["  " + x for x in lines(table)]:
        typer.echo(line)


def _print_comparisons(data, opts, derived) -> None:
    """The paired comparisons with their verdicts, one line each (the report's table, for the terminal)."""
    from analysis.load import MissingData
    from analysis.summary import comparison_lines, fit
    from stats import VERDICT_RULE

    try:
        c = derived.comparisons(list(opts.compare), opts.split)  # the report's table: computed once for both
    except MissingData as e:
        fail(str(e))
    if c.empty:
        return
    typer.echo("\n".join(fit(f"paired comparisons ({opts.split} split; verdict: {VERDICT_RULE}):", 2)))
    for line in comparison_lines(c):
        typer.echo(line)
