"""The two-step ladder law: step 1 (analysis.ladder.loss) predicts a model's loss from N, L and D; step 2
(analysis.ladder.metric) maps loss to the metric per T; chained, they predict the metric of a model
never trained. As the OLMo ladder (Bhagia et al. 2024) does, the errors are reported apart: step 1's
(predicted vs measured loss, relative), step 2's (the metric curve at the *measured* loss vs the
measured metric, points) and the chained one (the metric at the predicted loss, points).

Both steps are fitted on the ladder's frame (analysis.ladder.frame: runs and their checkpoints). One
bootstrap carries the noise through the chain: each replicate resamples the ladder's runs with
replacement (a run brings all its checkpoints), redraws every point's loss from its evaluation
interval (normal, se from the t interval) and its metric from its counts (binomial), refits both
steps from the full fit, and predicts. Intervals are the 2.5% and 97.5% quantiles. A held-out
model's measurement adds its own noise to the error's interval (in quadrature, as analysis.ladder.onestep
does: the held-out runs are not in the fit).

Misfit: residuals are read against the evaluation noise, step 1's as log residual / se(log l), step 2's
as Pearson residuals; an RMS above MISFIT (the issue's bar: 2 x the noise) in either step flags the
law as misspecified (`misfit`, with the notes saying which step).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.ladder.frame import Z95
from analysis.ladder.law import q95, shape_of, sig
from analysis.ladder.loss import LossFit, fit_loss, fit_with_kappa_if_needed, one_thread
from analysis.ladder.metric import MetricFit, curve, fit_metric, pearson

MISFIT = 2.0
N_BOOT_TWO_STEP = 200


def vpr_Ts(frame: pd.DataFrame) -> list[int]:
    return sorted(int(c[len("vpr_T"):]) for c in frame.columns if c.startswith("vpr_T"))


@dataclass
class TwoStep:
    loss_fit: LossFit
    loss_b: np.ndarray  # (replicates, 7)
    kappa: dict  # the K exponent's test (analysis.ladder.loss.fit_with_kappa_if_needed)
    metric: dict[int, MetricFit]
    metric_b: dict[int, dict[str, np.ndarray]]  # T -> curve name -> (replicates, 3)
    loss_col: str
    residuals: pd.DataFrame  # step, T, rms_z, points
    loss_range: tuple[float, float]  # the losses the ladder's points cover (step 2 interpolates inside)
    n_boot: int
    notes: list[str] = field(default_factory=list)

    @property
    def Ts(self) -> list[int]:
        return sorted(self.metric)

    @property
    def misfit(self) -> bool:
        return bool((self.residuals["rms_z"] > MISFIT).any())

    def _curve_b(self, T: int, shape: str) -> np.ndarray:
        return self.metric_b[T][shape if self.metric[T].per_shape else "*"]

    def predict_loss(self, targets: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(estimate (targets,), replicates (B, targets)) of the loss law at targets' N, L, D (K)."""
        K = targets["K"] if self.loss_fit.with_kappa else None
        est = self.loss_fit.predict(targets["N"], targets["L"], targets["D"], K)
        boot = self.loss_fit.predict(targets["N"], targets["L"], targets["D"], K, theta=self.loss_b)
        return est, boot

    def predict(self, targets: pd.DataFrame, Ts: list[int] | None = None) -> pd.DataFrame:
        """Per target (columns label, N, K, L, D) and T: the predicted loss and metric with 95% intervals."""
        est, boot = self.predict_loss(targets)
        llo, lhi = q95(boot)
        rows = []
        for T in Ts or self.Ts:
            m, mb = self.metric_boot(targets, T)
            lo, hi = q95(mb)
            for j, r in enumerate(targets.to_dict("records")):
                rows.append({**r, "T": T, "loss": float(est[j]), "loss_low": float(llo[j]),
                             "loss_high": float(lhi[j]), "predicted": float(m[j]), "low": float(lo[j]),
                             "high": float(hi[j]),
                             "loss_inside": bool(self.loss_range[0] <= est[j] <= self.loss_range[1])})
        return pd.DataFrame(rows)

    def metric_boot(self, targets: pd.DataFrame, T: int) -> tuple[np.ndarray, np.ndarray]:
        """(estimate (targets,), replicates (B, targets)) of the chained metric at T for targets (columns N, K,
        L, D): each replicate's curve at that replicate's predicted loss, so differences between targets
        are paired."""
        l_est, l_boot = self.predict_loss(targets)
        shapes = [shape_of(k, lp) for k, lp in zip(targets["K"], targets["L"])]
        est = np.array([float(curve(self.metric[T].theta_for(s), [x])[0]) for s, x in zip(shapes, l_est)])
        boot = np.column_stack([_paired(self._curve_b(T, s), l_boot[:, j]) for j, s in enumerate(shapes)])
        return est, boot

    def errors(self, measured: pd.DataFrame, Ts: list[int] | None = None) -> pd.DataFrame:
        """Step-1, step-2 and chained errors on held-out models: `measured` holds their final points (the
        frame's columns; seeds of one model share a label and are averaged). Intervals hold the fit's
        bootstrap and the measurement's noise in quadrature."""
        rows = []
        for label, g in measured.groupby("label", sort=False):
            r = g.iloc[0]
            one = pd.DataFrame([{"label": label, "N": r["N"], "K": r["K"], "L": r["L"], "D": r["D"]}])
            l_est, l_boot = self.predict_loss(one)
            l_meas = float(g[self.loss_col].mean())
            l_se = float(np.sqrt((g[f"{self.loss_col}_se"] ** 2).sum()) / len(g))
            llo, lhi = q95(l_boot)
            e1 = float(l_est[0] / l_meas - 1)
            lo1 = e1 - float(np.hypot(l_est[0] - llo[0], Z95 * l_se)) / l_meas
            hi1 = e1 + float(np.hypot(lhi[0] - l_est[0], Z95 * l_se)) / l_meas
            shape = shape_of(r["K"], r["L"])
            for T in Ts or self.Ts:
                n = float(g["n_examples"].sum())
                y = float((g[f"vpr_T{T}"] * g["n_examples"]).sum() / n)
                m_se = np.sqrt(max(y * (1 - y), 0.25 / n) / n)
                cb = self._curve_b(T, shape)
                th = self.metric[T].theta_for(shape)
                two = float(curve(th, [l_meas])[0])
                two_b = curve(cb, [l_meas])[:, 0]
                chain = float(curve(th, l_est)[0])
                chain_b = _paired(cb, l_boot[:, 0])
                rows.append({"label": label, "T": T, "seeds": len(g), "loss_measured": l_meas,
                             "loss_predicted": float(l_est[0]), "step1_rel_error": e1,
                             "step1_low": lo1, "step1_high": hi1, "step1_covered": bool(lo1 <= 0 <= hi1),
                             "measured": y, **_err("step2", two, two_b, y, m_se), **_err("chained", chain, chain_b, y, m_se)})
        return pd.DataFrame(rows)


def _paired(theta_b: np.ndarray, loss_b: np.ndarray) -> np.ndarray:
    """Replicate b's curve at replicate b's loss: (B, 3), (B,) -> (B,)."""
    c, k, l0 = sig(theta_b[:, 0]), np.exp(theta_b[:, 1]), theta_b[:, 2]
    return c * sig(k * (l0 - np.asarray(loss_b, float)))


def _err(name: str, est: float, boot: np.ndarray, y: float, m_se: float) -> dict:
    lo, hi = q95(boot[:, None])
    err = est - y
    elo = err - np.hypot(est - float(lo[0]), Z95 * m_se)
    ehi = err + np.hypot(float(hi[0]) - est, Z95 * m_se)
    return {f"{name}_predicted": est, f"{name}_error_pts": 100 * err, f"{name}_err_low": 100 * elo,
            f"{name}_err_high": 100 * ehi, f"{name}_covered": bool(elo <= 0 <= ehi)}


def fit_two_step(frame: pd.DataFrame, loss_col: str = "elbo", Ts: list[int] | None = None,
                 n_boot: int = N_BOOT_TWO_STEP, seed: int = 0) -> TwoStep:
    """Fit both steps on the ladder's frame (one row per run's final point and per checkpoint; columns N, K,
    L, D, run_id, <loss_col>, <loss_col>_se, n_examples, vpr_T<T>) and bootstrap them together."""
    with one_thread():
        return _fit(frame, loss_col, Ts, n_boot, seed)


def _fit(frame: pd.DataFrame, loss_col: str, Ts: list[int] | None, n_boot: int, seed: int) -> TwoStep:
    f = frame.reset_index(drop=True)
    Ts = Ts or vpr_Ts(f)
    se_log = f[f"{loss_col}_se"].to_numpy(float) / f[loss_col].to_numpy(float)
    lf, kinfo = fit_with_kappa_if_needed(f["N"], f["L"], f["D"], f[loss_col], f["K"], se_log)
    notes = [] if lf.converged else ["step 1 did not converge from its grid of starts: read it with care"]
    if kinfo["kappa_kept"]:
        notes.append(f"a K exponent was needed (chi2 {kinfo['chi2']:.1f} -> {kinfo['chi2_kappa']:.1f})")
    Kc = f["K"] if lf.with_kappa else None
    shapes = np.array([shape_of(k, lp) for k, lp in zip(f["K"], f["L"])], object)
    n = f["n_examples"].to_numpy(float)
    metric = {T: fit_metric(T, f[loss_col], f[f"vpr_T{T}"], n, shapes) for T in Ts}
    for T, m in metric.items():
        if m.per_shape:
            notes.append(f"T = {T}: one curve does not serve every shape (likelihood ratio {m.lr_stat:.1f} on "
                         f"{m.lr_dof} dof, p = {m.lr_p:.2g}); fitted per shape")
    r1 = (np.log(lf.predict(f["N"], f["L"], f["D"], Kc)) - np.log(f[loss_col].to_numpy(float))) / se_log
    res = [{"step": 1, "T": None, "rms_z": float(np.sqrt(np.mean(r1 ** 2))), "points": len(f)}]
    for T in Ts:
        pr = pearson(metric[T], f[loss_col], f[f"vpr_T{T}"], n, shapes)
        res.append({"step": 2, "T": T, "rms_z": float(np.sqrt(np.mean(pr ** 2))), "points": len(f)})
    residuals = pd.DataFrame(res)
    for r in residuals.itertuples():
        if r.rms_z > MISFIT:
            notes.append(f"step {r.step}{'' if pd.isna(r.T) else f' at T = {int(r.T)}'}: residuals {r.rms_z:.1f} x the "
                         f"evaluation noise (above {MISFIT:g}): the law misfits the ladder")

    rng = np.random.default_rng(seed)
    runs = np.array(sorted(f["run_id"].unique()))
    rows_of = {r: np.flatnonzero(f["run_id"].to_numpy() == r) for r in runs}
    loss_b = np.empty((n_boot, 7))
    metric_b = {T: {k: np.empty((n_boot, 3)) for k in metric[T].curves} for T in Ts}
    for b in range(n_boot):
        idx = np.concatenate([rows_of[r] for r in rng.choice(runs, size=len(runs))])
        g = f.iloc[idx]
        lb = g[loss_col].to_numpy(float) + rng.standard_normal(len(g)) * g[f"{loss_col}_se"].to_numpy(float)
        lb = np.maximum(lb, 1e-6)
        fb = fit_loss(g["N"], g["L"], g["D"], lb, g["K"] if lf.with_kappa else None, with_kappa=lf.with_kappa,
                      start=lf.theta, N_ref=lf.N_ref, D_ref=lf.D_ref)
        loss_b[b] = fb.theta
        nb = g["n_examples"].to_numpy(float)
        for T in Ts:
            yb = rng.binomial(nb.astype(int), np.clip(g[f"vpr_T{T}"].to_numpy(float), 0, 1)) / nb
            mb = fit_metric(T, lb, yb, nb, shapes[idx], per_shape=metric[T].per_shape, start=metric[T])
            for k in metric_b[T]:
                metric_b[T][k][b] = mb.curves.get(k, metric[T].curves[k])
    lvals = f[loss_col].to_numpy(float)
    return TwoStep(lf, loss_b, kinfo, metric, metric_b, loss_col, residuals, (float(lvals.min()), float(lvals.max())),
                   n_boot, notes)
