"""Scaling-law ladders: predict a model that was not trained from a ladder of small ones that were.

One module per job:
- law.py: the one-step law (VPR per T as a sigmoid of ln N + beta ln L; and the post-hoc depth-width
  form), its binomial fit;
- onestep.py: that law fitted on a study, with held-out models and a bootstrap over runs and examples;
- figure.py: its table and figure;
- frame.py: the two-step law's input, one frame of runs and checkpoints;
- loss.py: step 1, the loss law l = E + A N_eff^-alpha + B D^-beta, N_eff = N L^phi (Huber, many starts);
- metric.py: step 2, loss -> metric per T, VPR = c_T sigmoid(k_T (l0_T - l)) by binomial likelihood;
- twostep.py: the two steps chained, with one bootstrap, errors reported per step;
- design.py: checks of a ladder's design before anything trains;
- twostep_figure.py: the two-step law's figure (both steps).
"""
from analysis.ladder.figure import BAND, BAR_PTS, TABLE_COLUMNS, ladder_figure, ladder_table
from analysis.ladder.law import LAWS, N_BOOT, Form, Ladder, LadderError, fit_law
from analysis.ladder.onestep import (family_mismatch, family_of, fit_study, measured_targets, resolve_holdout,
                                     residual_summary)

__all__ = ["BAND", "BAR_PTS", "LAWS", "N_BOOT", "TABLE_COLUMNS", "Form", "Ladder", "LadderError", "family_mismatch",
           "family_of", "fit_law", "fit_study", "ladder_figure", "ladder_table", "measured_targets",
           "resolve_holdout", "residual_summary"]
