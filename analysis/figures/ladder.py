"""Scaling-law ladder: the pre-registered law of `study predict` fitted on the study's models with the largest held out, the held-out model's prediction against its measurement at each T (a study of three or more widths only).

The same fit as `study predict --study NAME` (docs/DESIGN.md, "Predicting from a ladder"): per T the
primary metric is a sigmoid in ln N + beta ln L, fitted by binomial maximum likelihood, with 95%
intervals from a bootstrap over the ladder's runs and their test examples. The table beside the
figure lists predicted vs measured for the held-out model, with the absolute error in points.
"""
from __future__ import annotations

from analysis.derived import Derived
from analysis.ladder import fit_study, ladder_figure, ladder_table
from analysis.load import MissingData, StudyData
from analysis.plotting import Drawing, Options

ORDER = 130
COST = 2
MIN_WIDTHS = 3  # fewer widths leave nothing to extrapolate along: the law's size term is not pinned down


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    widths = data.runs.loc[data.runs["status"] == "done", "d_model"].nunique() if "status" in data.runs else \
        data.runs["d_model"].nunique()
    if widths < MIN_WIDTHS:
        raise MissingData(f"a ladder needs finished runs at {MIN_WIDTHS} or more widths (d_model); "
                          f"this study has {widths}")
    law = fit_study(data, hold_out=["largest"], split=opts.split)
    return Drawing(ladder_figure(law), "ladder", {"ladder_table": ladder_table(law)})
