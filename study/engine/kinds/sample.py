"""A grid's eval point of a sample-and-score task: `evaluate` on the point's examples, one evals row per metric
of the task (the mean of the per-example scores), key `EvalPoint.key`. The base Kind's rules, as they stand."""
from __future__ import annotations

from study.engine.kinds.base import Kind, register


class Sample(Kind):
    name = "sample"

    def owed_metrics(self, task) -> set[str]:
        return set(task.metric_names)


register(Sample())
