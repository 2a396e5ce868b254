"""What the commands check before any work (a grid, --results, a study, a writable path, --log, another
driver's lease): each `*_or_exit` returns what it checked, or exits in one line `error: ...`."""
from __future__ import annotations

import os
from typing import Optional

import typer

from study.cli.base import fail


def grid_or_exit(path: str, data: bool = True, overrides: Optional[list[str]] = None):
    """The expanded grid, after command-line `overrides` (study/spec/overrides.py); with `data` (plan, run, tune),
    also the check that each task can make the examples the grid asks of it (study.spec.grid.check_data).
    Exit 2 with one line otherwise."""
    from study.spec.grid import GridError, check_data, load_grid  # here, not at the top: `study run` on a study
    # another driver holds is refused before study.spec.grid brings torch in (refuse_if_leased)

    try:
        g = load_grid(path, overrides or ())
        if data:
            check_data(g)
        return g
    except GridError as e:
        from study.spec.overrides import attribute

        fail(attribute(str(e), path, overrides or ()))


# Hydra-style `key=value` after the grid (study/spec/overrides.py), on plan, run, status and tune
OVERRIDES = typer.Argument(None, metavar="KEY=VALUE | +KEY=VALUE | ~KEY", show_default=False,
                           help="overrides of the grid, applied before validation: train.steps=10, axes.L=[1,2], "
                                "task.mask_rate=0.3 (values are YAML); +KEY=VALUE adds a key the file lacks, "
                                "~KEY deletes one; recorded in the study's grid.yaml")


def override_note(results: str, g, store=None) -> None:
    """A line on stderr when the study last ran with other overrides than now (study/spec/overrides.py)."""
    from store import Store
    from study.spec.overrides import change_note

    note = change_note(store or Store(results, g.study), g)
    if note:
        typer.echo(note, err=True)


def refuse_if_leased(grid_path: str, results: str, wait: bool, overrides=()) -> None:
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
        fail(held)


def results_or_exit(results: str, create: bool = False) -> None:
    """A local --results is a directory (created by `run` and `tune` when missing)."""
    if "://" in results:
        return
    if os.path.exists(results) and not os.path.isdir(results):
        fail(f"--results {results}: is a file, not a results directory")
    if create:
        try:
            os.makedirs(results, exist_ok=True)
        except OSError as e:
            fail(f"--results {results}: cannot create the results directory ({e.strerror or e})")


def store_found_or_exit(results: str, study: str, grid: str) -> None:
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


def store_of_run_or_exit(results: str, study: str, grid: str, given: bool) -> None:
    """`study run` says where the study's store is before it trains anything. A default --results (./results)
    that lacks the study while the grid's project (a directory above the grid holding results/<study>) has
    it is refused, exit 2, naming that store: run from there or give --results (a fresh store included)."""
    if "://" in results:
        typer.echo(f"study {study}: store {results.rstrip('/')}/{study}")
        return
    here = os.path.join(os.path.abspath(results), study)
    near = _project_store(grid, study)
    if not os.path.isdir(here) and near and near != here and not given:
        fail(f"study {study!r} has no store under {os.path.abspath(results)}, but its project's store has it: "
             f"{near}; run from {os.path.dirname(os.path.dirname(near))} or give --results "
             f"{os.path.dirname(near)} (or --results {os.path.abspath(results)} to train it anew here)")
    typer.echo(f"study {study}: store {here}" + ("" if os.path.isdir(here) else " (new: nothing of it there yet)"))


def _project_store(grid: str, study: str) -> str | None:
    """results/<study> in the grid's directory or the closest directory above it that has one."""
    d = os.path.abspath(grid)
    while d != os.path.dirname(d):
        d = os.path.dirname(d)
        if os.path.isdir(os.path.join(d, "results", study)):
            return os.path.join(d, "results", study)
    return None


def links_out_or_exit(results: str, study: str, code: int = 2) -> None:
    """Exit `code` (2; verify's 1: store damage is a failed check) in one line when the study's directory
    holds a symlink out of it: read paths refuse it as `study run` does (store.Store.links_out)."""
    from store import Store

    try:
        Store(results, study).refuse_links_out()
    except OSError as e:
        fail(e.strerror or str(e), code)


def study_or_exit(study: Optional[str], results: str) -> str:
    """--study (default: the newest study of the store), a plain name of a study present under
    `results`; exit 2 naming what is wrong otherwise (`report` and `verify` alike)."""
    from store import Store, is_safe_name, list_studies

    if study is None:
        studies = list_studies(results)
        if not studies:
            fail(f"no study with results under {_where(results)}")
        return studies[-1][0]
    if not is_safe_name(study):
        fail(f"--study {study!r} is not a study name")
    store = Store(results, study)
    if not store.exists(store.dir):
        fail(f"no study {study!r} under {_where(results)}; {_studies_there(results)}")
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


def writable_dir_or_exit(path: str, option: str) -> None:
    """Create directory `path` if needed and check that a file can be written there, before any work."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        fail(f"{option} {path}: is a file, not a directory")
    except OSError as e:
        fail(f"{option} {path}: cannot create the directory ({e.strerror or e})")
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".study-write-probe-"):
            pass
    except OSError as e:
        fail(f"{option} {path}: cannot write there ({e.strerror or e})")


LOG_HELP = ("also log every trial through Ray Tune's logger callbacks: mlflow[=URI] (default URI "
            "$MLFLOW_TRACKING_URI, else sqlite:///<results>/<study>/.ray/mlflow.db), wandb (offline unless "
            "WANDB_API_KEY is set), tensorboard; repeatable")


def log_or_exit(values: list[str], results: str) -> list:
    """--log values checked (known, package installed, MLflow server reachable), or exit 2 in one line."""
    from study.engine.loggers import LogError, parse

    try:
        return parse(values, results)
    except LogError as e:
        fail(str(e))
