"""The one-step ladder law: VPR per T as a sigmoid of an effective log-scale (the pre-registered form
z = ln(N / N_ref) + beta ln L, and the post-hoc depth-width form with a ceiling per T), fitted by binomial
maximum likelihood. docs/DESIGN.md#predicting-from-a-ladder gives both forms, why they were chosen, the fit
and the bootstrap's intervals. `analysis` never imports `study`: the CLI hands in targets and candidates
with their parameter counts and training FLOPs from study/spec/cost.py. Models reach the law as frames
with columns N, K, L, d_model, D (one row per model).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from analysis.effective import LOOP_FIELDS, SIZE_FIELDS
from analysis.load import MissingData

N_BOOT = 400
# fields that set how much a model is trained on: D = steps x batch is an axis of the law
DATA_FIELDS = {"train.steps", "train.batch_size", "train.warmup", "train.checkpoint_every", "train.log_every"}
AXIS_FIELDS = {*SIZE_FIELDS, *LOOP_FIELDS, *DATA_FIELDS, "train.seed"}
MIN_MODELS = 4  # distinct ladder models (each with every fitted T), beyond the law's own needs below
LOOSE = 4.0  # a shared exponent whose 95% interval is wider than this is flagged as not pinned down
RIDGE = 1e-3  # a tiny L2 pull on a_T, b_T (and the ceilings' logits): keeps a T where every run scores 0 (or 1) finite


@dataclass(frozen=True)
class Form:
    """A law's form: z = ln(size / size_ref) + sum of coefficient * ln(column) over `terms`; with `ceiling`
    each T has its own upper asymptote, metric = c_T sigmoid(a_T + b_T z)."""
    name: str
    size: str  # the model column whose log is z's fixed term
    terms: tuple[tuple[str, str, float, str], ...]  # (coefficient, model column, starting value, meaning)
    ceiling: bool
    scale: str  # what size_ref * e^z is called
    text: str  # the law in words ({d}: the data term, {dd}: what is shared or fixed)

    @property
    def midpoint(self) -> str:
        """The params row of the log10 scale where the metric is half its ceiling (50% without one)."""
        return f"log10_{self.scale[0].lower()}50"


PREREGISTERED = Form(
    "preregistered", "N", (("beta", "L", 0.5, "a loop is worth L^beta x the parameters"),), False, "N_eff",
    "per T: metric = sigmoid(a_T + b_T * z), z = ln(N / N_ref) + beta ln L{d}; N = non-embedding parameters, "
    "L = loops, beta shared across T{dd}")
DEPTH_WIDTH = Form(
    "depth-width", "d_model", (("kappa", "K", 1.0, "K distinct layers are worth K^kappa x the width"),
                               ("lambda", "L", 0.5, "L loops are worth L^lambda x the width")), True, "d_eff",
    "per T: metric = c_T sigmoid(a_T + b_T * z), z = ln(d / d_ref) + kappa ln K + lambda ln L{d}; d = width, "
    "K = distinct layers, L = loops, c_T = the ceiling at T, kappa and lambda shared across T{dd} (post-hoc form)")
LAWS = {f.name: f for f in (PREREGISTERED, DEPTH_WIDTH)}
DELTA = ("delta", "D", 0.0, "exponent of training examples D")


class LadderError(MissingData):
    """The study cannot give the law what it needs (the message says what): a user's mistake, exit 2."""


def covariates(form: Form, size_ref: float, d_ref: float, vary_D: bool, models) -> tuple[np.ndarray, np.ndarray]:
    """z's fixed term x (models,) and the columns its fitted coefficients multiply (models, terms)."""
    x = np.log(np.asarray(models[form.size], float) / size_ref)
    cols = [np.log(np.asarray(models[c], float)) for _, c, _, _ in form.terms]
    if vary_D:
        cols.append(np.log(np.asarray(models["D"], float) / d_ref))
    return x, np.stack(cols, axis=-1)


def _z(x: np.ndarray, C: np.ndarray, theta: np.ndarray, nT: int) -> np.ndarray:
    """z of models under parameters theta (..., P) -> (..., models)."""
    z = x
    for j in range(C.shape[1]):
        z = z + theta[..., 2 * nT + j, None] * C[:, j]
    return z


@dataclass
class Ladder:
    variant: str
    metric: str
    sampler: str
    split: str
    Ts: list[int]
    vary_D: bool
    size_ref: float  # the ladder models' geometric mean of form.size
    d_ref: float  # of D
    theta: np.ndarray  # the estimate: a_T..., b_T..., the terms' coefficients[, delta][, ceiling logits per T]
    theta_b: np.ndarray  # (replicates that converged, P)
    params: pd.DataFrame  # name, T, estimate, low, high, meaning
    residuals: pd.DataFrame  # per ladder model and T: measured (seed mean), fitted, residual
    heldout: pd.DataFrame  # per held-out model and T: predicted, interval, measured, interval, error
    models: pd.DataFrame  # one row per model of the family: K, L, d_model, N, D, n_params, role, seeds, run ids
    family: dict  # the family's fields (every training field but the axes)
    n_boot: int
    failed: int  # replicates that did not converge (left out of the intervals)
    form: Form = PREREGISTERED
    notes: list[str] = field(default_factory=list)
    # a check of the shared beta: beta fitted at each T alone (its own a_T, b_T), with the same replicates
    beta_by_T: pd.DataFrame | None = None  # T, estimate, low, high
    _okb: np.ndarray | None = None  # which bootstrap replicates converged (theta_b's rows)
    _rng: np.random.Generator | None = None  # the bootstrap's generator, continued for measured targets

    @property
    def law(self) -> str:
        return self.form.text.format(
            d=" + delta ln(D / D_ref)" if self.vary_D else "",
            dd=" (delta too)" if self.vary_D else f"; every run saw D = {self.d_ref:,.0f} examples")

    @property
    def terms(self) -> list[tuple[str, str, float, str]]:
        return [*self.form.terms, *([DELTA] if self.vary_D else [])]

    def z(self, models, theta: np.ndarray) -> np.ndarray:
        """Effective log-scale of models under parameters theta (..., P) -> (..., models)."""
        x, C = covariates(self.form, self.size_ref, self.d_ref, self.vary_D, models)
        return _z(x, C, theta, len(self.Ts))

    def ceiling(self, theta: np.ndarray, i: int) -> np.ndarray | float:
        """c_T of the i-th T under theta (..., P): 1 for a law without ceilings."""
        if not self.form.ceiling:
            return 1.0
        return sig(theta[..., 2 * len(self.Ts) + len(self.terms) + i])

    def at(self, theta: np.ndarray, i: int, z: np.ndarray) -> np.ndarray:
        """The metric at the i-th T and log-scales z (..., points) under theta (..., P)."""
        c = np.asarray(self.ceiling(theta, i))[..., None]
        return sig(theta[..., i, None] + theta[..., len(self.Ts) + i, None] * z) * c

    def predict(self, models) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """T -> (estimate per model, bootstrap values (replicates, models))."""
        models = {c: np.atleast_1d(np.asarray(models[c], float)) for c in ("N", "K", "L", "d_model", "D")}
        z, zb = self.z(models, self.theta), self.z(models, self.theta_b)
        return {T: (self.at(self.theta, i, z), self.at(self.theta_b, i, zb)) for i, T in enumerate(self.Ts)}

    def scale(self, models) -> np.ndarray:
        """The effective scale size_ref e^z at the estimate: N_eff = N L^beta, or d_eff (form.scale)."""
        return self.size_ref * np.exp(self.z(models, self.theta))

    def scale_vs_ladder(self, models) -> np.ndarray:
        """The effective scale of models as a multiple of the ladder's largest."""
        lad = self.models[self.models["role"] == "ladder"]
        return self.scale(models) / float(self.scale(lad).max())

    def targets(self, targets: pd.DataFrame, Ts: list[int] | None = None) -> pd.DataFrame:
        """Predicted metric of models never trained: `targets` has columns label, N, K, L, d_model, D (and
        anything else, carried along, e.g. train_flops); one row per target and T with the interval and how
        far beyond the ladder's largest effective scale it lies."""
        Ts = self._Ts(Ts)
        pred = self.predict(targets)
        beyond = self.scale_vs_ladder(targets)
        rows = []
        for T in Ts:
            est, boot = pred[T]
            lo, hi = q95(boot)
            for j, r in enumerate(targets.to_dict("records")):
                rows.append({**r, "T": T, "predicted": float(est[j]), "low": float(lo[j]), "high": float(hi[j]),
                             "scale_vs_ladder": float(beyond[j])})
        return pd.DataFrame(rows)

    def best(self, cands: pd.DataFrame, budget: float, T: int) -> tuple[pd.DataFrame, dict]:
        """Among candidates (columns label, K, L, d_model, N, D, train_flops) within `budget` training
        FLOPs: the best one per (K, L) shape at T, sorted best first, and the comparison of the best with
        the runner-up shape (paired bootstrap difference and whether the two intervals overlap)."""
        T = self._Ts([T])[0]
        ok = cands[cands["train_flops"] <= budget].reset_index(drop=True)
        if ok.empty:
            cheapest = cands.sort_values("train_flops").iloc[0] if len(cands) else None
            raise LadderError(f"no candidate trains within --budget {budget:.3g} FLOPs"
                              + (f" (the cheapest, {cheapest['label']}, needs {cheapest['train_flops']:.3g})"
                                 if cheapest is not None else ""))
        est, boot = self.predict(ok)[T]
        ok = ok.assign(predicted=est, _j=np.arange(len(ok)))
        top = ok.sort_values(["predicted", "train_flops"], ascending=[False, True])
        top = top.groupby(["K", "L"], sort=False).head(1)
        top = top.reset_index(drop=True)
        lo, hi = q95(boot[:, top["_j"].to_numpy()])
        top = top.assign(low=lo, high=hi, scale_vs_ladder=self.scale_vs_ladder(top))
        verdict = {"best": top.iloc[0]["label"], "runner_up": None}
        if len(top) > 1:
            diff = boot[:, top["_j"].iloc[0]] - boot[:, top["_j"].iloc[1]]
            dlo, dhi = q95(diff[:, None])
            verdict.update(runner_up=top.iloc[1]["label"],
                           difference=float(top["predicted"].iloc[0] - top["predicted"].iloc[1]),
                           diff_low=float(dlo[0]), diff_high=float(dhi[0]),
                           p_best=float(np.mean(diff > 0)),
                           overlap=bool(top["low"].iloc[0] <= top["high"].iloc[1]))
        return top.drop(columns="_j"), verdict

    def _Ts(self, Ts: list[int] | None) -> list[int]:
        if not Ts:
            return list(self.Ts)
        bad = [T for T in Ts if T not in self.Ts]
        if bad:
            raise LadderError(f"T = {', '.join(map(str, bad))} was not evaluated on the ladder (T: "
                              f"{', '.join(map(str, self.Ts))}); the law is fitted per T and never extrapolated in T")
        return list(Ts)


def shape_of(K, L) -> str:
    """A model's shape as the ladders name it: '(K x L)' (K and L read from float frames)."""
    return f"({int(K)} x {int(L)})"


# ---- the fit ----------------------------------------------------------------------------------------
def sig(x):
    """The logistic function, clipped so that it never overflows."""
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


def q95(boot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2.5% and 97.5% quantiles over replicates (axis 0), ignoring non-finite values."""
    b = np.where(np.isfinite(boot), boot, np.nan)
    return np.nanquantile(b, 0.025, axis=0), np.nanquantile(b, 0.975, axis=0)


def fit_law(x: np.ndarray, C: np.ndarray, tix: np.ndarray, nT: int, y: np.ndarray, w: np.ndarray,
            start: tuple[float, ...] | None = None, ceiling: bool = False, theta0: np.ndarray | None = None,
            iters: int = 80) -> tuple[np.ndarray, np.ndarray]:
    """Binomial maximum likelihood of y ~ c[tix] sigmoid(a[tix] + b[tix] * (x + C @ coef)) (c = 1 without
    `ceiling`, else c = sigmoid of a fitted logit per T), weights w (successes = y w of w trials), for a
    batch of problems at once: y, w (B, n) -> (theta (B, P), converged (B,)). theta is a (nT), b (nT),
    coef (C's columns; `start`: their starting values)[, the ceilings' logits (nT)].

    Levenberg-Marquardt on Fisher scoring: the step solves (H + lam diag(H)) s = -g with H the Fisher
    information; a step that lowers the penalised negative log-likelihood is kept and lam shrinks, else
    lam grows."""
    y, w = np.atleast_2d(y), np.atleast_2d(w)
    B, n = y.shape
    q = C.shape[1]
    g0 = 2 * nT + q  # where the ceilings' logits start
    P = g0 + (nT if ceiling else 0)
    onehot = np.zeros((n, nT))
    onehot[np.arange(n), tix] = 1.0
    ridge = np.zeros(P)
    ridge[:2 * nT] = RIDGE
    ridge[g0:] = RIDGE

    def parts(th):
        b = th[:, nT + tix]
        z = _z(x, C, th, nT)
        return th[:, tix] + b * z, z, b

    def nll(th):
        eta, _, _ = parts(th)
        pen = 0.5 * (ridge * th ** 2).sum(axis=1)
        if not ceiling:
            # -[y log p + (1 - y) log(1 - p)] = softplus(eta) - y eta, stable for large |eta|
            return (w * (np.logaddexp(0.0, eta) - y * eta)).sum(axis=1) + pen
        logp = -np.logaddexp(0.0, -eta) - np.logaddexp(0.0, -th[:, g0 + tix])
        log1mp = np.log(np.clip(-np.expm1(logp), 1e-300, None))
        return -(w * (y * logp + (1 - y) * log1mp)).sum(axis=1) + pen

    if theta0 is None:
        theta0 = _start(x, C, tix, nT, y[0], w[0], start or (0.0,) * q, ceiling)
    th = np.broadcast_to(theta0, (B, P)).copy()
    lam = np.full(B, 1e-2)
    f = nll(th)
    done = np.zeros(B, bool)
    for _ in range(iters):
        eta, z, b = parts(th)
        g, H = _score_fisher(th, eta, z, b, C, tix, nT, onehot, y, w, ridge, ceiling)
        dH = np.diagonal(H, axis1=1, axis2=2)
        A = H + (lam[:, None] * dH + 1e-9)[:, :, None] * np.eye(P)
        try:
            step = -np.linalg.solve(A, g[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            step = -np.stack([np.linalg.lstsq(Ai, gi, rcond=None)[0] for Ai, gi in zip(A, g)])
        new = th + step
        fn = nll(new)
        better = np.isfinite(fn) & (fn <= f)
        th = np.where(better[:, None], new, th)
        small = np.abs(f - fn) <= 1e-9 * (1 + np.abs(f))
        f = np.where(better, fn, f)
        lam = np.where(better, lam / 3, lam * 4)
        done |= better & small
        if done.all():
            break
    ok = np.isfinite(th).all(axis=1) & (done | (lam < 1e6))
    return th, ok


def _score_fisher(th, eta, z, b, C, tix, nT, onehot, y, w, ridge, ceiling) -> tuple[np.ndarray, np.ndarray]:
    """fit_law's gradient (B, P) and Fisher information (B, P, P) of the penalised negative
    log-likelihood at th, given the linear predictor eta, the size term z and the slopes b there."""
    B, n = y.shape
    P, q = th.shape[1], C.shape[1]
    g0 = 2 * nT + q
    s = sig(eta)
    J = np.empty((B, n, P))  # d eta / d theta (and, with ceilings, d p / d logit c)
    J[:, :, :nT] = onehot
    J[:, :, nT:2 * nT] = onehot * z[:, :, None]
    for j in range(q):
        J[:, :, 2 * nT + j] = b * C[:, j]
    if not ceiling:
        g = np.einsum("bnp,bn->bp", J, w * (s - y)) + ridge * th
        H = np.einsum("bnp,bn,bnq->bpq", J, w * s * (1 - s), J) + np.diag(ridge)
        return g, H
    # p = c s: the score and Fisher information of a binomial in p, with d p / d theta scaled by
    # 1 / sqrt(p (1 - p)) so that rates near 0 or 1 stay finite
    c = sig(th[:, g0 + tix])
    p = c * s
    v = np.sqrt(np.clip(p * (1 - p), 1e-300, None))
    J[:, :, :g0] *= (c * s * (1 - s) / v)[:, :, None]
    J[:, :, g0:] = onehot * (p * (1 - c) / v)[:, :, None]
    g = np.einsum("bnp,bn->bp", J, w * (p - y) / v) + ridge * th
    H = np.einsum("bnp,bn,bnq->bpq", J, w, J) + np.diag(ridge)
    return g, H


def _start(x, C, tix, nT, y, w, start, ceiling) -> np.ndarray:
    """Starting point: the terms' coefficients at `start`, each ceiling just above its T's best rate, and
    per T a weighted line of logit(y / c) on z."""
    q = C.shape[1]
    th = np.zeros(2 * nT + q + (nT if ceiling else 0))
    th[2 * nT:2 * nT + q] = start
    z = _z(x, C, th[None], nT)[0]
    eps = 0.5 / np.maximum(w, 1.0)
    for t in range(nT):
        m = tix == t
        c = 1.0
        if ceiling:
            c = float(np.clip(y[m].max() + 0.02, 0.05, 0.999)) if m.any() else 0.5
            th[2 * nT + q + t] = math.log(c / (1 - c))
        yc = np.minimum(y[m] / c, 1.0)
        lt = np.log((yc + eps[m]) / (1 - yc + eps[m]))
        if m.sum() >= 2 and np.ptp(z[m]) > 0:
            b, a = np.polyfit(z[m], lt, 1, w=np.sqrt(w[m]))
            th[t], th[nT + t] = a, max(b, 0.1)
        else:
            th[t], th[nT + t] = float(np.mean(lt)) if m.any() else 0.0, 1.0
    return th


