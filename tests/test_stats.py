"""The one implementation of the intervals every layer reports (stats/), checked against
textbook values. Run: .venv/bin/python -m pytest tests/test_stats.py -q
"""
from __future__ import annotations

import math

import pytest

from stats import mean_ci, mean_ci_from_sd, wilson


def test_wilson_textbook_values():
    # 95% Wilson score intervals from published tables (Newcombe 1998, Brown, Cai & DasGupta 2001)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert all(math.isnan(x) for x in wilson(0, 0))


def test_wilson_tolerates_a_count_rounded_just_above_n():
    # a pooled count k = sum(value * n) can land a hair above n; the tasks' old copy raised a math domain error
    lo, hi = wilson(10 + 1e-9, 10)
    assert lo == pytest.approx(0.7225, abs=1e-4) and hi == 1.0


def test_tasks_and_analysis_use_the_one_wilson():
    import analysis.tables
    import tasks

    assert analysis.tables.wilson is wilson
    import inspect
    for mod in (tasks, *(m for _, m in inspect.getmembers(tasks, inspect.ismodule))):
        assert "def wilson" not in inspect.getsource(mod), mod  # the tasks keep no Wilson of their own


def test_mean_ci_hand_computed():
    # values 1, 2, 3: mean 2, sample s.d. 1, half-width 1.96 / sqrt(3) = 1.13161
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert (m, lo, hi) == pytest.approx((2.0, 0.868393, 3.131607), abs=1e-6)
    assert mean_ci([4.0]) == (4.0, 4.0, 4.0)
    assert all(math.isnan(x) for x in mean_ci([]))
    assert mean_ci_from_sd(2.0, 1.0, 3) == pytest.approx((0.868393, 3.131607), abs=1e-6)
