"""Scaling-law ladders: predict a model that was not trained from a ladder of small ones that were.

Two laws (one fit per study: one task variant, one family of models equal in everything but their
size, their loop and the amount of training data). The pre-registered law (grids/cpu/ladder.yaml's
header, the default):

    z   = ln(N / N_ref) + beta * ln L [+ delta * ln(D / D_ref)]
    VPR_T = sigmoid(a_T + b_T * z)                  at each evaluated T

N is the model's non-embedding parameter count (the K shared layers: a loop adds none), L its
training depth (it is sampled at L_s = L), D the training examples it saw (steps x batch); N_ref and
D_ref are the ladder's geometric means (centring only). beta and delta are shared by every T: one
effective scale N_eff = N * L^beta * (D / D_ref)^delta orders every model, and T only moves and
steepens the sigmoid along it. delta is fitted only when the ladder's runs differ in D; otherwise
the law is conditional on the ladder's D and a target trained on another D is flagged.

The depth-width law (`--law depth-width`, chosen after the CPU ladder's first prediction missed:
post-hoc, docs/DESIGN.md says why) gives width, distinct layers and loops their own exponents and
each T a ceiling:

    z   = ln(d / d_ref) + kappa * ln K + lambda * ln L [+ delta * ln(D / D_ref)]
    VPR_T = c_T * sigmoid(a_T + b_T * z)

d_eff = d_ref e^z is the width of a (1 x 1) model that scores the same; c_T in (0, 1) is the share
of test examples T denoising steps can solve at all, however large the model.

Why a logistic in log-scale (docs/DESIGN.md says more): the primary metric is a rate in [0, 1] that
is 0 for the smallest CPU models at T = 1 and saturates near 1 at T = 8, so a power law in N for the
rate itself cannot hold, while a logistic in log-scale is what OLMo's task laws end with (their
second step, loss -> accuracy, is a sigmoid with a ceiling; ours goes straight from log-scale, one
step fewer to fit on a ladder of ~16 models). m = L^beta is the effective-parameter exponent of
analysis/effective.py, here estimated jointly with the size curve so that it can extrapolate.

Fit: binomial maximum likelihood (each run's rate at each T as successes of n_examples), by
Levenberg-Marquardt-damped Fisher scoring written in numpy, batched over bootstrap replicates.

Intervals: a bootstrap (N_BOOT replicates, fixed seed). Each replicate resamples the ladder's runs
with replacement (cases: a run with all its T), and each drawn run's test examples (its per-example
scores from the samples table when it keeps every example; else a binomial draw from value and
n_examples), refits, and predicts. A held-out model's measured value is resampled the same way
(its seeds, then its examples; its interval is at least the Wilson interval of its pooled counts);
the error's interval adds the prediction's and the measurement's half-widths in quadrature (they
are independent: the held-out runs are not in the fit). Intervals are the 2.5%
and 97.5% quantiles. `analysis` never imports `study`: the CLI hands in targets and candidates with
their parameter counts and training FLOPs from study/spec/cost.py.

Models reach the law as frames with columns N, K, L, d_model, D (one row per model).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

import tasks
from analysis.effective import LOOP_FIELDS, SIZE_FIELDS, example_scores, prefetch_scores, resample_run
from analysis.load import MissingData, StudyData
from analysis.tables import DEFAULT_SPLIT, differing, model_fields, primary_metric
from stats import wilson

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
        return _sig(theta[..., 2 * len(self.Ts) + len(self.terms) + i])

    def predict(self, models) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """T -> (estimate per model, bootstrap values (replicates, models))."""
        models = {c: np.atleast_1d(np.asarray(models[c], float)) for c in ("N", "K", "L", "d_model", "D")}
        nT, tb = len(self.Ts), self.theta_b
        z, zb = self.z(models, self.theta), self.z(models, tb)
        out = {}
        for i, T in enumerate(self.Ts):
            est = _sig(self.theta[i] + self.theta[nT + i] * z)
            boot = _sig(tb[:, i, None] + tb[:, nT + i, None] * zb)
            if self.form.ceiling:
                est, boot = est * self.ceiling(self.theta, i), boot * self.ceiling(tb, i)[:, None]
            out[T] = (est, boot)
        return out

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
            lo, hi = _q(boot)
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
        lo, hi = _q(boot[:, top["_j"].to_numpy()])
        top = top.assign(low=lo, high=hi, scale_vs_ladder=self.scale_vs_ladder(top))
        verdict = {"best": top.iloc[0]["label"], "runner_up": None}
        if len(top) > 1:
            diff = boot[:, top["_j"].iloc[0]] - boot[:, top["_j"].iloc[1]]
            dlo, dhi = _q(diff[:, None])
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


# ---- the fit ----------------------------------------------------------------------------------------
def _sig(x):
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


def _q(boot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    s = _sig(eta)
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
    c = _sig(th[:, g0 + tix])
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


# ---- from a study -------------------------------------------------------------------------------------
def family_of(fields: dict) -> dict:
    """A model's training fields without the law's axes (size, loop, data, seed): a ladder shares them."""
    return {k: v for k, v in fields.items() if k not in AXIS_FIELDS}


def _runs_of(data: StudyData, split: str):
    ev = data.evals
    if ev.empty:
        raise LadderError(f"study {data.name!r} has no evaluations: nothing to fit")
    done = set(data.runs.loc[data.runs["status"] == "done", "run_id"])
    ev = ev[(ev["split"] == split) & ev["run_id"].isin(done)]
    if ev.empty:
        raise LadderError(f"study {data.name!r}: no finished run has evaluations on split {split!r}")
    variants = sorted(ev["task_variant"].unique())
    if len(variants) > 1:
        counts = ev.groupby("task_variant")["run_id"].nunique()
        variant = counts.idxmax()
        note = f"task variants other than {variant!r} left out: " + ", ".join(v for v in variants if v != variant)
    else:
        variant, note = variants[0], None
    ev = ev[ev["task_variant"] == variant]
    metric = primary_metric(ev["task"].iloc[0], ev["metric"].unique())
    if not tasks.is_rate(metric):
        raise LadderError(f"study predict fits a success rate ({', '.join(sorted(m.name for _, c in tasks.TASKS.values() for m in c.metrics if m.kind == 'rate'))}); the primary "
                          f"metric of {variant} is {metric}")
    ev = ev[ev["metric"] == metric]
    sampler = "confidence" if (ev["sampler"] == "confidence").any() else ev["sampler"].mode().iloc[0]
    ev = ev[(ev["sampler"] == sampler) & (ev["L_s"] == ev["L_t"])]
    return variant, metric, sampler, ev, note


def resolve_holdout(data: StudyData, ev: pd.DataFrame, hold: list[str]) -> set[str]:
    """model_keys held out: 'largest' (every model of the largest parameter count), 'widest' (every model
    of the largest width) or a run id (its model: every seed)."""
    keys: set[str] = set()
    for h in hold:
        if h in ("largest", "widest"):
            col = "n_params" if h == "largest" else "d_model"
            keys |= set(ev.loc[ev[col] == ev[col].max(), "model_key"])
            continue
        got = data.runs.loc[data.runs["run_id"] == h, "model_key"]
        if got.empty:
            raise LadderError(f"--hold-out {h}: no run {h!r} in study {data.name!r} (or 'largest', 'widest')")
        if not ev["model_key"].isin(got).any():
            raise LadderError(f"--hold-out {h}: run {h!r} has no finished evaluation in the ladder's data")
        keys |= set(got)
    return keys


def _one_family(ev: pd.DataFrame, notes: list[str]) -> tuple[pd.DataFrame, dict]:
    """The largest group of models equal in every field but the law's axes (the others are left out, and
    named in a note), and that group's fields."""
    fam_of = {k: family_of(model_fields(k)) for k in ev["model_key"].unique()}
    fam_txt = {k: repr(sorted(f.items())) for k, f in fam_of.items()}
    ev = ev.assign(_fam=ev["model_key"].map(fam_txt))
    fams = ev.groupby("_fam")["model_key"].nunique().sort_values(ascending=False)
    if len(fams) > 1:
        main = fams.index[0]
        others = [k for k in fam_of if fam_txt[k] != main]
        shown = differing([next(k for k in fam_of if fam_txt[k] == main), *others], AXIS_FIELDS)
        notes.append(f"{len(others)} model(s) of another family left out (differ in: "
                     f"{'; '.join(sorted({shown[k] for k in others}))})")
        ev = ev[ev["_fam"] == main]
    return ev, fam_of[ev["model_key"].iloc[0]]


def _fitted_Ts(data: StudyData, form: Form, lad: pd.DataFrame, held: set[str]) -> list[int]:
    """Every T evaluated on at least MIN_MODELS ladder models; refuses a ladder the law cannot be fitted on."""
    per_T = lad.groupby("T")["model_key"].nunique()
    Ts = sorted(int(T) for T, c in per_T.items() if c >= MIN_MODELS)
    cols = {"N": "n_params_non_embedding", "K": "K", "L": "L_t", "d_model": "d_model"}
    size = {"N": "parameter counts", "d_model": "widths"}[form.size]
    n_sizes = lad[cols[form.size]].nunique()
    short = [c for _, c, _, _ in form.terms if lad[cols[c]].nunique() < 2]
    if not Ts or n_sizes < 3 or short:
        names = ", ".join(name for name, _, _, _ in form.terms)
        need = (f"the law (2{' or 3' if form.ceiling else ''} per T + {names}) needs, after the held-out models, "
                f"at least {MIN_MODELS} models evaluated at one T, 3 {size} and two values of "
                f"{' and of '.join(c for _, c, _, _ in form.terms)}")
        raise LadderError(f"too few runs to fit: {need}; study {data.name!r} has {lad['model_key'].nunique()} "
                          f"model(s) ({lad['run_id'].nunique()} runs), {n_sizes} {size}, "
                          + ", ".join(f"{c} {sorted(int(v) for v in lad[cols[c]].unique()) or 'none'}"
                                      for _, c, _, _ in form.terms)
                          + (f", held out: {len(held)} model(s)" if held else ""))
    return Ts


def _frame(rows: pd.DataFrame, D_of: dict) -> pd.DataFrame:
    """Evaluation rows as the law's model columns N, K, L, d_model, D."""
    return pd.DataFrame({"N": rows["n_params_non_embedding"].to_numpy(float), "K": rows["K"].to_numpy(float),
                         "L": rows["L_t"].to_numpy(float), "d_model": rows["d_model"].to_numpy(float),
                         "D": rows["run_id"].map(D_of).to_numpy(float)})


def fit_study(data: StudyData, hold_out: list[str] | None = ("largest",), split: str = DEFAULT_SPLIT,
              n_boot: int = N_BOOT, seed: int = 0, law: str = "preregistered") -> Ladder:
    """Fit a law (LAWS) on a study's finished runs, leaving out the held-out models, and predict them."""
    form = LAWS[law]
    variant, metric, sampler, ev, note = _runs_of(data, split)
    notes = [note] if note else []
    ev, family = _one_family(ev, notes)
    held = resolve_holdout(data, ev, list(hold_out or []))
    lad = ev[~ev["model_key"].isin(held)]
    Ts = _fitted_Ts(data, form, lad, held)
    lad = lad[lad["T"].isin(Ts)]
    ev = ev[ev["T"].isin(Ts)]
    runs = data.runs.set_index("run_id")
    D_of = {r: float(runs.at[r, "steps"]) * float(runs.at[r, "batch"]) for r in ev["run_id"].unique()}
    vary_D = len({D_of[r] for r in lad["run_id"].unique()}) > 1
    size_lad = _frame(lad.drop_duplicates("model_key"), D_of)[form.size].to_numpy(float)
    size_ref = float(np.exp(np.log(size_lad).mean()))
    d_ref = float(np.exp(np.mean(np.log([D_of[r] for r in lad["run_id"].unique()]))))

    # the observations: one per ladder run and T
    lad = lad.sort_values(["run_id", "T"]).reset_index(drop=True)
    tpos = {T: i for i, T in enumerate(Ts)}
    x, C = covariates(form, size_ref, d_ref, vary_D, _frame(lad, D_of))
    start = tuple(s for _, _, s, _ in (*form.terms, *([DELTA] if vary_D else [])))
    tix = lad["T"].map(tpos).to_numpy()
    y0 = lad["value"].to_numpy(float)
    n0 = lad["n_examples"].to_numpy(float)
    nT = len(Ts)
    theta, ok0 = fit_law(x, C, tix, nT, y0[None], n0[None], start, form.ceiling)
    if not ok0[0]:
        notes.append("the fit on the full ladder did not converge within its iterations; read it with care")
    theta = theta[0]

    # the bootstrap: runs (cases) with replacement, then each drawn run's examples
    rng = np.random.default_rng(seed)
    cache: dict = {}
    prefetch_scores(data, ev, cache)

    def draws(rows: pd.DataFrame) -> np.ndarray:
        return _draws(data, rows, metric, rng, n_boot, cache)

    yb = draws(lad)
    run_ids = np.array(sorted(lad["run_id"].unique()))
    pick = rng.integers(0, len(run_ids), size=(n_boot, len(run_ids)))
    mult = np.stack([np.bincount(p, minlength=len(run_ids)) for p in pick])  # (B, runs)
    col = {r: i for i, r in enumerate(run_ids)}
    wb = mult[:, lad["run_id"].map(col).to_numpy()] * n0[None]
    thb, okb = fit_law(x, C, tix, nT, yb, wb, start, form.ceiling, theta0=theta)
    theta_b = thb[okb]
    failed = int((~okb).sum())
    if theta_b.shape[0] < max(20, n_boot // 2):
        raise LadderError(f"the law did not converge on {failed} of {n_boot} bootstrap replicates: the ladder "
                          "cannot pin it down (more models, or models spread wider, are needed)")

    models = _models(ev, held, D_of)
    m = Ladder(variant=variant, metric=metric, sampler=sampler, split=split, Ts=Ts, vary_D=vary_D,
               size_ref=size_ref, d_ref=d_ref, theta=theta, theta_b=theta_b, params=pd.DataFrame(),
               residuals=pd.DataFrame(), heldout=pd.DataFrame(), models=models, family=family,
               n_boot=n_boot, failed=failed, form=form, notes=notes)
    m.params = _params(m)
    for r in m.params[m.params["T"].isna()].itertuples():
        # an exponent the ladder does not constrain: the replicates stay where they start, or run away
        if not (np.isfinite(r.low) and np.isfinite(r.high)) or r.high - r.low > LOOSE or r.high == r.low:
            notes.append(f"{r.name} is not pinned down by the ladder (95% interval [{r.low:.3g}, {r.high:.3g}]): "
                         "predictions that lean on it are extrapolations of the form, not of the data")
    if form is PREREGISTERED:
        m.beta_by_T = _beta_by_T(Ts, x, C, tix, y0, n0, yb, wb)
    m.residuals = _residuals(m, lad)
    m._okb, m._rng = okb, rng
    m.heldout = _heldout(m, ev[ev["model_key"].isin(held)], models.set_index("model_key"), draws)
    return m


def _beta_by_T(Ts, x, C, tix, y0, n0, yb, wb) -> pd.DataFrame:
    """beta fitted at each T on its own (a diagnostic: a shared beta that fits some T and not others shows
    here, and in the residuals), with its interval over the same bootstrap replicates."""
    rows = []
    for t, T in enumerate(Ts):
        m = tix == t
        z = np.zeros(int(m.sum()), int)
        start = (0.5,) + (0.0,) * (C.shape[1] - 1)
        th, ok = fit_law(x[m], C[m], z, 1, y0[m][None], n0[m][None], start)
        thb, okb = fit_law(x[m], C[m], z, 1, yb[:, m], wb[:, m], start, theta0=th[0])
        lo, hi = _q(thb[okb, 2][:, None]) if okb.any() else ([np.nan], [np.nan])
        rows.append({"T": T, "estimate": float(th[0, 2]) if ok[0] else float("nan"), "low": float(lo[0]),
                     "high": float(hi[0])})
    return pd.DataFrame(rows)


def _draws(data: StudyData, rows: pd.DataFrame, metric: str, rng, B: int, cache: dict) -> np.ndarray:
    """(replicates, rows) resampled values of evaluation rows: their examples (per-example scores when the
    samples table keeps them all, else binomial)."""
    return np.stack([resample_run(r, example_scores(data, r["run_id"], r["eval_key"], metric,
                                                      int(r["n_examples"]), cache), metric, rng, B)
                     for r in rows.to_dict("records")], axis=1)


def measured_targets(law: Ladder, data: StudyData, targets: pd.DataFrame) -> pd.DataFrame:
    """Predicted vs measured for targets trained in another study (`data`): `targets` has label, N, L, D and
    run_ids (the grid's run ids of each model, every seed); their finished evaluations in `data` (same
    metric, split, sampler, L_s = L_t) are compared as held-out models are. Empty when none is there."""
    ev = data.evals
    if ev.empty:
        return _heldout(law, ev, pd.DataFrame(), None)
    done = set(data.runs.loc[data.runs["status"] == "done", "run_id"])
    key_of = {rid: f"target:{r['label']}" for r in targets.to_dict("records") for rid in r["run_ids"]}
    ev = ev[ev["run_id"].isin(done) & ev["run_id"].isin(key_of) & (ev["split"] == law.split)
            & (ev["metric"] == law.metric) & (ev["sampler"] == law.sampler) & (ev["L_s"] == ev["L_t"])
            & ev["T"].isin(law.Ts)]
    ev = ev.assign(model_key=ev["run_id"].map(key_of))
    info = targets.assign(model_key=[f"target:{lb}" for lb in targets["label"]]).set_index("model_key")
    cache: dict = {}
    prefetch_scores(data, ev, cache)
    return _heldout(law, ev, info, lambda rows: _draws(data, rows, law.metric, law._rng, law.n_boot, cache))


def _label(K, L, d) -> str:
    return f"({int(K)} x {int(L)}) d={int(d)}"


def _models(ev: pd.DataFrame, held: set[str], D_of: dict) -> pd.DataFrame:
    rows = []
    for k, g in ev.groupby("model_key", sort=False):
        r = g.iloc[0]
        rows.append({"model_key": k, "label": _label(r["K"], r["L_t"], r["d_model"]), "K": int(r["K"]),
                     "L": int(r["L_t"]), "d_model": int(r["d_model"]), "N": int(r["n_params_non_embedding"]),
                     "n_params": int(r["n_params"]), "D": D_of[r["run_id"]],
                     "role": "held out" if k in held else "ladder", "seeds": g["run_id"].nunique(),
                     "run_ids": sorted(g["run_id"].unique())})
    return pd.DataFrame(rows).sort_values(["role", "N", "L"]).reset_index(drop=True)


def _params(m: Ladder) -> pd.DataFrame:
    nT = len(m.Ts)
    rows = []

    def add(name, T, est, boot, meaning):
        lo, hi = _q(boot[:, None])
        rows.append({"name": name, "T": T, "estimate": float(est), "low": float(lo[0]), "high": float(hi[0]),
                     "meaning": meaning})

    for j, (name, _, _, meaning) in enumerate(m.terms):
        add(name, None, m.theta[2 * nT + j], m.theta_b[:, 2 * nT + j], meaning)
    half = "50%" if not m.form.ceiling else "half its ceiling"
    for i, T in enumerate(m.Ts):
        a, b = m.theta[i], m.theta[nT + i]
        ab, bb = m.theta_b[:, i], m.theta_b[:, nT + i]
        add("slope", T, b, bb, f"logit change per e-fold of {m.form.scale}")
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            add(m.form.midpoint, T, math.log10(m.size_ref) - a / b / math.log(10),
                np.log10(m.size_ref) - ab / bb / np.log(10), f"log10 of the {m.form.scale} where the metric is {half}")
        if m.form.ceiling:
            add("ceiling", T, m.ceiling(m.theta, i), m.ceiling(m.theta_b, i),
                "the metric's upper asymptote at T: what T steps can reach however large the model")
    return pd.DataFrame(rows)


def _residuals(m: Ladder, lad: pd.DataFrame) -> pd.DataFrame:
    """Per ladder model and T: the seed mean, the law's value, the residual (points) and the evaluation's
    own standard error (points), so a residual can be read against the noise."""
    g = lad.groupby(["model_key", "T"], sort=False).agg(measured=("value", "mean"), n=("n_examples", "sum"),
                                                        seeds=("run_id", "nunique")).reset_index()
    info = m.models.set_index("model_key").loc[g["model_key"]]
    N, L = info["N"].to_numpy(float), info["L"].to_numpy(float)
    pred = m.predict(info)
    fitted = np.empty(len(g))
    for T in m.Ts:
        sel = (g["T"] == T).to_numpy()
        fitted[sel] = pred[T][0][sel]
    g = g.assign(label=info["label"].to_numpy(), N=N.astype(int), L=L.astype(int), fitted=fitted)
    g["residual_pts"] = 100 * (g["measured"] - g["fitted"])
    g["se_pts"] = 100 * np.sqrt(np.clip(g["fitted"] * (1 - g["fitted"]), 1e-12, None) / g["n"])
    return g[["label", "N", "L", "T", "seeds", "measured", "fitted", "residual_pts", "se_pts", "model_key"]] \
        .sort_values(["T", "N", "L"]).reset_index(drop=True)


def _heldout(m: Ladder, ev: pd.DataFrame, info: pd.DataFrame, draws) -> pd.DataFrame:
    """Per held-out model (info: label, N, L, D by model_key) and T: predicted vs measured with intervals."""
    rng, okb = m._rng, m._okb
    if ev.empty:
        return pd.DataFrame(columns=["label", "N", "L", "T", "seeds", "predicted", "low", "high", "measured",
                                     "meas_low", "meas_high", "error_pts", "err_low", "err_high", "abs_error_pts",
                                     "covered", "scale_vs_ladder", "model_key"])
    rows = []
    for k, g in ev.groupby("model_key", sort=False):
        r = info.loc[k]
        one = pd.DataFrame([r])
        pred = m.predict(one)
        beyond = float(m.scale_vs_ladder(one)[0])
        g = g.sort_values(["T", "run_id"])
        seeds = sorted(g["run_id"].unique())
        u = rng.integers(0, len(seeds), size=(m.n_boot, len(seeds)))  # seeds drawn, shared by every T
        for T, gt in g.groupby("T"):
            vals = draws(gt)  # (B, runs at T)
            have = [seeds.index(s) for s in gt["run_id"]]
            pos = {s: i for i, s in enumerate(have)}
            idx = np.vectorize(lambda s: pos.get(s, 0))(u)
            meas_b = vals[np.arange(m.n_boot)[:, None], idx].mean(axis=1)[okb]
            est, boot = pred[int(T)]
            measured = float(gt["value"].mean())
            plo, phi = _q(boot)
            mlo, mhi = _q(meas_b[:, None])
            # the measured value's interval: the bootstrap (seeds, examples), at least the Wilson interval of
            # the pooled counts (a rate of 0% or 100% has no bootstrap spread, yet is not known exactly)
            n = float(gt["n_examples"].sum())
            wlo, whi = wilson(float((gt["value"] * gt["n_examples"]).sum()), int(n))
            mlo, mhi = min(float(mlo[0]), wlo), max(float(mhi[0]), whi)
            est0, err = float(est[0]), float(est[0]) - measured
            # prediction and measurement are independent (the held-out runs are not in the fit): the error's
            # interval adds their half-widths in quadrature, on each side
            elo = err - math.hypot(est0 - float(plo[0]), mhi - measured)
            ehi = err + math.hypot(float(phi[0]) - est0, measured - mlo)
            rows.append({"label": r["label"], "N": int(r["N"]), "L": int(r["L"]), "T": int(T), "seeds": len(gt),
                         "predicted": float(est[0]), "low": float(plo[0]), "high": float(phi[0]),
                         "measured": measured, "meas_low": mlo, "meas_high": mhi,
                         "error_pts": 100 * err, "err_low": 100 * elo, "err_high": 100 * ehi,
                         "abs_error_pts": 100 * abs(err), "covered": bool(elo <= 0 <= ehi),
                         "scale_vs_ladder": beyond, "model_key": k})
    return pd.DataFrame(rows).sort_values(["T", "N", "L"]).reset_index(drop=True)


def residual_summary(m: Ladder) -> pd.DataFrame:
    """Per T (and 'all'): RMS and largest |residual| in points, and the RMS of residual / its standard error
    (about 1 when the law fits to within the evaluation noise; above it: misfit or seed spread)."""
    rows = []
    r = m.residuals
    for T, g in [("all", r), *((str(T), gt) for T, gt in r.groupby("T"))]:
        rows.append({"T": T, "points": len(g), "rms_pts": float(np.sqrt((g["residual_pts"] ** 2).mean())),
                     "max_abs_pts": float(g["residual_pts"].abs().max()),
                     "rms_z": float(np.sqrt(((g["residual_pts"] / g["se_pts"]) ** 2).mean()))})
    return pd.DataFrame(rows)


def family_mismatch(ladder: Ladder, fields: dict) -> list[str]:
    """The training fields (besides the law's axes) where a target differs from the ladder's family."""
    fam = family_of(fields)
    keys = sorted(set(fam) | set(ladder.family))
    return [f"{k}: {ladder.family.get(k)!r} on the ladder, {fam.get(k)!r} here" for k in keys
            if repr(fam.get(k)) != repr(ladder.family.get(k))]


# ---- the ladder's table and figure ------------------------------------------------------------------
TABLE_COLUMNS = ["role", "label", "T", "N", "scale_vs_ladder", "predicted", "low", "high", "measured", "meas_low",
                 "meas_high", "error_pts", "err_low", "err_high", "abs_error_pts", "covered", "in_band", "within_2"]
BAR_PTS = 2.0  # OLMo's bar: within 2 points of absolute accuracy ...
BAND = (0.05, 0.95)  # ... wherever the measured value is between 5% and 95%


def ladder_table(law: Ladder, targets: pd.DataFrame | None = None,
                 measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """Predicted vs measured, one row per model and T: the held-out models (role 'held out') and the targets
    (role 'target': measured_targets' rows where they were trained, else law.targets' prediction alone).
    in_band: the measured value lies where OLMo's bar applies; within_2: the error is within BAR_PTS."""
    parts = [law.heldout.assign(role="held out")]
    done = set(measured["label"]) if measured is not None and len(measured) else set()
    if done:
        parts.append(measured.assign(role="target"))
    if targets is not None and len(targets):
        rest = targets[~targets["label"].isin(done)]
        if len(rest):
            parts.append(law.targets(rest).assign(role="target"))
    t = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else \
        pd.DataFrame(columns=TABLE_COLUMNS)
    for c in TABLE_COLUMNS:
        if c not in t:
            t[c] = np.nan
    m = t["measured"].astype(float)
    t["in_band"] = (m > BAND[0]) & (m < BAND[1])
    t["within_2"] = t["abs_error_pts"].astype(float) <= BAR_PTS
    return t[TABLE_COLUMNS].sort_values(["role", "T", "N"], kind="stable").reset_index(drop=True)


def _short(v: float, _pos=None) -> str:
    """A tick label: 50, 200, 20k, 1.5M."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def _shape(K, L) -> str:
    return f"({int(K)} x {int(L)})"


def ladder_figure(law: Ladder, targets: pd.DataFrame | None = None, measured: pd.DataFrame | None = None,
                  Ts: list[int] | None = None) -> Figure:
    """One panel per T: the ladder's models (seed means) against their effective scale under the fitted law
    (N_eff, or d_eff for the depth-width law), coloured by (K x L) shape; the law's curve with its 95%
    band at a fixed scale; held-out models and targets as their prediction (open diamond, 95% interval) and,
    where trained, their measurement (filled square, 95% interval)."""
    Ts = law._Ts(Ts)
    tab = ladder_table(law, targets, measured)
    info = law.models.set_index("model_key")
    res = law.residuals.assign(x=law.scale(info.loc[law.residuals["model_key"]]),
                               shape=[_shape(k, lp) for k, lp in info.loc[law.residuals["model_key"], ["K", "L"]]
                                      .itertuples(index=False)])
    others = pd.concat([law.models[law.models["role"] != "ladder"],
                        targets if targets is not None else pd.DataFrame(columns=law.models.columns)])
    x_of = dict(zip(others["label"], law.scale(others))) if len(others) else {}
    xs = np.concatenate([res["x"].to_numpy(float), np.array(list(x_of.values()), float)])
    grid = np.geomspace(xs.min() / 1.3, xs.max() * 1.3, 120)
    zg = np.log(grid / law.size_ref)
    nT = len(law.Ts)
    shapes = sorted(res["shape"].unique())
    colour = {s: f"C{i}" for i, s in enumerate(shapes)}
    fig = Figure(figsize=(3.4 * len(Ts) + 0.6, 3.4), layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot (no global figure registry), but a canvas to draw and save on
    axes = fig.subplots(1, len(Ts), sharey=True, squeeze=False)[0]
    for ax, T in zip(axes, Ts):
        i = law.Ts.index(T)
        tb = law.theta_b
        curve = _sig(law.theta[i] + law.theta[nT + i] * zg) * law.ceiling(law.theta, i)
        band = _sig(tb[:, i, None] + tb[:, nT + i, None] * zg[None]) * np.reshape(law.ceiling(tb, i), (-1, 1))
        lo, hi = _q(band)
        ax.fill_between(grid, lo, hi, color="0.85", label="law, 95% band")
        ax.plot(grid, curve, color="0.2", lw=1.5, label="law")
        for s, g in res[res["T"] == T].groupby("shape"):
            ax.plot(g["x"], g["measured"], "o", ms=5, color=colour[s], label=f"ladder {s}")
        for r in tab[tab["T"] == T].itertuples():
            x = x_of[r.label]
            ax.errorbar([x], [r.predicted], yerr=[[r.predicted - r.low], [r.high - r.predicted]], fmt="D", ms=6,
                        mfc="none", color="C4", capsize=3, label=f"{r.role}: predicted")
            if np.isfinite(r.measured):
                ax.errorbar([x], [r.measured], yerr=[[r.measured - r.meas_low], [r.meas_high - r.measured]], fmt="s",
                            ms=5, color="k", capsize=3, label=f"{r.role}: measured")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(_short))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"T = {T}")
        ax.set_xlabel(f"{law.form.scale} under the fitted law")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(tasks.metric(law.metric).label)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, lb in zip(*ax.get_legend_handles_labels()):
            if lb not in labels:
                handles.append(h)
                labels.append(lb)
    seen = dict(zip(labels, handles))
    fig.legend(list(seen.values()), list(seen.keys()), loc="outside right upper", fontsize=9)
    fig.suptitle(f"{law.variant}: {law.form.name} law", fontsize=10)
    return fig
