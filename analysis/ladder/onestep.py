"""The one-step law fitted on a study (analysis.ladder.law has the law itself): the ladder's runs and
evaluations, the held-out models, the bootstrap over runs and examples, and the residuals."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

import tasks
from analysis.effective import example_scores, prefetch_scores, resample_run
from analysis.ladder.law import (AXIS_FIELDS, DELTA, LAWS, LOOSE, MIN_MODELS, N_BOOT, PREREGISTERED, Form, Ladder,
                                 LadderError, covariates, fit_law, q95, shape_of)
from analysis.load import StudyData
from analysis.tables import DEFAULT_SPLIT, differing, model_fields, primary_metric
from stats import wilson


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
        lo, hi = q95(thb[okb, 2][:, None]) if okb.any() else ([np.nan], [np.nan])
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


def _models(ev: pd.DataFrame, held: set[str], D_of: dict) -> pd.DataFrame:
    rows = []
    for k, g in ev.groupby("model_key", sort=False):
        r = g.iloc[0]
        rows.append({"model_key": k, "label": f"{shape_of(r['K'], r['L_t'])} d={int(r['d_model'])}", "K": int(r["K"]),
                     "L": int(r["L_t"]), "d_model": int(r["d_model"]), "N": int(r["n_params_non_embedding"]),
                     "n_params": int(r["n_params"]), "D": D_of[r["run_id"]],
                     "role": "held out" if k in held else "ladder", "seeds": g["run_id"].nunique(),
                     "run_ids": sorted(g["run_id"].unique())})
    return pd.DataFrame(rows).sort_values(["role", "N", "L"]).reset_index(drop=True)


def _params(m: Ladder) -> pd.DataFrame:
    nT = len(m.Ts)
    rows = []

    def add(name, T, est, boot, meaning):
        lo, hi = q95(boot[:, None])
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
            plo, phi = q95(boot)
            mlo, mhi = q95(meas_b[:, None])
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


