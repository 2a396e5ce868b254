"""Step 1 of the two-step law: the loss law, fitted robustly.

    l = E + A * N_eff^-alpha + B * D^-beta,    N_eff = N * L^phi   [* K^kappa]

l is a continuous loss (the test or validation ELBO, nats per masked blank), N the non-embedding
parameters, L the loops, D the training examples seen (steps x batch; step x batch at a checkpoint).
N and D enter divided by fixed references (the ladder's geometric means), so A and B are the two
terms' sizes at the ladder's centre; E, A, B > 0 are fitted as their logs.

The fit follows the lessons of Besiroglu et al.'s Chinchilla replication: the objective is a Huber
loss (delta HUBER) on the log residuals log l_fit - log l, so a few outlying points (a diverged
checkpoint) do not steer it; it starts from a grid of initial values (every point of START_GRID is
scored and the best N_STARTS are refined by L-BFGS-B); and it checks convergence: the refined start
that wins must have converged (the optimiser's own test) and at least two starts must reach its
objective within a relative 1e-6 while agreeing on the exponents to 1e-2; otherwise `converged` is
False and the caller says so.

A K exponent (`kappa`: K distinct layers worth K^kappa beyond their parameter count) is ours to add
only when the residuals demand it: the law is fitted with and without it and kappa is kept when the
sum of squared noise-scaled residuals falls by more than CHI2_1 (the 95% point of a chi-square with
one degree of freedom: a likelihood-ratio test for Gaussian errors of known size) and the ladder has
two values of K. The choice is ours; the papers are silent on it.
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass

import numpy as np

HUBER = 1e-3  # Hoffmann et al.'s (and Besiroglu et al.'s) delta, on log residuals
N_STARTS = 12  # best grid points refined
CHI2_1 = 3.84
# starting values: log E, log A, alpha, log B, beta, phi (kappa starts at 0)
START_GRID = dict(e=(-2.0, -1.0, 0.0), a=(-3.0, -1.5, 0.0), alpha=(0.2, 0.5, 1.0, 1.5), b=(-3.0, -1.5, 0.0),
                  beta=(0.2, 0.5, 1.0, 1.5), phi=(0.0, 0.5, 1.0))


@dataclass
class LossFit:
    """A fitted loss law: theta = (log E, log A, alpha, log B, beta, phi, kappa) with the references."""
    theta: np.ndarray
    N_ref: float
    D_ref: float
    with_kappa: bool
    converged: bool
    objective: float

    def params(self) -> dict[str, float]:
        e, a, alpha, b, beta, phi, kappa = self.theta
        return {"E": float(np.exp(e)), "A": float(np.exp(a)), "alpha": float(alpha), "B": float(np.exp(b)),
                "beta": float(beta), "phi": float(phi), "kappa": float(kappa)}

    def predict(self, N, L, D, K=None, theta: np.ndarray | None = None) -> np.ndarray:
        """The law's loss at (N, L, D[, K]); theta (..., 7) batches parameter sets -> (..., points)."""
        th = self.theta if theta is None else theta
        return np.exp(log_loss(th, *self.covariates(N, L, D, K)))

    def covariates(self, N, L, D, K=None):
        N, L, D = (np.asarray(v, float) for v in (N, L, D))
        lK = np.log(np.asarray(K, float)) if K is not None else np.zeros_like(N)
        return np.log(N / self.N_ref), np.log(L), np.log(D / self.D_ref), lK


def one_thread():
    """Small optimisations run on one BLAS thread: L-BFGS-B's vector updates are tiny, and a threaded BLAS
    on a busy machine makes them 4x slower (measured on this 2-core box)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an optional speed-up only
        return contextlib.nullcontext()
    return threadpool_limits(1)


def log_loss(th: np.ndarray, x, lL, lD, lK) -> np.ndarray:
    """log l under theta (..., 7) at covariates (points,): a log-sum-exp of the three terms."""
    th = np.asarray(th, float)
    e, a, alpha, b, beta, phi, kappa = (th[..., i, None] for i in range(7))
    lneff = x + phi * lL + kappa * lK
    return np.logaddexp(np.logaddexp(e, a - alpha * lneff), b - beta * lD)


def huber(r: np.ndarray, delta: float = HUBER) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r ** 2, delta * (a - 0.5 * delta))


def _objective(th, cov, ll, w, free):
    full = np.zeros(7)
    full[free] = th
    return float((w * huber(log_loss(full, *cov) - ll)).sum())


def fit_loss(N, L, D, loss, K=None, with_kappa: bool = False, start: np.ndarray | None = None,
             N_ref: float | None = None, D_ref: float | None = None) -> LossFit:
    """Fit the loss law to points (N, L, D, loss[, K]); `start` (7,) refines from one point only (a
    bootstrap replicate starts from the full fit) instead of the grid."""
    from scipy.optimize import minimize

    N, L, D, loss = (np.asarray(v, float) for v in (N, L, D, loss))
    N_ref = float(np.exp(np.log(N).mean())) if N_ref is None else N_ref
    D_ref = float(np.exp(np.log(D).mean())) if D_ref is None else D_ref
    fit = LossFit(np.zeros(7), N_ref, D_ref, with_kappa, False, np.inf)
    cov = fit.covariates(N, L, D, K)
    ll = np.log(loss)
    w = np.ones_like(ll)
    free = np.array([0, 1, 2, 3, 4, 5] + ([6] if with_kappa else []))
    if start is not None:
        starts = [np.asarray(start, float)[free]]
    else:
        grid = np.array([(*p, 0.0) for p in itertools.product(*START_GRID.values())])
        score = (w * huber(log_loss(grid, *cov) - ll)).sum(axis=1)
        starts = [g[free] for g in grid[np.argsort(score)[:N_STARTS]]]
    bounds = [(None, None), (None, None), (0.0, 4.0), (None, None), (0.0, 4.0), (-1.0, 3.0), (-2.0, 2.0)]
    with one_thread():
        res = [minimize(_objective, s, args=(cov, ll, w, free), method="L-BFGS-B",
                        bounds=[bounds[i] for i in free], options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12})
               for s in starts]
    order = sorted(range(len(res)), key=lambda i: res[i].fun)
    best = res[order[0]]
    fit.theta[free] = best.x
    fit.objective = float(best.fun)
    if start is not None:
        fit.converged = bool(best.success)
    else:
        agree = [r for r in res if r.fun <= best.fun * (1 + 1e-6) + 1e-15
                 and np.allclose(r.x[[2, 4, 5]], best.x[[2, 4, 5]], atol=1e-2)]
        fit.converged = bool(best.success) and len(agree) >= 2
    return fit


def fit_with_kappa_if_needed(N, L, D, loss, K, se_log) -> tuple[LossFit, dict]:
    """The loss law without kappa, and with it when the residuals demand it (module docstring): the chosen
    fit and the test's numbers (chi2 without and with kappa, whether kappa was kept)."""
    base = fit_loss(N, L, D, loss)
    info = {"chi2": chi2(base, N, L, D, loss, None, se_log), "chi2_kappa": None, "kappa_kept": False}
    if len(np.unique(np.asarray(K))) < 2:
        return base, info
    withk = fit_loss(N, L, D, loss, K, with_kappa=True)
    info["chi2_kappa"] = chi2(withk, N, L, D, loss, K, se_log)
    if info["chi2"] - info["chi2_kappa"] > CHI2_1:
        info["kappa_kept"] = True
        return withk, info
    return base, info


def chi2(fit: LossFit, N, L, D, loss, K, se_log) -> float:
    """Sum of squared log residuals over their evaluation noise (se of log l = se(l) / l)."""
    r = np.log(fit.predict(N, L, D, K)) - np.log(np.asarray(loss, float))
    return float(((r / np.asarray(se_log, float)) ** 2).sum())
