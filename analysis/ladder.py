"""Scaling-law ladders: predict a model that was not trained from a ladder of small ones that were.

The law (one per study: one task variant, one family of models equal in everything but their size,
their loop and the amount of training data):

    z   = ln(N / N_ref) + beta * ln L [+ delta * ln(D / D_ref)]
    VPR_T = sigmoid(a_T + b_T * z)                  at each evaluated T

N is the model's non-embedding parameter count (the K shared layers: a loop adds none), L its
training depth (it is sampled at L_s = L), D the training examples it saw (steps x batch); N_ref and
D_ref are the ladder's geometric means (centring only). beta and delta are shared by every T: one
effective scale N_eff = N * L^beta * (D / D_ref)^delta orders every model, and T only moves and
steepens the sigmoid along it. delta is fitted only when the ladder's runs differ in D; otherwise
the law is conditional on the ladder's D and a target trained on another D is flagged.

Why this form (docs/DESIGN.md says more): the primary metric is a rate in [0, 1] that is 0 for the
smallest CPU models at T = 1 and saturates near 1 at T = 8, so a power law in N for the rate itself
cannot hold, while a logistic in log-scale is what OLMo's task laws end with (their second step,
loss -> accuracy, is a sigmoid; ours goes straight from log N_eff, one step fewer to fit on a ladder
of ~16 models). m = L^beta is the effective-parameter exponent of analysis/effective.py, here
estimated jointly with the size curve instead of read off an isotonic fit, so it can extrapolate.

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
their parameter counts and training FLOPs from study/cost.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

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
LAW = ("per T: metric = sigmoid(a_T + b_T * z), z = ln(N / N_ref) + beta ln L{d}; N = non-embedding "
       "parameters, L = loops, beta shared across T{dd}")
RIDGE = 1e-3  # a tiny L2 pull on a_T, b_T: keeps a T where every run scores 0 (or 1) finite


class LadderError(MissingData):
    """The study cannot give the law what it needs (the message says what): a user's mistake, exit 2."""


@dataclass
class Ladder:
    variant: str
    metric: str
    sampler: str
    split: str
    Ts: list[int]
    vary_D: bool
    n_ref: float
    d_ref: float
    theta: np.ndarray  # the estimate: a_T..., b_T..., beta[, delta]
    theta_b: np.ndarray  # (replicates that converged, P)
    params: pd.DataFrame  # name, T, estimate, low, high, meaning
    residuals: pd.DataFrame  # per ladder model and T: measured (seed mean), fitted, residual
    heldout: pd.DataFrame  # per held-out model and T: predicted, interval, measured, interval, error
    models: pd.DataFrame  # one row per model of the family: K, L, d_model, N, D, n_params, role, seeds, run ids
    family: dict  # the family's fields (every training field but the axes)
    n_boot: int
    failed: int  # replicates that did not converge (left out of the intervals)
    notes: list[str] = field(default_factory=list)
    # a check of the shared beta: beta fitted at each T alone (its own a_T, b_T), with the same replicates
    beta_by_T: pd.DataFrame | None = None  # T, estimate, low, high
    _okb: np.ndarray | None = None  # which bootstrap replicates converged (theta_b's rows)
    _rng: np.random.Generator | None = None  # the bootstrap's generator, continued for measured targets

    @property
    def law(self) -> str:
        return LAW.format(d=" + delta ln(D / D_ref)" if self.vary_D else "",
                          dd=" (delta too)" if self.vary_D else f"; every run saw D = {self.d_ref:,.0f} examples")

    def z(self, N, L, D, theta: np.ndarray) -> np.ndarray:
        """Effective log-scale of models (N, L, D arrays) under parameters theta (..., P) -> (..., models)."""
        nT = len(self.Ts)
        x = np.log(np.asarray(N, float) / self.n_ref)
        lg = np.log(np.asarray(L, float))
        z = x + theta[..., 2 * nT, None] * lg
        if self.vary_D:
            z = z + theta[..., 2 * nT + 1, None] * np.log(np.asarray(D, float) / self.d_ref)
        return z

    def predict(self, N, L, D) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """T -> (estimate per model, bootstrap values (replicates, models))."""
        N, L, D = (np.atleast_1d(np.asarray(v, float)) for v in (N, L, D))
        out = {}
        for i, T in enumerate(self.Ts):
            est = _sig(self.theta[i] + self.theta[len(self.Ts) + i] * self.z(N, L, D, self.theta))
            tb = self.theta_b
            boot = _sig(tb[:, i, None] + tb[:, len(self.Ts) + i, None] * self.z(N, L, D, tb))
            out[T] = (est, boot)
        return out

    def n_eff(self, N, L, D) -> np.ndarray:
        """N_eff = N * L^beta (* (D / D_ref)^delta) at the estimate."""
        return self.n_ref * np.exp(self.z(N, L, D, self.theta))

    def ladder_max_n_eff(self) -> float:
        lad = self.models[self.models["role"] == "ladder"]
        return float(self.n_eff(lad["N"], lad["L"], lad["D"]).max())

    def targets(self, targets: pd.DataFrame, Ts: list[int] | None = None) -> pd.DataFrame:
        """Predicted metric of models never trained: `targets` has columns label, N, L, D (and anything
        else, carried along, e.g. train_flops); one row per target and T with the interval and how far
        beyond the ladder's largest N_eff it lies."""
        Ts = self._Ts(Ts)
        pred = self.predict(targets["N"], targets["L"], targets["D"])
        beyond = self.n_eff(targets["N"], targets["L"], targets["D"]) / self.ladder_max_n_eff()
        rows = []
        for T in Ts:
            est, boot = pred[T]
            lo, hi = _q(boot)
            for j, r in enumerate(targets.to_dict("records")):
                rows.append({**r, "T": T, "predicted": float(est[j]), "low": float(lo[j]), "high": float(hi[j]),
                             "n_eff_vs_ladder": float(beyond[j])})
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
        est, boot = self.predict(ok["N"], ok["L"], ok["D"])[T]
        ok = ok.assign(predicted=est, _j=np.arange(len(ok)))
        top = ok.sort_values(["predicted", "train_flops"], ascending=[False, True])
        top = top.groupby(["K", "L"], sort=False).head(1)
        top = top.reset_index(drop=True)
        lo, hi = _q(boot[:, top["_j"].to_numpy()])
        top = top.assign(low=lo, high=hi,
                         n_eff_vs_ladder=self.n_eff(top["N"], top["L"], top["D"]) / self.ladder_max_n_eff())
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


def fit_law(x: np.ndarray, lg: np.ndarray, dg: np.ndarray | None, tix: np.ndarray, nT: int, y: np.ndarray,
            w: np.ndarray, theta0: np.ndarray | None = None, iters: int = 80) -> tuple[np.ndarray, np.ndarray]:
    """Binomial maximum likelihood of y ~ sigmoid(a[tix] + b[tix] * (x + beta lg [+ delta dg])), weights w
    (successes = y w of w trials), for a batch of problems at once: y, w (B, n) -> (theta (B, P), converged (B,)).

    Levenberg-Marquardt on Fisher scoring: the step solves (H + lam diag(H)) s = -g with H = J' W J;
    a step that lowers the penalised negative log-likelihood is kept and lam shrinks, else lam grows."""
    y, w = np.atleast_2d(y), np.atleast_2d(w)
    B, n = y.shape
    P = 2 * nT + 1 + (dg is not None)
    onehot = np.zeros((n, nT))
    onehot[np.arange(n), tix] = 1.0
    ridge = np.zeros(P)
    ridge[:2 * nT] = RIDGE

    def parts(th):
        a, b, beta = th[:, tix], th[:, nT + tix], th[:, 2 * nT, None]
        z = x + beta * lg
        if dg is not None:
            z = z + th[:, 2 * nT + 1, None] * dg
        return a + b * z, z, b

    def nll(th):
        eta, _, _ = parts(th)
        # -[y log p + (1 - y) log(1 - p)] = softplus(eta) - y eta, stable for large |eta|
        return (w * (np.logaddexp(0.0, eta) - y * eta)).sum(axis=1) + 0.5 * (ridge * th ** 2).sum(axis=1)

    if theta0 is None:
        theta0 = _start(x, lg, tix, nT, y[0], w[0], P)
    th = np.broadcast_to(theta0, (B, P)).copy()
    lam = np.full(B, 1e-2)
    f = nll(th)
    done = np.zeros(B, bool)
    for _ in range(iters):
        eta, z, b = parts(th)
        p = _sig(eta)
        J = np.empty((B, n, P))
        J[:, :, :nT] = onehot
        J[:, :, nT:2 * nT] = onehot * z[:, :, None]
        J[:, :, 2 * nT] = b * lg
        if dg is not None:
            J[:, :, 2 * nT + 1] = b * dg
        g = np.einsum("bnp,bn->bp", J, w * (p - y)) + ridge * th
        H = np.einsum("bnp,bn,bnq->bpq", J, w * p * (1 - p), J) + np.diag(ridge)
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


def _start(x, lg, tix, nT, y, w, P) -> np.ndarray:
    """Starting point: beta = 0.5 (delta 0), and per T a weighted line of logit(y) on z."""
    th = np.zeros(P)
    th[2 * nT] = 0.5
    z = x + 0.5 * lg
    eps = 0.5 / np.maximum(w, 1.0)
    lt = np.log((y + eps) / (1 - y + eps))
    for t in range(nT):
        m = tix == t
        if m.sum() >= 2 and np.ptp(z[m]) > 0:
            b, a = np.polyfit(z[m], lt[m], 1, w=np.sqrt(w[m]))
            th[t], th[nT + t] = a, max(b, 0.1)
        else:
            th[t], th[nT + t] = float(np.mean(lt[m])) if m.any() else 0.0, 1.0
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
    """model_keys held out: 'largest' (every model of the largest parameter count) or a run id (its
    model: every seed)."""
    keys: set[str] = set()
    for h in hold:
        if h == "largest":
            top = ev["n_params"].max()
            keys |= set(ev.loc[ev["n_params"] == top, "model_key"])
            continue
        got = data.runs.loc[data.runs["run_id"] == h, "model_key"]
        if got.empty:
            raise LadderError(f"--hold-out {h}: no run {h!r} in study {data.name!r} (or 'largest')")
        if not ev["model_key"].isin(got).any():
            raise LadderError(f"--hold-out {h}: run {h!r} has no finished evaluation in the ladder's data")
        keys |= set(got)
    return keys


def fit_study(data: StudyData, hold_out: list[str] | None = ("largest",), split: str = DEFAULT_SPLIT,
              n_boot: int = N_BOOT, seed: int = 0) -> Ladder:
    """Fit the law on a study's finished runs, leaving out the held-out models, and predict them."""
    variant, metric, sampler, ev, note = _runs_of(data, split)
    notes = [note] if note else []
    # one family: the largest group of models equal in every field but the law's axes
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
    family = fam_of[ev["model_key"].iloc[0]]
    held = resolve_holdout(data, ev, list(hold_out or []))
    lad = ev[~ev["model_key"].isin(held)]
    # fitted T: every T evaluated on at least MIN_MODELS ladder models
    per_T = lad.groupby("T")["model_key"].nunique()
    Ts = sorted(int(T) for T, c in per_T.items() if c >= MIN_MODELS)
    n_models = lad["model_key"].nunique()
    n_sizes = lad["n_params_non_embedding"].nunique()
    loops = sorted(int(x) for x in lad["L_t"].unique())
    need = (f"the law (2 per T + beta) needs, after the held-out models, at least {MIN_MODELS} models evaluated "
            "at one T, 3 parameter counts and two loop counts (L = 1 and L > 1)")
    if not Ts or n_sizes < 3 or len(loops) < 2:
        raise LadderError(f"too few runs to fit: {need}; study {data.name!r} has {n_models} model(s) "
                          f"({lad['run_id'].nunique()} runs), {n_sizes} parameter count(s), loops {loops or 'none'}"
                          f"{', held out: ' + str(len(held)) + ' model(s)' if held else ''}")
    lad = lad[lad["T"].isin(Ts)]
    ev = ev[ev["T"].isin(Ts)]
    runs = data.runs.set_index("run_id")
    D_of = {r: float(runs.at[r, "steps"]) * float(runs.at[r, "batch"]) for r in ev["run_id"].unique()}
    vary_D = len({D_of[r] for r in lad["run_id"].unique()}) > 1
    N_lad = lad.drop_duplicates("model_key")["n_params_non_embedding"].to_numpy(float)
    n_ref = float(np.exp(np.log(N_lad).mean()))
    d_ref = float(np.exp(np.mean(np.log([D_of[r] for r in lad["run_id"].unique()]))))

    # the observations: one per ladder run and T
    lad = lad.sort_values(["run_id", "T"]).reset_index(drop=True)
    tpos = {T: i for i, T in enumerate(Ts)}
    x = np.log(lad["n_params_non_embedding"].to_numpy(float) / n_ref)
    lg = np.log(lad["L_t"].to_numpy(float))
    dg = np.log(lad["run_id"].map(D_of).to_numpy(float) / d_ref) if vary_D else None
    tix = lad["T"].map(tpos).to_numpy()
    y0 = lad["value"].to_numpy(float)
    n0 = lad["n_examples"].to_numpy(float)
    nT = len(Ts)
    theta, ok0 = fit_law(x, lg, dg, tix, nT, y0[None], n0[None])
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
    thb, okb = fit_law(x, lg, dg, tix, nT, yb, wb, theta0=theta)
    theta_b = thb[okb]
    failed = int((~okb).sum())
    if theta_b.shape[0] < max(20, n_boot // 2):
        raise LadderError(f"the law did not converge on {failed} of {n_boot} bootstrap replicates: the ladder "
                          f"cannot pin it down ({need})")

    models = _models(ev, held, D_of)
    lad_obj = Ladder(variant=variant, metric=metric, sampler=sampler, split=split, Ts=Ts, vary_D=vary_D,
                     n_ref=n_ref, d_ref=d_ref, theta=theta, theta_b=theta_b, params=pd.DataFrame(),
                     residuals=pd.DataFrame(), heldout=pd.DataFrame(), models=models, family=family,
                     n_boot=n_boot, failed=failed, notes=notes)
    lad_obj.params = _params(lad_obj)
    lad_obj.beta_by_T = _beta_by_T(Ts, x, lg, dg, tix, y0, n0, yb, wb)
    lad_obj.residuals = _residuals(lad_obj, lad)
    lad_obj._okb, lad_obj._rng = okb, rng
    lad_obj.heldout = _heldout(lad_obj, ev[ev["model_key"].isin(held)], models.set_index("model_key"), draws)
    return lad_obj


def _beta_by_T(Ts, x, lg, dg, tix, y0, n0, yb, wb) -> pd.DataFrame:
    """beta fitted at each T on its own (a diagnostic: a shared beta that fits some T and not others shows
    here, and in the residuals), with its interval over the same bootstrap replicates."""
    rows = []
    for t, T in enumerate(Ts):
        m = tix == t
        z = np.zeros(int(m.sum()), int)
        d = dg[m] if dg is not None else None
        th, ok = fit_law(x[m], lg[m], d, z, 1, y0[m][None], n0[m][None])
        thb, okb = fit_law(x[m], lg[m], d, z, 1, yb[:, m], wb[:, m], theta0=th[0])
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

    add("beta", None, m.theta[2 * nT], m.theta_b[:, 2 * nT], "a loop is worth L^beta x the parameters")
    if m.vary_D:
        add("delta", None, m.theta[2 * nT + 1], m.theta_b[:, 2 * nT + 1], "exponent of training examples D")
    for i, T in enumerate(m.Ts):
        a, b = m.theta[i], m.theta[nT + i]
        ab, bb = m.theta_b[:, i], m.theta_b[:, nT + i]
        add("slope", T, b, bb, "logit change per e-fold of N_eff")
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            add("log10_n50", T, math.log10(m.n_ref) - a / b / math.log(10), np.log10(m.n_ref) - ab / bb / np.log(10),
                "log10 of the N_eff where the metric is 50%")
    return pd.DataFrame(rows)


def _residuals(m: Ladder, lad: pd.DataFrame) -> pd.DataFrame:
    """Per ladder model and T: the seed mean, the law's value, the residual (points) and the evaluation's
    own standard error (points), so a residual can be read against the noise."""
    g = lad.groupby(["model_key", "T"], sort=False).agg(measured=("value", "mean"), n=("n_examples", "sum"),
                                                        seeds=("run_id", "nunique")).reset_index()
    info = m.models.set_index("model_key")
    N, L, D = (info.loc[g["model_key"], c].to_numpy(float) for c in ("N", "L", "D"))
    pred = m.predict(N, L, D)
    fitted = np.empty(len(g))
    for T in m.Ts:
        sel = (g["T"] == T).to_numpy()
        fitted[sel] = pred[T][0][sel]
    g = g.assign(label=info.loc[g["model_key"], "label"].to_numpy(), N=N.astype(int), L=L.astype(int), fitted=fitted)
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
                                     "covered", "n_eff_vs_ladder", "model_key"])
    rows = []
    for k, g in ev.groupby("model_key", sort=False):
        r = info.loc[k]
        pred = m.predict([r["N"]], [r["L"]], [r["D"]])
        beyond = float(m.n_eff([r["N"]], [r["L"]], [r["D"]])[0] / m.ladder_max_n_eff())
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
                         "n_eff_vs_ladder": beyond, "model_key": k})
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
