"""The figures' names, from the files of analysis/figures/ (not imported: the CLI's help lists them without
importing pandas or matplotlib); analysis.figures imports the modules to draw them."""
from __future__ import annotations

import importlib.util
import pkgutil

PACKAGE = "analysis.figures"


def figure_names() -> list[str]:
    """Every figure's name, sorted: a module iso_param.py is the figure `iso-param`."""
    where = importlib.util.find_spec(PACKAGE).submodule_search_locations
    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(where) if not m.name.startswith("_"))
