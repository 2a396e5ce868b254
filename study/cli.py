"""`study`: plan, run, inspect and report R-MDM scaling studies."""
from __future__ import annotations

import errno
import json
import math
import os
import sys
from typing import Optional

import re

import typer
from typer.core import TyperCommand, TyperGroup

from analysis.catalog import figure_names


class _Commands(TyperGroup):
    """Every command: an exception nobody turned into a message becomes one line, never a traceback
    (`study --debug COMMAND ...` or RMDM_DEBUG=1 shows the traceback). Files and values a user gives
    (OSError, ValueError) exit 2 like every other user mistake; anything else is a bug: exit 1."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """A usage mistake (no command, an unknown command or option, a missing argument, a value out of its
        range) is one line `error: ...` and exit 2, like every other mistake, not click's boxed usage text."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        if os.environ.get(complete_var or "_STUDY_COMPLETE"):  # the shell asking for completions: click answers
            return super().main(args, prog_name, complete_var, standalone_mode=True, **extra)
        from typer._click import exceptions as cx  # the click that typer carries (its own copy)

        if not (sys.argv[1:] if args is None else list(args)):
            typer.echo(f"error: give a command: {', '.join(self.commands)}; `study --help` says what each does",
                       err=True)
            sys.exit(2)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except cx.ClickException as e:
            path = e.ctx.command_path.split(" ")[1:] if getattr(e, "ctx", None) is not None else []
            where = " ".join(["study", *path])
            what = _one_line(e.format_message()).rstrip(".")
            typer.echo(f"error: {where}: {what}; see `{where} --help`", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            _pipe_closed()
        except Exception as e:
            if ctx.params.get("debug") or os.environ.get("RMDM_DEBUG"):
                raise
            user = isinstance(e, (OSError, ValueError))
            what = _one_line(e) if user else f"internal error ({type(e).__name__}: {_one_line(e)})"
            if getattr(e, "errno", None) == errno.ENOSPC and "no space left on the disk" not in what:
                from store import free_space  # name the disk: which path, how much is free

                where = e.filename or _results_arg()
                what = (f"no space left on the disk writing {where}" if "://" in str(where) else
                        f"no space left on the disk writing {os.path.abspath(where)}: {free_space(os.path.abspath(where))}"
                        ) + "; free some space, then run again (finished runs are kept)"
            typer.echo(f"error: {what}; rerun as `study --debug ...` for the traceback", err=True)
            raise typer.Exit(2 if user else 1) from None

    def format_commands(self, ctx, formatter):
        """Each command's first sentence, wrapped at the help's width, never cut with '...'."""
        rows = [(name, self.get_command(ctx, name).get_short_help_str(limit=10_000)) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


_TYPE_TAG = re.compile(r" <[^<>]*>(\.\.\.)?")


class _Command(TyperCommand):
    """Plain-text help (click's, no rich box): a value option shows a metavar named for it (`--results RESULTS`)
    and an argument its name (`GRID`), never typer's type tags (`<str>`, `<bool>`); text wraps at the terminal's
    width (at most 80 columns) and is never cut."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for p in self.params:
            if p.metavar is None and not getattr(p, "is_flag", False):  # --L-s: L_S, grid: GRID
                p.metavar = (p.opts[0].lstrip("-") if p.param_type_name == "option" else p.name).upper().replace("-", "_")

    def format_options(self, ctx, formatter):
        rows = {"argument": [], "option": []}
        for p in self.get_params(ctx):
            rec = p.get_help_record(ctx)
            if rec is not None:
                rows[p.param_type_name].append((_TYPE_TAG.sub("", rec[0]), rec[1]))
        for title, kind in (("Arguments", "argument"), ("Options", "option")):
            if rows[kind]:
                with formatter.section(title):
                    formatter.write_dl(rows[kind])


def _pipe_closed():
    """The reader of stdout went away (`study status GRID | head -1`): not a mistake of the user's, so nothing
    is printed; what is still buffered goes to /dev/null (no second error at exit) and the exit status is the
    one a shell tool ended by SIGPIPE has, 141."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise typer.Exit(141)


def _results_arg() -> str:
    """The command line's --results (its default when not given): where a failed write most likely went."""
    args = sys.argv[1:]
    for i, a in enumerate(args):
        if a == "--results" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--results="):
            return a.split("=", 1)[1]
    return "results"


def _one_line(e: BaseException, limit: int = 500) -> str:
    if isinstance(e, OSError) and e.strerror:
        text = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    else:
        text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


app = typer.Typer(cls=_Commands, help=__doc__, rich_markup_mode=None)
RESULTS = typer.Option("results", "--results", help="results store: a path or a pyarrow-supported URI")


def _version(value: bool) -> None:
    if value:
        from importlib import metadata

        try:
            v = metadata.version("rmdm-study")
        except metadata.PackageNotFoundError:  # run from a checkout that was never installed
            v = "not installed"
        typer.echo(f"rmdm-study {v}")
        raise typer.Exit(0)


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="show the traceback of an error"),
             version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                          help="print the installed version and exit")):
    """`study`: plan, run, inspect and report R-MDM scaling studies."""


def _fail(msg: str, code: int = 2):
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _grid_or_exit(path: str, data: bool = True, overrides: Optional[list[str]] = None):
    """The expanded grid, after command-line `overrides` (study/spec/overrides.py); with `data` (plan, run, tune),
    also the check that each task can make the examples the grid asks of it (study.spec.grid.check_data).
    Exit 2 with one line otherwise."""
    from study.spec.grid import GridError, check_data

    try:
        g = load_grid(path, overrides or ())
        if data:
            check_data(g)
        return g
    except GridError as e:
        from study.spec.overrides import attribute

        _fail(attribute(str(e), path, overrides or ()))


def load_grid(path: str, overrides=()):
    """study.spec.grid.load_grid, imported on first use, not at the top: `study run` on a study another driver
    holds is refused before study.spec.grid brings torch in (seconds on a loaded machine; _refuse_if_leased)."""
    from study.spec.grid import load_grid as load

    return load(path, overrides)


# Hydra-style `key=value` after the grid (study/spec/overrides.py), on plan, run, status and tune
OVERRIDES = typer.Argument(None, metavar="KEY=VALUE | +KEY=VALUE | ~KEY", show_default=False,
                           help="overrides of the grid, applied before validation: train.steps=10, axes.L=[1,2], "
                                "task.mask_rate=0.3 (values are YAML); +KEY=VALUE adds a key the file lacks, "
                                "~KEY deletes one; recorded in the study's grid.yaml")


def _override_note(results: str, g, store=None) -> None:
    """A line on stderr when the study last ran with other overrides than now (study/spec/overrides.py)."""
    from store import Store
    from study.spec.overrides import change_note

    note = change_note(store or Store(results, g.study), g)
    if note:
        typer.echo(note, err=True)


def _refuse_if_leased(grid_path: str, results: str, wait: bool, overrides=()) -> None:
    """Exit 2 at once, naming it, when a live driver holds the lease of GRID's study: read from the grid's
    `study:` key alone, before the grid is validated (which loads torch). Anything unusual (a file that is
    not a small regular one, YAML that does not parse) is left to the full checks that follow."""
    if wait:
        return
    try:
        if "://" not in results and not os.path.isdir(results):
            return
        if not os.path.isfile(grid_path) or os.path.getsize(grid_path) > 1 << 20:
            return
        import yaml

        with open(grid_path) as f:
            raw = yaml.safe_load(f)
        from study.spec.overrides import study_name

        name = study_name(raw, overrides or ()) or os.path.splitext(os.path.basename(grid_path))[0]
        from store import Store, is_safe_name
        from store.lease import held_by

        held = held_by(Store(results, name)) if is_safe_name(name) else None
    except Exception:
        return
    if held:
        _fail(held)


def _results_or_exit(results: str, create: bool = False) -> None:
    """A local --results is a directory (created by `run` and `tune` when missing)."""
    if "://" in results:
        return
    if os.path.exists(results) and not os.path.isdir(results):
        _fail(f"--results {results}: is a file, not a results directory")
    if create:
        try:
            os.makedirs(results, exist_ok=True)
        except OSError as e:
            _fail(f"--results {results}: cannot create the results directory ({e.strerror or e})")


def _store_found_or_exit(results: str, study: str, grid: str) -> None:
    """`study status` says where it looked, on stderr (the table stays what it is: every run pending): a local
    --results that does not exist is named by its absolute path (and, when the grid's own directory holds
    the study, that store); a store without the study is named with the studies it holds. A grid that has
    not run yet is a fair question (exit 0)."""
    if "://" in results:
        return
    if not os.path.isdir(results):
        near = os.path.join(os.path.dirname(os.path.abspath(grid)), "results")
        hint = (f"; the grid's directory has it: --results {near}"
                if os.path.isdir(os.path.join(near, study)) and os.path.abspath(results) != near else "")
        typer.echo(f"note: --results {_where(results)}: no such directory, so study {study!r} has not run there "
                   f"(every run pending){hint}", err=True)
        return
    if not os.path.isdir(os.path.join(results, study)):
        typer.echo(f"note: no study {study!r} under {_where(results)} yet (every run pending); "
                   f"{_studies_there(results)}", err=True)


def _links_out_or_exit(results: str, study: str, code: int = 2) -> None:
    """Exit `code` (2; verify's 1: store damage is a failed check) in one line when the study's directory
    holds a symlink out of it: read paths refuse it as `study run` does (store.Store.links_out)."""
    from store import Store

    try:
        Store(results, study).refuse_links_out()
    except OSError as e:
        _fail(e.strerror or str(e), code)


def _study_or_exit(study: Optional[str], results: str) -> str:
    """--study (default: the newest study of the store), a plain name of a study present under
    `results`; exit 2 naming what is wrong otherwise (`report` and `verify` alike)."""
    from store import Store, is_safe_name, list_studies

    if study is None:
        studies = list_studies(results)
        if not studies:
            _fail(f"no study with results under {_where(results)}")
        return studies[-1][0]
    if not is_safe_name(study):
        _fail(f"--study {study!r} is not a study name")
    store = Store(results, study)
    if not store.exists(store.dir):
        _fail(f"no study {study!r} under {_where(results)}; {_studies_there(results)}")
    return study


def _where(results: str) -> str:
    """--results as the user gave it and, for a local path, where that is from here."""
    if "://" in results or os.path.isabs(results):
        return repr(results)
    return f"{results!r} ({os.path.abspath(results)})"


def _studies_there(results: str) -> str:
    """The studies a store holds, named: what a user who gave an unknown or missing one can pick from."""
    from store import list_studies

    if "://" not in results and not os.path.isdir(results):
        return "no such directory"
    names = sorted(n for n, _ in list_studies(results))
    return f"studies there: {', '.join(names)}" if names else "it holds no study with runs"


def _writable_dir_or_exit(path: str, option: str) -> None:
    """Create directory `path` if needed and check that a file can be written there, before any work."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        _fail(f"{option} {path}: is a file, not a directory")
    except OSError as e:
        _fail(f"{option} {path}: cannot create the directory ({e.strerror or e})")
    _probe(path, option, path)


def _writable_file_or_exit(path: str, option: str) -> None:
    """`path` can be written (its directory exists and takes files; `path` is no directory)."""
    if os.path.isdir(path):
        _fail(f"{option} {path}: is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        _fail(f"{option} {path}: no such directory {parent}")
    _probe(parent, option, path)


def _probe(directory: str, option: str, shown: str) -> None:
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".study-write-probe-"):
            pass
    except OSError as e:
        _fail(f"{option} {shown}: cannot write there ({e.strerror or e})")


LOG_HELP = ("also log every trial through Ray Tune's logger callbacks: mlflow[=URI] (default URI "
            "$MLFLOW_TRACKING_URI, else sqlite:///<results>/<study>/.ray/mlflow.db), wandb (offline unless "
            "WANDB_API_KEY is set), tensorboard; repeatable")


def _log_or_exit(values: list[str], results: str) -> list:
    """--log values checked (known, package installed, MLflow server reachable), or exit 2 in one line."""
    from study.engine.loggers import LogError, parse

    try:
        return parse(values, results)
    except LogError as e:
        _fail(str(e))


@app.command(cls=_Command)
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

    g = _grid_or_exit(grid, overrides=overrides)
    if resolved:
        return _echo_resolved(g, json_out)
    try:
        rate = cost.given_rate(flops_per_s, mfu, device, peak_flops)
    except ValueError as e:
        _fail(str(e))
    for line in cost.t_warnings(g.runs, grid):
        typer.echo(line, err=True)
    measured = cost.measure(g.runs, echo=lambda m: typer.echo(m, err=True), refresh=remeasure) \
        if (measure or remeasure) else {}
    rows = [_plan_row(g, r, measured.get(r.run_id), rate) for r in g.runs]
    how = rate.how if rate else ("measured here (--measure)" if measured else None)
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
    for line in plan_lines(g.claims.spec(), evals):
        typer.echo(line)


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


def _plan_row(g, r, m: dict | None, rate) -> dict:
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
        return cost.with_time(row, rate.train, rate.eval)
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
    """`study plan`'s table: the search groups (a search grid), a line per run, then the totals."""
    from study.spec import cost

    if g.search is not None:  # a search grid: its runs are the base configurations of the search groups
        from study.engine.tune import describe_search

        for line in describe_search(g):
            typer.echo(line)
    typer.echo(f"study {g.study}: {len(rows)} runs from {grid}")
    typer.echo(f"{'run_id':<13} {'task':<8} {'K':>3} {'L_t':>4} {'d':>5} {'params':>11} {'FLOPs/fwd':>11} "
               f"{'train FLOPs':>11} {'eval FLOPs':>11} {'step mem':>10} {'time':>9}  eval points")
    for row in rows:
        Ts = sorted({p["T"] for p in row["eval_points"]})
        Ls = sorted({p["L_s"] for p in row["eval_points"]})
        typer.echo(f"{row['run_id']:<13} {row['task']:<8} {row['K']:>3} {row['L_t']:>4} {row['d_model']:>5} "
                   f"{row['n_params']:>11,} {row['flops_per_forward']:>11.3g} {row['train_flops']:>11.3g} "
                   f"{row['eval_flops']:>11.3g} {cost.human_bytes(row['memory_bytes']):>10} "
                   f"{cost.human_seconds(row['seconds']):>9}  T={Ts} L_s={Ls}")
        for k, src in row["tuned"].items():  # values taken from a search's best.yaml (`defaults_from`)
            typer.echo(f"{'':<13} {k} = {src['value']!r} from search group {src['group']} of {src['file']}")
    typer.echo(f"total: {totals['train_flops']:.3g} training FLOPs, {totals['eval_flops']:.3g} evaluation FLOPs "
               f"(at most: T x L_s forward passes per example)")
    if totals["seconds"] is not None:
        typer.echo(f"time: {cost.human_seconds(totals['seconds'])} on one device, runs one after another, "
                   f"at {totals['rate']}")
    else:
        typer.echo("time: give --flops-per-s, --mfu with --device/--peak-flops, or --measure for an estimate")
    if totals["memory_run_id"] is not None:
        typer.echo(f"peak memory of a training step: {cost.human_bytes(totals['memory_bytes_max'])} "
                   f"({totals['memory_how']}; run {totals['memory_run_id']})")


@app.command(cls=_Command)
def run(
    grid: str,
    overrides: Optional[list[str]] = OVERRIDES,
    results: str = RESULTS,
    address: Optional[str] = typer.Option(None, "--address", help="join a Ray cluster: auto, HOST:PORT, ray://HOST:PORT"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="run again the runs recorded as failed"),
    num_cpus: Optional[int] = typer.Option(None, "--num-cpus", min=1, help="CPUs of the embedded local Ray"),
    progress_every: float = typer.Option(30.0, "--progress-every",
                                         help="seconds between progress lines when not on a terminal"),
    wait: bool = typer.Option(False, "--wait", help="if another driver is running this study, wait until it "
                              "ends (default: refuse, naming it)"),
    log: list[str] = typer.Option([], "--log", help=LOG_HELP),
):
    """Run GRID (or resume it): every run not yet complete in the store, one Ray Tune trial each.
    One driver per study: a second one is refused (exit 2) unless --wait."""
    _refuse_if_leased(grid, results, wait, overrides)  # first: a second driver is refused before torch is imported
    from study.engine.raystart import check_address
    from study.engine.runner import run_grid

    if not (math.isfinite(progress_every) and progress_every > 0):
        _fail(f"--progress-every {progress_every}: must be a number of seconds > 0")
    sinks = _log_or_exit(log, results)  # --log: known, its package installed, an MLflow server reachable
    g = _grid_or_exit(grid, overrides=overrides)
    if g.search is not None:
        typer.echo(f"error: {grid} has a `search:` section: run it with `study tune`", err=True)
        raise typer.Exit(2)
    _results_or_exit(results, create=True)
    _override_note(results, g)
    try:
        check_address(address)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    from store.lease import LeaseHeld

    try:
        go = run_grid
        if g.claims is not None:  # seeds on demand until each claim is decided (study/engine/claims.py)
            from study.engine.claims import run_claims as go
        code = go(g, results, address=address, retry_failed=retry_failed, num_cpus=num_cpus,
                  echo=typer.echo, progress_every_s=progress_every, wait=wait, log=sinks)
    except LeaseHeld as e:
        _fail(str(e))
    raise typer.Exit(code)


@app.command(cls=_Command)
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

    g = _grid_or_exit(grid, data=False, overrides=overrides)
    _results_or_exit(results)
    _store_found_or_exit(results, g.study, grid)
    _links_out_or_exit(results, g.study)
    store = Store(results, g.study)
    _override_note(results, g, store)
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


@app.command(cls=_Command)
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
    from store.lease import LeaseHeld
    from study.commands.prune import prune as run_prune

    g = _grid_or_exit(grid, data=False, overrides=overrides)
    _results_or_exit(results)
    try:
        code = run_prune(g, results, apply, echo=typer.echo)
    except LeaseHeld as e:
        _fail(str(e))
    raise typer.Exit(code)


@app.command(cls=_Command)
def tune(
    grid: str,
    overrides: Optional[list[str]] = OVERRIDES,
    results: str = RESULTS,
    address: Optional[str] = typer.Option(None, "--address", help="join a Ray cluster: auto, HOST:PORT, ray://HOST:PORT"),
    num_cpus: Optional[int] = typer.Option(None, "--num-cpus", min=1, help="CPUs of the embedded local Ray"),
    wait: bool = typer.Option(False, "--wait", help="if another driver is running this study, wait until it "
                              "ends (default: refuse, naming it)"),
    log: list[str] = typer.Option([], "--log", help=LOG_HELP),
):
    """Optuna search of GRID's `search:` section through Ray Tune (resumable); writes best.yaml for sweeps."""
    _refuse_if_leased(grid, results, wait, overrides)
    from store.lease import LeaseHeld
    from study.engine.tune import TuneError, tune_grid

    sinks = _log_or_exit(log, results)
    g = _grid_or_exit(grid, overrides=overrides)
    _results_or_exit(results, create=True)
    try:
        code = tune_grid(g, results, address=address, num_cpus=num_cpus, echo=typer.echo, wait=wait, log=sinks)
    except (TuneError, LeaseHeld) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    raise typer.Exit(code)


@app.command(cls=_Command)
def report(
    figure: str = typer.Option("iso-param", "--figure", help=", ".join(figure_names()) + ", or 'all' (every "
                               "figure the data supports, report.html/.md and the verdicts)"),
    study: Optional[str] = typer.Option(None, "--study", help="study name (default: the most recently written)"),
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
):
    """Render figures and tables from the Parquet store (never trains)."""
    from analysis.figures import Options

    names = _report_options_or_exit(figure, fmt, pareto_x, split, threshold)
    _results_or_exit(results)
    study = _study_or_exit(study, results)
    _links_out_or_exit(results, study)
    if len(names) > 1 and jobs != 1:
        from analysis.render import prestart

        prestart()  # the drawing workers' fork server imports while the store is read
    data = _report_data_or_exit(results, study)
    named = _compare_pairs_or_exit(data, compare)
    opts = Options(fmt=fmt, threshold=threshold, T=T, pareto_x=pareto_x, split=split, compare=tuple(named))
    out_dir = out or (f"{data.dir}/figures" if data.store.local else f"figures/{data.name}")
    if out is not None or data.store.local:
        _writable_dir_or_exit(out_dir, "--out")  # before drawing anything
    from analysis.derived import Derived
    from analysis.render import auto_jobs, draw

    derived = Derived(data)  # the tables figures, report and verdicts share, each computed once
    drawn = draw(data, names, out_dir, opts, jobs if jobs is not None else auto_jobs(data, len(names)), derived)
    for n, got in drawn.items():
        if isinstance(got, str):
            typer.echo(f"{n}: not drawn: {got}", err=True)
        else:
            for p in got:
                typer.echo(p)
    if figure == "all":
        from analysis.report import write_report

        for p in write_report(data, out_dir, drawn, opts, derived):
            typer.echo(p)
    if figure == "all" or named:
        _print_comparisons(data, opts, derived)
    _print_claims(data)
    bad = sum(isinstance(v, str) for v in drawn.values())
    raise typer.Exit(1 if bad == len(names) else 0)


def _report_options_or_exit(figure: str, fmt: str, pareto_x: str, split: str, threshold: float | None) -> list[str]:
    """The figures `study report` draws (every one for 'all'), once every option is known good; else exit 2."""
    from analysis.figures import FIGURES, FORMATS

    names = list(FIGURES) if figure == "all" else [figure]
    for n in names:
        if n not in FIGURES:
            typer.echo(f"error: unknown figure {n!r}; known: {', '.join(FIGURES)}, all", err=True)
            raise typer.Exit(2)
    if fmt not in FORMATS:
        typer.echo(f"error: unknown --format {fmt!r}; allowed: {', '.join(FORMATS)}", err=True)
        raise typer.Exit(2)
    if pareto_x not in ("T", "forward_passes"):
        typer.echo(f"error: unknown --pareto-x {pareto_x!r}; allowed: T, forward_passes", err=True)
        raise typer.Exit(2)
    from tasks.base import SPLITS

    if split not in SPLITS:
        typer.echo(f"error: unknown --split {split!r}; allowed: {', '.join(SPLITS)}", err=True)
        raise typer.Exit(2)
    if threshold is not None and not (math.isfinite(threshold) and 0 < threshold <= 1):
        _fail(f"--threshold {threshold}: a success rate in (0, 1] is meant (VPR or RTR)")
    return names


def _report_data_or_exit(results: str, study: str):
    """The study's tables for the figures (the unreadable files it skipped named on stderr), or exit."""
    from analysis.load import MissingData, load_study

    try:
        data = load_study(results, study)
    except MissingData as e:  # a study with no runs yet: what `study run` would write is missing
        _fail(str(e))
    except ValueError as e:  # the store itself is damaged
        _fail(str(e), 1)
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
            typer.echo(f"error: --compare {c!r}: expected RUN_A:RUN_B (two run ids)", err=True)
            raise typer.Exit(2)
        named.append((a, b))
    if named:
        from analysis.compare import study_pairs

        try:
            study_pairs(data, named)  # unknown runs or runs of two tasks: refused before drawing
        except MissingData as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2)
    return named


def _print_claims(data) -> None:
    """The claims table (analysis/claims.py), when the study's grid declared claims."""
    import tasks
    from analysis.claims import claims_table, lines, read_spec

    if read_spec(data.store) is None:
        return
    table = claims_table(data)
    typer.echo(f"claims ({table['method'].iloc[0] if len(table) else ''}):")
    for line in lines(table, {m for m in table["metric"] if tasks.is_rate(m)}):
        typer.echo("  " + line)


def _print_comparisons(data, opts, derived) -> None:
    """The paired comparisons with their verdicts, one line each (the report's table, for the terminal)."""
    from analysis.load import MissingData
    from stats import VERDICT_RULE

    try:
        c = derived.comparisons(list(opts.compare), opts.split)  # the report's table: computed once for both
    except MissingData as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if c.empty:
        return
    typer.echo(f"paired comparisons ({opts.split} split; verdict: {VERDICT_RULE}):")
    for r in c.itertuples(index=False):
        typer.echo(f"  {r.comparison:13s} {r.task_variant}: {r.A} vs {r.B}, {r.metric} T={r.T}: "
                   f"{r.value_A:.3f} vs {r.value_B:.3f}, difference {r.difference:+.3f} "
                   f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] seeds {r.seeds}: {r.verdict}")


@app.command(cls=_Command)
def verify(
    study: Optional[str] = typer.Option(None, "--study", help="study name (default: the most recently written)"),
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
    from study.commands.verify import verify_study

    if (point or fraction != 1.0) and not deep:
        typer.echo("error: --fraction and --point choose what --deep evaluates again: add --deep", err=True)
        raise typer.Exit(2)
    study = _study_or_exit(study, results)
    _links_out_or_exit(results, study, code=1)
    store = Store(results, study)
    verdict = verify_study(store, deep=deep, fraction=fraction, points=point)
    typer.echo(verdict.render())
    raise typer.Exit(0 if verdict.ok else 1)


@app.command(cls=_Command)
def predict(
    study: Optional[str] = typer.Option(None, "--study", help="study name (default: the most recently written)"),
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
                            "or 'depth-width' (z = ln d + kappa ln K + lambda ln L, a ceiling per T; post-hoc); "
                            "docs/DESIGN.md"),
    plot: Optional[str] = typer.Option(None, "--plot", help="save the ladder figure here (PNG, PDF or SVG by the "
                                       "name): measured vs the law per T, held-out models and targets marked"),
):
    """Fit a scaling law of the primary metric in parameters, loops and T to a study's finished runs
    (analysis/ladder/), predict held-out models, targets and the best model for a budget."""
    from analysis.ladder import LAWS, LadderError
    from analysis.load import MissingData, load_study
    from study.commands.predict import predict as run_predict

    if law not in LAWS:
        _fail(f"--law {law}: one of {', '.join(LAWS)}")

    if budget is not None and not (math.isfinite(budget) and budget > 0):
        _fail(f"--budget {budget}: a number of training FLOPs > 0 is meant")
    if any(t < 1 for t in T):
        _fail(f"--T {min(T)}: denoising steps are >= 1")
    _results_or_exit(results)
    study = _study_or_exit(study, results)
    grid = _grid_or_exit(target, data=False) if target is not None else None
    try:
        data = load_study(results, study)
        run_predict(data, hold_out or ([] if (target or budget) else ["largest"]), grid, budget, T or None, boot,
                    typer.echo, results, law, plot)
    except (LadderError, MissingData) as e:
        _fail(str(e))


@app.command("eval", cls=_Command)
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

    from study.spec.grid import BOUNDS

    for opt, v, cap in (("--T", T, BOUNDS["eval.T"]), ("--L-s", L_s, BOUNDS["eval.L_s"])):
        if v is not None and v > cap:
            _fail(f"{opt} {v}: beyond the bound {cap:,} (study/spec/grid.py BOUNDS, as for a grid's eval section)")
    _results_or_exit(results)
    if os.path.isdir(puzzles):
        _fail(f"--puzzles {puzzles}: is a directory; give a puzzle file")
    if out is not None:
        _writable_file_or_exit(out, "--out")  # before any row is written to the store
    try:
        s = evaluate_puzzles(run_id, puzzles, results=results, study=study, T=T, L_s=L_s, out=out,
                             n_samples_kept=keep)
    except (EvalError, InputFileError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo(f"run {run_id} (study {s['study']}) on {s['n']} puzzles of {puzzles}, T={s['T']} L_s={s['L_s']}:")
    for m, (v, lo, hi) in s["metrics"].items():
        typer.echo(f"  {m:<9} {v:.4f}  [{lo:.4f}, {hi:.4f}]")
    if out:
        typer.echo(f"completed grids: {out}")


@app.command("text8-download", cls=_Command)
def text8_download(
    dest: str = typer.Option("data", "--dest", help="directory for the unpacked `text8` file"),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="also require this SHA-256 of text8.zip"),
):
    """Download text8 (needs the network; tests never call it) and check it; prints the file's path."""
    from tasks.text8 import Text8Error, download_text8

    try:
        path = download_text8(dest, sha256=sha256)
    except (Text8Error, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    typer.echo(path)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
