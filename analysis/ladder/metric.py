"""Step 2 of the two-step law: from loss to metric, per T.

    VPR_T = c_T * sigmoid(k_T * (l0_T - l))

l is the loss of step 1 (lower is better, so the metric rises as l falls), c_T in (0, 1) the ceiling
T denoising steps can reach, l0_T the loss at half the ceiling and k_T > 0 the steepness. Fitted by
binomial maximum likelihood: each point (a run's final evaluation or a checkpoint's) is value x
n_examples successes of n_examples, at its measured loss (the measured loss is taken as exact: the
loss's own noise is small beside the rate's, and the bootstrap carries it into the intervals).

One curve or one per shape: a curve per T for every (K, L) shape is tested against one curve per
shape by a likelihood-ratio test (2 x the log-likelihood gain against a chi-square with 3 x (shapes - 1)
degrees of freedom, at 5%); when it rejects, each shape keeps its own curve (`per_shape`). The test
counts each point as independent binomials; checkpoints of one run share its test examples, so it is
on the strict side (it rejects one shared curve more readily), a choice that is ours.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.ladder.law import sig

ALPHA_LR = 0.05


def curve(th: np.ndarray, loss) -> np.ndarray:
    """c sigmoid(k (l0 - l)) for th = (logit c, log k, l0) (..., 3) at losses (points,) -> (..., points)."""
    th = np.asarray(th, float)
    c, k, l0 = sig(th[..., 0, None]), np.exp(th[..., 1, None]), th[..., 2, None]
    return c * sig(k * (l0 - np.asarray(loss, float)))


def nll(th, loss, y, n) -> float:
    p = np.clip(curve(th, loss), 1e-12, 1 - 1e-12)
    return float(-(n * (y * np.log(p) + (1 - y) * np.log1p(-p))).sum())


def fit_curve(loss, y, n, start: np.ndarray | None = None) -> tuple[np.ndarray, float, bool]:
    """Binomial maximum likelihood of one curve: (theta, negative log-likelihood, converged). Without
    `start`, from a small grid (ceilings near the best rate, midpoints at the losses' quartiles,
    two steepnesses), keeping the best."""
    from scipy.optimize import minimize

    loss, y, n = (np.asarray(v, float) for v in (loss, y, n))
    if start is not None:
        starts = [np.asarray(start, float)]
    else:
        top = float(np.clip(y.max() + 0.02, 0.05, 0.99))
        starts = [np.array([np.log(c / (1 - c)), np.log(k / np.ptp(loss) if np.ptp(loss) > 0 else k), l0])
                  for c in (top,) for k in (3.0, 10.0)
                  for l0 in np.quantile(loss, (0.25, 0.5, 0.75))]
    bounds = [(-8.0, 12.0), (-6.0, 8.0), (None, None)]
    best = None
    for s in starts:
        r = minimize(nll, s, args=(loss, y, n), method="L-BFGS-B", bounds=bounds,
                     options={"maxiter": 1000, "ftol": 1e-13, "gtol": 1e-9})
        if best is None or r.fun < best.fun:
            best = r
    return best.x, float(best.fun), bool(best.success)


@dataclass
class MetricFit:
    """Step 2 at one T: one curve ('*') or one per shape, and the test that chose."""
    T: int
    curves: dict[str, np.ndarray]  # shape label or '*' -> theta
    per_shape: bool
    lr_stat: float
    lr_dof: int
    lr_p: float
    converged: bool
    notes: list[str] = field(default_factory=list)

    def theta_for(self, shape: str) -> np.ndarray:
        return self.curves[shape if self.per_shape else "*"]

    def predict(self, loss, shapes) -> np.ndarray:
        shapes = np.atleast_1d(np.asarray(shapes, object))
        loss = np.atleast_1d(np.asarray(loss, float))
        return np.array([curve(self.theta_for(s), [lv])[0] for lv, s in zip(loss, shapes)])


def fit_metric(T: int, loss, y, n, shapes, per_shape: bool | None = None,
               start: "MetricFit | None" = None) -> MetricFit:
    """Step 2 at T: one shared curve, tested against one per shape (module docstring). `per_shape` forces
    the choice (a bootstrap replicate keeps the full fit's); `start` refines from the full fit's curves."""
    from scipy.stats import chi2

    loss, y, n = (np.asarray(v, float) for v in (loss, y, n))
    shapes = np.asarray(shapes, object)
    names = sorted(set(shapes))
    s0 = start.curves if start is not None else {}
    th_all, f_all, ok_all = fit_curve(loss, y, n, s0.get("*") if "*" in s0 else None)
    curves, f_sep, ok_sep = {"*": th_all}, 0.0, True
    if len(names) > 1 and per_shape is not False:
        for s in names:
            m = shapes == s
            th, f, ok = fit_curve(loss[m], y[m], n[m], s0.get(s))
            curves[s], f_sep, ok_sep = th, f_sep + f, ok_sep and ok
    else:
        f_sep = f_all
    dof = 3 * (len(names) - 1)
    stat = max(0.0, 2 * (f_all - f_sep)) if dof else 0.0
    p = float(chi2.sf(stat, dof)) if dof else 1.0
    chosen = (p < ALPHA_LR) if per_shape is None else bool(per_shape and len(names) > 1)
    if not chosen:
        curves = {"*": th_all}
    return MetricFit(T, curves, chosen, stat, dof, p, ok_all and (ok_sep or not chosen))


def pearson(fit: MetricFit, loss, y, n, shapes) -> np.ndarray:
    """Pearson residuals (measured - fitted) / sqrt(fitted (1 - fitted) / n): about N(0, 1) when the curve
    fits to within the evaluation noise."""
    p = np.clip(fit.predict(loss, shapes), 1e-6, 1 - 1e-6)
    return (np.asarray(y, float) - p) / np.sqrt(p * (1 - p) / np.asarray(n, float))
