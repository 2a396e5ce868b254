"""The frame of the `study` command line: the typer app, every error as one line with its exit code, plain
help text. The commands are in the modules beside this one (study/cli/__init__.py lists them)."""
from __future__ import annotations

import errno
import os
import re
import sys

import typer
from typer.core import TyperCommand, TyperGroup

HELP = "`study`: plan, run, inspect and report R-MDM scaling studies."


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
        sys.stdout = _Stdout(sys.stdout)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            sys.stdout.flush()  # what is still buffered fails here, not in Python's exit
        except OSError as e:
            if not getattr(e, "stdout", False):
                raise
            _stdout_failed(e)
            sys.exit(1)
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
            lease = sys.modules.get("store.lease")  # loaded wherever LeaseHeld was raised (nothing imported here)
            if lease is not None and isinstance(e, lease.LeaseHeld):  # another driver holds the study: one line
                fail(str(e))
            if ctx.params.get("debug") or os.environ.get("RMDM_DEBUG"):
                raise
            if isinstance(e, MemoryError) or "failed to map segment" in str(e):  # a library's too (ImportError)
                typer.echo("error: out of memory (the machine's, or a limit such as `ulimit -v`): raise the limit "
                           "or free memory, then run again (a report: fewer figures, --figure NAME)", err=True)
                raise typer.Exit(1) from None
            from store.format import FormatMismatch

            if isinstance(e, FormatMismatch):  # the one line naming the versions and `study migrate`
                fail(str(e))
            if getattr(e, "stdout", False):
                _stdout_failed(e)
                raise typer.Exit(1) from None
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


class Command(TyperCommand):
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
    _stdout_to_devnull()
    raise typer.Exit(141)


def _stdout_to_devnull():
    """What is still buffered for stdout goes nowhere: no second error at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class _Stdout:
    """sys.stdout, whose failed writes are marked (`stdout`) so that they are not taken for the store's."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def write(self, text):
        return self._mark(self._stream.write, text)

    def flush(self):
        return self._mark(self._stream.flush)

    @staticmethod
    def _mark(fn, *args):
        try:
            return fn(*args)
        except OSError as e:
            e.stdout = True
            raise


def _stdout_failed(e: OSError):
    """Writing to stdout failed (`> /dev/full`): one line naming stdout, not the store's disk; exit 1."""
    _stdout_to_devnull()
    typer.echo(f"error: cannot write the output to stdout: {e.strerror or e}", err=True)


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


app = typer.Typer(cls=_Commands, help=HELP, rich_markup_mode=None)
RESULTS = typer.Option("results", "--results", help="results store: a path or a pyarrow-supported URI")
STUDY = typer.Option(None, "--study", help="study name (default: the most recently written)")


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


def fail(msg: str, code: int = 2):
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)
