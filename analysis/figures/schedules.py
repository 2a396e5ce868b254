"""Training-depth schedule: fixed, stochastic, curriculum, reverse curriculum."""
from __future__ import annotations

from analysis.derived import Derived
from analysis.load import StudyData
from analysis.plotting import Drawing, Options, ablation

ORDER = 80
COST = 0


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    return ablation(data, derived, opts, "schedule", "schedules", "training-depth schedule")
