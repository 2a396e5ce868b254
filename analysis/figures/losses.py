"""Loss over loops: ALL vs FINAL vs WEIGHTED vs TRUNCATED."""
from __future__ import annotations

from analysis.derived import Derived
from analysis.load import StudyData
from analysis.plotting import Drawing, Options, ablation

ORDER = 70
COST = 0


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    return ablation(data, derived, opts, "loss", "losses", "loss over loops")
