"""rmdm-study's Python API: a results store's tables as pandas DataFrames, figures as matplotlib Figures.

    import rmdm_study as rs

    res = rs.open("results")                  # a local results directory, or "s3://bucket/prefix"
    res.studies()                             # ['demo_sudoku', ...], oldest first
    s = res.study("demo_sudoku")              # default: the most recently written study
    s.runs, s.evals, s.history                # the store's tables and names (docs/guide/schema.md), with each run's columns
    s.not_done                                # runs left out: failed or pruned (only done runs are analysed)
    s.samples()                               # per-example outputs and scores (s.samples(run_id) for one run)
    s.table()                                 # aggregated over seeds: model, value, ci_low, ci_high, ci_method, n_seeds
    s.compare()                               # paired comparisons with verdicts, as `study report` prints them
    fig = s.figure("iso-param")               # a matplotlib Figure (or a list of them); saving is yours

`rmdm_study` is the one documented name. The project also installs the packages `study`, `model`,
`tasks`, `store`, `stats`, `analysis` and `atomicio` (the layout the tool was asked for); importing `rmdm_study`
checks that each of those names is this project's own and raises ImportError naming any other package
that shadows one, so a clash never passes silently.
"""
from __future__ import annotations

import importlib.util
import os
import warnings

__all__ = ["open", "Results", "Study", "PACKAGES"]

PACKAGES = ("study", "model", "tasks", "store", "stats", "analysis", "atomicio")
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _check_packages() -> None:
    """Where Python would import each of PACKAGES from (found, not imported): this project, or ImportError
    naming what shadows it (a local file or folder of the working or the script's directory: how to run there)."""
    import sys

    local = {os.getcwd(), os.path.abspath(sys.path[0] or os.curdir)} if sys.path else {os.getcwd()}
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = (spec.origin if spec is not None else None) or "not found"
        where = os.path.dirname(os.path.dirname(os.path.abspath(origin))) if spec is not None else None
        if where != _HERE:
            top = where if spec is not None and spec.submodule_search_locations else os.path.dirname(origin)
            why = (f"the local {'folder' if spec.submodule_search_locations else 'file'} "
                   f"{os.path.join(top, name) if spec.submodule_search_locations else origin} shadows it (Python "
                   f"looks first in the current or the script's directory): rename it, run from another "
                   f"directory, or start Python with -P (or PYTHONSAFEPATH=1), which leaves that directory out"
                   if spec is not None and top in local else
                   "another package of that name shadows it; uninstall it or use a separate virtual environment")
            raise ImportError(f"rmdm_study: the module {name!r} is {origin!r}, not this project's "
                              f"({_HERE}/{name}): {why}")


_check_packages()

import pandas as pd  # noqa: E402

from analysis.load import StudyData, latest_study, load_study  # noqa: E402
from store import Store, list_studies  # noqa: E402


def open(results: str = "results") -> "Results":  # noqa: A001 (the API's verb, as in the README)
    """A results store: a local directory or any pyarrow URI (s3://, gs://...)."""
    return Results(results)


class Results:
    """A results store holding one directory per study."""

    def __init__(self, results: str):
        self.results = results

    def studies(self) -> list[str]:
        """Names of the studies with runs, oldest first (by their newest runs file)."""
        return [name for name, _ in list_studies(self.results)]

    def study(self, name: str | None = None) -> "Study":
        """One study, read once (default: the most recently written). Each file left out as unreadable or edited
        (its runs or eval point) is named in a warning, as `study report` names it."""
        data = load_study(self.results, name or latest_study(self.results))
        for path, why in sorted(data.store.unreadable.items()):
            warnings.warn(f"unreadable, skipped: {path} ({why}); `study run` redoes what it held", stacklevel=2)
        return Study(data)

    def __repr__(self) -> str:
        return f"rmdm_study.Results({self.results!r})"


class Study:
    """One study's tables, read once from the store (the report reads the same rows)."""

    def __init__(self, data: StudyData):
        self.data = data
        self.name = data.name
        self._table: dict[str, pd.DataFrame] = {}

    @property
    def runs(self) -> pd.DataFrame:
        """One row per run (superseded retrainings left out), with model_key, task_variant, seed."""
        return self.data.runs

    @property
    def not_done(self) -> pd.DataFrame:
        """Runs left out because they did not finish (status failed, pruned...): run_id, task_variant, model,
        seed, status, error. Only done runs are in runs, evals, history, table() and compare()."""
        return self.data.not_done

    @property
    def evals(self) -> pd.DataFrame:
        """One row per run, evaluation point and metric, joined with the run's columns."""
        return self.data.evals

    @property
    def history(self) -> pd.DataFrame:
        """The history table as stored (`loss` the training loss, `L_t` that step's depth, `lr` its learning
        rate), with the columns of its run it lacks (model_key, seed, task_variant...); docs/guide/schema.md."""
        return self.data.history

    def samples(self, run_id: str | None = None) -> pd.DataFrame:
        """Per-example rows: input, output, reference (for the examples whose text is kept) and scores."""
        return self.data.store.read("samples", filter_run=run_id)

    def models(self) -> dict[str, str]:
        """model_key -> the model's short name as compare() prints it: `(K x L)`, and what else differs
        from the other models of its task variant (`(1 x 2) lr=0.003`)."""
        from analysis.tables import differing, shape_label

        out = {}
        for _, g in self.runs.drop_duplicates("model_key").groupby("task_variant"):
            extra = differing(g["model_key"])
            out.update({r.model_key: shape_label(r.K, r.L_t, extra[r.model_key]) for r in g.itertuples(index=False)})
        return out

    def table(self, split: str = "test") -> pd.DataFrame:
        """Seeds aggregated: one row per model (`model`: its short name, as compare() names it), evaluation
        point and metric of one split, with its 95% interval and the method (analysis.tables.aggregate); a rate's
        `learned` says k of its S seeds scored above 0 (learned_low / learned_high: the share's 95% interval)."""
        if split not in self._table:
            from analysis.tables import aggregate

            agg = aggregate(self.data.evals)
            agg = agg[agg["split"] == split].reset_index(drop=True).astype({"T": "int64"})  # compare()'s T
            agg.insert(0, "model", agg["model_key"].map(self.models()))
            self._table[split] = agg
        return self._table[split]

    def compare(self, *named: tuple[str, str], split: str = "test") -> pd.DataFrame:
        """Every iso-parameter and iso-FLOP pair (and the (run A, run B) pairs named) at every common T:
        the difference, its paired 95% interval, the verdict (analysis.compare.compare)."""
        from analysis.compare import compare

        return compare(self.data, list(named), split)

    def claims(self) -> pd.DataFrame:
        """The claims the study's grid declared, each with the seeds used, its sequential interval, the decision
        and what the fixed-seed interval would say (analysis.claims); ValueError when it declared none."""
        from analysis.claims import claims_table

        t = claims_table(self.data)
        names = self.runs.set_index("run_id")["model_key"].map(self.models()).to_dict()  # as compare() names them
        return t.assign(A=t["A"].map(lambda r: names.get(r, r)), B=t["B"].map(lambda r: names.get(r, r)))

    def figure(self, name: str, **options):
        """Draw one figure of `study report` (names: analysis.figures.FIGURES) and return it as a matplotlib
        Figure (a list where the figure has several parts); nothing is written. options: those of
        `study report` (split, threshold, T, pareto_x). The figure is not one of pyplot's: a notebook shows
        it as the cell's value, a script writes it with fig.savefig(path)."""
        from matplotlib.figure import Figure

        from analysis.figures import FIGURES, Options

        if name not in FIGURES:
            raise ValueError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}")
        got = [x for x in FIGURES[name](self.data, None, Options(**options)) if isinstance(x, Figure)]
        return got[0] if len(got) == 1 else got

    def __repr__(self) -> str:
        return f"rmdm_study.Study({self.name!r}: {len(self.runs)} runs, {len(self.evals)} evals rows)"
