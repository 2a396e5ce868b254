"""Draw several figures of one study, one after another or in worker processes.

Drawing is most of a large study's report (a 100-model sweep's `--figure all` draws a few hundred
panels) and matplotlib draws on one core, so `draw` spreads the figures over `jobs` processes. The
workers are started by a fork server (a clean process: never a fork of a caller that holds Ray's or
Arrow's threads) and receive the study as the caller read it, with its aggregated table (pickled
once, to a private file), so every worker draws from the same rows and none reads the store or
aggregates again. Each worker hands back, with each figure, the derived tables it computed (threshold
crossings, effective parameters, iso-FLOP pairs) into the caller's Derived, for the report's tables.
Figures are returned in the order asked, and a figure the data cannot support comes back as its
MissingData message, as it does in one process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
from concurrent.futures import ProcessPoolExecutor

from analysis.derived import Computed, Derived
from analysis.load import MissingData, StudyData

# below this many runs a study draws in a second or two: starting workers would cost more than it saves
PARALLEL_FROM_RUNS = 200

_DATA: StudyData | None = None  # a worker's study, and the derived tables its figures computed
_DERIVED: Derived | None = None


def auto_jobs(data: StudyData, n_figures: int) -> int:
    """Workers for `n_figures` figures of `data` when the user gave no --jobs: one for a small study, else
    one per core this process may use (at most one per figure)."""
    if n_figures < 2 or len(data.runs) < PARALLEL_FROM_RUNS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, n_figures))


def draw(data: StudyData, names: list[str], out_dir: str, opts, jobs: int = 1,
         derived: Derived | None = None, meanwhile=None) -> dict[str, list[str] | str]:
    """{figure name: the paths it wrote, or why it was not drawn}, in the order of `names`. The derived
    tables the figures compute are kept in `derived` (the caller's, for the report). `meanwhile()`, if
    given, is called once in this process: while the workers draw when there are workers, else first."""
    derived = derived if derived is not None else Derived(data)
    if jobs <= 1 or len(names) < 2:
        # imported here, not above: with workers, this process never imports matplotlib (they do)
        from analysis.figures import FIGURES

        if meanwhile is not None:
            meanwhile()
        return {n: _paths_or_why(FIGURES[n], data, out_dir, opts, derived) for n in names}
    derived.aggregated()  # once here, sent with the study: every figure but two reads it
    # the slowest figures first, so the last worker to finish does not start a long one at the end
    from analysis.figures import FIGURES  # imports no matplotlib (analysis/plotting.py mpl())

    order = sorted(names, key=lambda n: -FIGURES[n].module.COST)
    # the study pickled once, into a private directory every worker reads it from (as initargs it is
    # pickled again for each worker and pushed through its pipe one after the other: tens of MB
    # for a 1,000-run study, half a second before the last worker starts drawing)
    with tempfile.TemporaryDirectory(prefix="rmdm_draw_") as tmp:  # mode 0700: this user's only
        path = os.path.join(tmp, "study.pickle")
        with open(path, "wb") as f:
            pickle.dump((data, derived.computed), f, protocol=pickle.HIGHEST_PROTOCOL)
        with ProcessPoolExecutor(max_workers=min(jobs, len(names)), mp_context=_context(), initializer=_init,
                                 initargs=(path,)) as pool:
            futures = {n: pool.submit(_draw_one, n, out_dir, opts) for n in order}
            if meanwhile is not None:  # this process's own work (the report's comparisons) beside the drawing
                meanwhile()
            results = {n: f.result() for n, f in futures.items()}
    out = {}
    for n in names:
        got, computed = results[n]
        derived.computed.update(computed)
        out[n] = got
    return out


@contextlib.contextmanager
def staged(out_dir: str):
    """A private folder beside `out_dir` to write a report's files into: moved into `out_dir` once the block
    ends (Ctrl-C and SIGTERM held off meanwhile), removed if it raises (an interrupted report leaves `out_dir`
    as it was, never half of a new set of figures beside an old one)."""
    out_dir = os.path.abspath(out_dir)
    parent, prefix = os.path.dirname(out_dir), f".{os.path.basename(out_dir)}.partial-"
    os.makedirs(parent, exist_ok=True)
    for old in glob.glob(os.path.join(glob.escape(parent), glob.escape(prefix) + "*")):
        _remove_if_unlocked(old)  # a killed report's folder; one a live report writes is locked
    tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
    lock = os.open(tmp, os.O_RDONLY)  # held while this report writes: released by the kernel however it ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            _move_into(tmp, out_dir)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    finally:
        os.close(lock)


def _remove_if_unlocked(path: str) -> None:
    """Remove a staging folder no live report holds (staged locks its own)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass  # locked: a report writing it now
    finally:
        os.close(fd)


def _move_into(src: str, dst: str) -> None:
    """Every file of `src` into `dst` (each replaced whole), then `src` removed."""
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        a, b = os.path.join(src, name), os.path.join(dst, name)
        if os.path.isdir(a) and not os.path.islink(a):
            _move_into(a, b)
        else:
            os.replace(a, b)
    os.rmdir(src)


def draw_all(data: StudyData, names: list[str], out_dir: str, opts, jobs: int, derived: Derived,
             report: bool) -> tuple[dict[str, list[str] | str], list[str]]:
    """draw() and, with `report`, report.html and report.md (analysis.report), all staged (staged): written into
    `out_dir` only once every one is. (what draw returns, the report's paths), every path in `out_dir`."""
    out_dir = os.path.abspath(out_dir)

    def comparisons() -> None:
        """derived.comparisons for the report and the terminal (kept in `derived`, a MissingData too)."""
        with contextlib.suppress(MissingData):
            derived.comparisons(list(opts.compare), opts.split)

    with staged(out_dir) as tmp:
        # the report's paired comparisons (seconds at scale; no figure computes them) while the workers draw
        drawn = draw(data, names, tmp, opts, jobs, derived, meanwhile=comparisons if report else None)
        pages = []
        if report:
            from analysis.report import write_report

            pages = list(write_report(data, tmp, drawn, opts, derived))
    moved = lambda p: os.path.join(out_dir, os.path.relpath(p, tmp))
    return ({n: got if isinstance(got, str) else [moved(p) for p in got] for n, got in drawn.items()},
            [moved(p) for p in pages])


def _context():
    return multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                       else "spawn")


def prestart() -> None:
    """Start the fork server draw()'s workers come from, with the drawing modules already imported,
    so that its start (about a second of imports) overlaps the caller's reading of the store instead
    of following it. Idempotent; nothing to do where there is no fork server."""
    ctx = _context()
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    # the figure modules import matplotlib and seaborn only when they draw (analysis/plotting.py mpl()): they
    # are preloaded by name, so no worker imports them itself
    ctx.set_forkserver_preload(["__main__", "analysis.figures", "analysis.effective", "seaborn", "matplotlib.figure",
                                "matplotlib.backends.backend_agg", "matplotlib.backends.backend_svg",
                                "matplotlib.collections", "matplotlib.font_manager"])
    forkserver.ensure_running()


def _init(path: str) -> None:
    global _DATA, _DERIVED
    with open(path, "rb") as f:
        _DATA, computed = pickle.load(f)  # written by draw() in its own private directory, a moment ago
    _DERIVED = Derived(_DATA, computed)


def _draw_one(name: str, out_dir: str, opts) -> tuple[list[str] | str, Computed]:
    """(the figure's paths or why it was not drawn, the derived tables this worker computed: a few small
    frames; never the aggregated table, which the caller sent)."""
    from analysis.figures import FIGURES  # preloaded by the fork server (prestart), where there is one

    got = _paths_or_why(FIGURES[name], _DATA, out_dir, opts, _DERIVED)
    return got, dataclasses.replace(_DERIVED.computed, aggregated=None)


def _paths_or_why(figure, data: StudyData, out_dir: str, opts, derived: Derived) -> list[str] | str:
    """The paths the figure wrote, or why the data cannot support it (its MissingData message)."""
    try:
        return figure(data, out_dir, opts, derived)
    except MissingData as e:
        return str(e)
