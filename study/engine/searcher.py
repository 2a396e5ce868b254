"""Ray Tune's OptunaSearch and ASHA with the two changes a resumable, pruned `study tune` needs.

Imports Ray Tune and Optuna: study/engine/tune.py imports this module only when a search runs.
"""
from __future__ import annotations

import math

from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler
from ray.tune.search.optuna import OptunaSearch


def has_value(result: dict | None, key: str) -> bool:
    """Whether a Tune result carries a finite number under `key`."""
    v = (result or {}).get(key)
    return isinstance(v, (int, float)) and math.isfinite(v)


class RecordingAsha(AsyncHyperBandScheduler):
    """ASHA that records which trials it stopped (in `stopped`, shared with the searcher), so the
    searcher can tell pruned from interrupted."""

    def __init__(self, stopped: set, **kw):
        super().__init__(**kw)
        self.stopped = stopped

    def on_trial_result(self, tune_controller, trial, result):
        action = super().on_trial_result(tune_controller, trial, result)
        if action == TrialScheduler.STOP:
            self.stopped.add(trial.trial_id)
        return action


class ResumableOptunaSearch(OptunaSearch):
    """OptunaSearch on a persisted study.

    - intermediate results carry no `objective` (only the last one does): skip them
      instead of failing on the missing key;
    - a trial that ends without an objective, without an error and without a stop by
      the scheduler (`stopped`, filled by RecordingAsha) was interrupted (Ctrl-C, driver lost):
      it stays RUNNING in the storage, and the next `study tune` runs it again instead of
      counting it as pruned.
    """

    def __init__(self, stopped: set, **kw):
        super().__init__(**kw)
        self.stopped, self.named = stopped, set()

    def on_trial_result(self, trial_id, result):
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is not None and result.get("run_id") and trial_id not in self.named:
            ot_trial.set_user_attr("run_id", result["run_id"])  # even if the trial never ends
            self.named.add(trial_id)
        if has_value(result, self.metric):
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id, result=None, error=False):
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return
        if result and result.get("run_id"):
            ot_trial.set_user_attr("run_id", result["run_id"])
        value = has_value(result, self.metric)
        if not (error or value or trial_id in self.stopped):
            self._completed_trials.add(trial_id)
            return  # interrupted: left RUNNING on purpose
        if result and not value:  # pruned, or failed: no value to tell
            result = {k: v for k, v in result.items() if k != self.metric}
        super().on_trial_complete(trial_id, result, error)
