"""The figures of `study report`, one module per figure in this package, behind one registry (FIGURES).

A figure is a module here, named after it (iso_param.py draws `--figure iso-param`); adding a figure
is adding a module, nothing else lists them. The module's docstring is its help: the first paragraph
is the report's caption. It defines

    ORDER: int   its place in `--figure all` and in the report (figures are sorted by it)
    COST: int    how slow it is to draw at scale, 0 for quick (analysis/render.py starts the costliest first)
    draw(data: StudyData, derived: Derived, opts: Options) -> Drawing

draw builds the matplotlib figure and the tables written beside it from the study (analysis.load)
and its derived tables (analysis.derived), with the helpers of analysis.plotting; it raises
MissingData naming the axes or values the data lacks, and writes nothing. The registry writes a
Drawing: a PNG and the chosen second format, then its CSV tables.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from analysis.catalog import PACKAGE, figure_names
from analysis.derived import Derived
from analysis.load import StudyData
from analysis.plotting import FORMATS, PNG_DPI, Options, save, save_table  # noqa: F401 (the API)
from analysis.tables import fmt_params  # noqa: F401 (the API)


@dataclass(frozen=True)
class Figure:
    """One figure of the registry: called as figure(data, out_dir, opts), it draws and writes it and
    returns the paths (out_dir None: the matplotlib Figure and its tables, nothing written)."""

    name: str
    module: ModuleType

    @property
    def caption(self) -> str:
        """The first paragraph of the module's docstring, on one line."""
        return (self.module.__doc__ or self.name).strip().split("\n\n")[0].replace("\n", " ")

    def __call__(self, data: StudyData, out_dir: str | None, opts: Options = Options(),
                 derived: Derived | None = None) -> list:
        drawing = self.module.draw(data, derived if derived is not None else Derived(data), opts)
        return save(drawing.fig, out_dir, drawing.file, opts.fmt) + [
            save_table(table, out_dir, name) for name, table in drawing.tables.items()]


def _load() -> dict[str, Figure]:
    found = [Figure(n, importlib.import_module(f"{PACKAGE}.{n.replace('-', '_')}")) for n in figure_names()]
    return {f.name: f for f in sorted(found, key=lambda f: f.module.ORDER)}


FIGURES: dict[str, Figure] = _load()
