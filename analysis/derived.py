"""The tables computed from a study that several figures and the report's tables read: the seeds
aggregated, the iso-FLOP pairs, the threshold crossings and the effective parameters.

A `Derived` is built by the caller for one study read and handed to every figure and to the report,
so each table is computed at most once, on first use. What it has computed is a `Computed`: plain
tables, small enough to send between processes, which is how the drawing workers of analysis/render.py
start from the caller's aggregated table and hand back what they computed for the report.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

import tasks
from analysis.compare import compare
from analysis.effective import Effective, effective_params
from analysis.load import MissingData, StudyData
from analysis.tables import (DEFAULT_SPLIT, aggregate, by_variant, differing, iso_flop_pairs, pareto_front,
                             shape_label, task_of, threshold_crossings)


@dataclass
class Computed:
    """The derived tables computed so far; a MissingData is kept too (it is the answer for that study)."""

    aggregated: pd.DataFrame | None = None
    pairs: pd.DataFrame | None = None
    crossings: dict[tuple, pd.DataFrame | MissingData] = field(default_factory=dict)  # (threshold, x, split) ->
    effective: dict[str, Effective | MissingData] = field(default_factory=dict)  # split ->
    comparisons: dict[tuple, pd.DataFrame | MissingData] = field(default_factory=dict)  # (named, split) ->

    TABLES = ("crossings", "effective", "comparisons")  # the memo tables above, keyed by their options

    def update(self, other: Computed) -> None:
        """Take from `other` what this lacks."""
        self.aggregated = self.aggregated if self.aggregated is not None else other.aggregated
        self.pairs = self.pairs if self.pairs is not None else other.pairs
        for t in self.TABLES:
            getattr(self, t).update({k: v for k, v in getattr(other, t).items() if k not in getattr(self, t)})


def _memo(table: dict, key, compute):
    """table[key], computed by compute() on first use; a MissingData is kept too, and raised each time."""
    if key not in table:
        try:
            table[key] = compute()
        except MissingData as e:
            table[key] = e
    if isinstance(table[key], MissingData):
        raise table[key]
    return table[key]


class Derived:
    """The derived tables of one study read, each computed on first use (callers never modify them)."""

    def __init__(self, data: StudyData, computed: Computed | None = None):
        self.data = data
        self.computed = computed if computed is not None else Computed()

    def aggregated(self) -> pd.DataFrame:
        """analysis.tables.aggregate of the study's evaluations: every split, seeds aggregated."""
        if self.computed.aggregated is None:
            self.computed.aggregated = aggregate(self.data.evals)
        return self.computed.aggregated

    def pairs(self) -> pd.DataFrame:
        """analysis.tables.iso_flop_pairs of the study's runs."""
        if self.computed.pairs is None:
            self.computed.pairs = iso_flop_pairs(self.data.runs)
        return self.computed.pairs

    def by_variant(self, what: str, split: str = DEFAULT_SPLIT) -> list[tuple[str, str, pd.DataFrame]]:
        """analysis.tables.by_variant of the aggregated table."""
        return by_variant(self.aggregated(), what, split)

    def crossings(self, threshold: float | None, x: str, split: str) -> pd.DataFrame:
        """Threshold crossings of every model of every task variant with a rate metric (threshold None:
        each metric's default)."""
        return _memo(self.computed.crossings, (threshold, x, split), lambda: self._crossings(threshold, x, split))

    def _crossings(self, threshold: float | None, x: str, split: str) -> pd.DataFrame:
        frames = []
        for variant, metric, d in self.by_variant("pareto", split):
            task = task_of(d)
            if not tasks.is_rate(metric, task):
                continue  # crossings are for success rates (VPR, RTR); a likelihood has its own table
            thr = threshold if threshold is not None else (tasks.metric(metric, task).threshold or 0.95)
            c = threshold_crossings(d, thr, metric, x=x, split=split)
            c["pareto"] = pareto_front(c).to_numpy()
            names = differing(c["model_key"])
            c["model"] = [shape_label(k, l, names[key]) for k, l, key in zip(c["K"], c["L_t"], c["model_key"])]
            frames.append(c.assign(metric=metric, threshold=thr, x=x))
        if not frames:
            raise MissingData("threshold crossings need a success-rate metric (VPR or RTR); the study has none")
        return pd.concat(frames, ignore_index=True)

    def effective(self, split: str = DEFAULT_SPLIT) -> Effective:
        """analysis.effective.effective_params of the study on `split` (the figure and the report's tables)."""
        return _memo(self.computed.effective, split, lambda: effective_params(self.data, split))

    def comparisons(self, named: list[tuple[str, str]] = (), split: str = DEFAULT_SPLIT) -> pd.DataFrame:
        """analysis.compare.compare of the study: every iso-parameter and iso-FLOP pair, then the pairs of
        runs a user named (the terminal's lines and the report's table, computed once)."""
        return _memo(self.computed.comparisons, (tuple(tuple(p) for p in named), split),
                     lambda: compare(self.data, list(named), split, agg=self.aggregated()))
