"""Scaling-law ladder: a law fitted on the study's models with the largest held out, and the held-out model's
prediction against its measurement (a study of three or more widths only).

When every finished run stores its test ELBO (the continuous quantities), the figure is the two-step law's
(analysis/ladder/twostep.py, `study predict --law two-step`): step 1, the loss against N_eff = N L^phi with
the law at each training length, and step 2, VPR against the loss per T with the fitted curves; the
table beside it holds the held-out model's step-1, step-2 and chained errors with 95% intervals (one
bootstrap over the ladder's runs, checkpoints and examples). Otherwise it is the pre-registered one-step
law's (`study predict --study NAME`, docs/DESIGN.md "Predicting from a ladder"): per T the primary
metric is a sigmoid in ln N + beta ln L, fitted by binomial maximum likelihood, with 95% intervals from a
bootstrap over the ladder's runs and their test examples, and the table lists predicted vs measured
with the absolute error in points.
"""
from __future__ import annotations

from analysis.derived import Derived
from analysis.ladder import LadderError, fit_study, ladder_figure, ladder_table
from analysis.load import MissingData, StudyData
from analysis.plotting import Drawing, Options

ORDER = 130
COST = 2
MIN_WIDTHS = 3  # fewer widths leave nothing to extrapolate along: the law's size term is not pinned down
N_BOOT_FIGURE = 100  # the two-step bootstrap in a report (`study predict` defaults to more)


def draw(data: StudyData, derived: Derived, opts: Options) -> Drawing:
    widths = data.runs["d_model"].nunique()  # of finished runs: the only ones load_study keeps
    if widths < MIN_WIDTHS:
        raise MissingData(f"a ladder needs finished runs at {MIN_WIDTHS} or more widths (d_model); "
                          f"this study has {widths}")
    two = _two_step(data, opts.split)
    if two is not None:
        return two
    law = fit_study(data, hold_out=["largest"], split=opts.split)
    return Drawing(ladder_figure(law), "ladder", {"ladder_table": ladder_table(law)})


def _two_step(data: StudyData, split: str) -> Drawing | None:
    """The two-step law's figure and errors, or None when runs lack the test ELBO or too few models remain."""
    from analysis.ladder.frame import split_holdout, study_frame
    from analysis.ladder.twostep import fit_two_step
    from analysis.ladder.twostep_figure import two_step_figure

    try:
        lad, held = split_holdout(study_frame(data, split), ["largest"])
    except LadderError:
        return None
    law = fit_two_step(lad, n_boot=N_BOOT_FIGURE)
    fig = two_step_figure(law, lad, held)
    fig.suptitle(f"{data.name}: the two-step ladder law, largest model held out")
    return Drawing(fig, "ladder", {"ladder_two_step_errors": law.errors(held)})
