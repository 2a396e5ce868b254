"""Effective parameters of recursion: what a loop is worth, in single-pass parameters.

For each family of models (equal in every training field but the size fields K, d_model, heads and
the fields that only shape the loop), the single-pass models (L = 1, at least MIN_SIZES parameter
counts) give, at each evaluated T, the metric as a function of parameters. A looped (K x L) model,
sampled at its training depth, is placed on that curve: "(1 x 3) at T = 2 performs like a
single-pass model with m x its parameters". Across L, m = L^beta (least squares of log m on log L
through the origin, since one loop is worth m = 1) gives the study's one number for what a loop is
worth here.

The fit is monotone, not a scaling law: an isotonic (pool-adjacent-violators) regression of the
metric on log(parameters), joined by straight lines between the fitted sizes. A CPU study has three
to five single-pass sizes and rates that saturate near 0 or 1, where a power law in parameters
does not hold and would extrapolate with confidence it does not have; the monotone fit only assumes
that more parameters do not hurt, and it cannot answer outside the range of sizes trained, so a
looped model beyond it is reported as "above the largest single-pass model" (or below the smallest)
with the bound on m, never extrapolated. Where the fitted curve is flat (equal rates of two sizes),
a value on the flat part is matched to the smallest size that reaches it (the smaller m: the
conservative claim for recursion).

Intervals are a bootstrap (N_BOOT replicates, fixed seed) over both sources of noise: seeds (the
runs of a model resampled with replacement, the same draw at every T) and evaluation examples (the
per-example scores of the samples table resampled when it holds every example of the point, else a
binomial draw from value and n_examples for rates, else a normal draw from the stored interval).
Every model, single-pass ones included, is resampled, the curve refitted and m recomputed in each
replicate; the interval is the 2.5% and 97.5% quantiles (no interpolation, so an open end, a
replicate beyond the single-pass range, reads as inf or 0). beta's interval comes from the same
replicates, over the points that are in range in both the estimate and the replicate.
"""
from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow.compute as pc

import tasks
from analysis.load import MissingData, StudyData
from analysis.tables import (DEFAULT_SPLIT, LOOP_ONLY_FIELDS, by_variant, differing, fmt_params, model_fields,
                             shape_label)
from stats import Z95
from store import index, is_safe_name

# fields that make a model of one family bigger or smaller; with LOOP_ONLY_FIELDS and the loop count,
# the only ones a family's models may differ in
SIZE_FIELDS = ("model.K", "model.d_model", "model.n_heads")
LOOP_FIELDS = {"model.L", "model.checkpoint_loops", *LOOP_ONLY_FIELDS}
MIN_SIZES = 3
N_BOOT = 1000
ABOVE, BELOW, IN_RANGE = "above the largest single-pass model", "below the smallest single-pass model", "in range"


@dataclass
class Effective:
    table: pd.DataFrame  # one row per looped model and T: value, m with its interval, where it falls
    curves: pd.DataFrame  # the single-pass points and the monotone fit at each T
    beta: pd.DataFrame  # per family: m = L^beta, over all T ('all') and at each T
    skipped: list[str]  # families / T left out, with why


def family_core(key: str) -> str:
    """A model's identity without its size and its loop: the models of one family share it."""
    fields = model_fields(key)
    return json.dumps({f: v for f, v in fields.items() if f not in SIZE_FIELDS and f not in LOOP_FIELDS},
                      sort_keys=True, default=str)


# ---- the monotone fit --------------------------------------------------------------------------------
def isotonic(y: np.ndarray) -> np.ndarray:
    """Non-decreasing least-squares fit of y (in the order given): pool adjacent violators."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in y:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return np.concatenate([np.full(int(c), s / c) for s, c in blocks])


def isotonic_columns(Y: np.ndarray) -> np.ndarray:
    """isotonic() of every column of Y (sizes, replicates) at once: the fit at i is
    max over j <= i of min over k >= i of mean(y[j..k]), exact for equal weights (as PAV)."""
    n = Y.shape[0]
    S = np.concatenate([np.zeros((1, *Y.shape[1:])), np.cumsum(Y, axis=0)])
    j, k = np.arange(n)[:, None], np.arange(n)[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        M = (S[1:][None, :, ...] - S[:-1][:, None, ...]) / np.where(k >= j, k - j + 1, 1)[..., None]
    M = np.where((k >= j)[..., None], M, np.inf)  # mean(y[j..k]) for j <= k
    return np.stack([M[:i + 1, i:].min(axis=1).max(axis=0) for i in range(n)])


def invert_columns(x: np.ndarray, F: np.ndarray, v: np.ndarray) -> np.ndarray:
    """invert(x, F[:, b], v[b]) for every replicate b at once."""
    out = np.full(v.shape, np.nan)
    fin = np.isfinite(v)
    above, below = fin & (v > F[-1]), fin & (v < F[0])
    out[above], out[below] = math.inf, -math.inf
    mid = fin & ~above & ~below
    if mid.any():
        Fm, vm = F[:, mid], v[mid]
        i = np.argmax(Fm >= vm, axis=0)
        cols = np.arange(vm.size)
        lo = np.maximum(i - 1, 0)
        f0, f1 = Fm[lo, cols], Fm[i, cols]
        with np.errstate(invalid="ignore", divide="ignore"):
            interp = x[lo] + (vm - f0) / (f1 - f0) * (x[i] - x[lo])
        out[mid] = np.where(i == 0, x[0], interp)
    return out


def invert(x: np.ndarray, fit: np.ndarray, v: float) -> float:
    """The smallest x at which the piecewise-linear non-decreasing curve (x, fit) reaches v;
    +inf above its top, -inf below its bottom (never extrapolated); nan for a value that is not finite."""
    return float(invert_columns(x, np.asarray(fit, float)[:, None], np.array([v], float))[0])


def beta_fit(L: np.ndarray, m: np.ndarray) -> float:
    """Least squares of log m on log L through the origin (m = L^beta, so one loop is worth m = 1)."""
    x, y = np.log(np.asarray(L, float)), np.log(np.asarray(m, float))
    ok = np.isfinite(y) & (x > 0)
    if not ok.any():
        return float("nan")
    return float((x[ok] * y[ok]).sum() / (x[ok] ** 2).sum())


def _quantiles(a: np.ndarray) -> tuple[float, float]:
    a = a[~np.isnan(a)]
    if a.size == 0:
        return (float("nan"), float("nan"))
    lo, hi = np.quantile(a, [0.025, 0.975], method="inverted_cdf")
    return float(lo), float(hi)


# ---- resampling ------------------------------------------------------------------------------------
def example_scores(data: StudyData, run_id: str, eval_key: str, metric: str, n: int, cache: dict) -> np.ndarray | None:
    """The per-example scores of one evaluation when the samples table keeps every example, else None."""
    if data.store is None or not _may_hold_every_example(data, run_id, n, cache):
        return None
    s = _samples_of(data.store, run_id, eval_key, cache)
    if s.empty:
        return None
    s = s[s["eval_key"] == eval_key]
    if len(s) != n or set(s["example"]) != set(range(n)):
        return None
    got = [json.loads(x).get(metric) if isinstance(x, str) else None for x in s.sort_values("example")["scores"]]
    return None if any(v is None for v in got) else np.array(got, dtype=float)


SAMPLE_COLS = ["run_id", "eval_key", "example", "scores"]


KEPT = ("n_samples_kept",)  # the key of a score cache's run_id -> eval.n_samples_kept (a tuple: never a run id)


def _may_hold_every_example(data: StudyData, run_id: str, n: int, cache: dict) -> bool:
    """False when the run's stored config says its samples table keeps fewer than n examples per point
    (eval.n_samples_kept, parsed once per cache for every run): no file to read."""
    if KEPT not in cache:
        kept = cache[KEPT] = {}
        for rid, cfg in zip(data.runs["run_id"], data.runs["config"]):
            try:
                kept[rid] = int(json.loads(cfg)["eval"]["n_samples_kept"])
            except (TypeError, ValueError, KeyError):
                pass
    return cache[KEPT].get(run_id, n) >= n


def prefetch_scores(data: StudyData, rows: pd.DataFrame, cache: dict) -> None:
    """Read the samples of `rows` into `cache` in parallel (a round trip per file on an object store):
    one task per run, so no file is read twice; none of a run whose samples cannot hold every example."""
    if data.store is None or rows.empty:
        return
    by_run: dict[str, list[str]] = {}
    for run_id, key, n in dict.fromkeys(zip(rows["run_id"], rows["eval_key"], rows["n_examples"])):
        if _may_hold_every_example(data, run_id, int(n), cache):
            by_run.setdefault(run_id, []).append(key)
    if not by_run:
        return

    def one(item) -> None:
        for key in item[1]:
            _samples_of(data.store, item[0], key, cache)

    with ThreadPoolExecutor(index.workers(data.store)) as pool:
        list(pool.map(one, by_run.items()))


def _samples_of(store, run_id: str, eval_key: str, cache: dict) -> pd.DataFrame:
    """The samples rows of one evaluation (SAMPLE_COLS), from its file samples/<run_id>/<eval_key>.parquet
    (one read per point used, not every point of the run); none where that is missing or no store name."""
    if (run_id, eval_key) not in cache:
        t = None
        if is_safe_name(run_id) and is_safe_name(f"{eval_key}.parquet"):
            t = store.read_file("samples", run_id, f"{eval_key}.parquet")
        cache[(run_id, eval_key)] = pd.DataFrame(columns=SAMPLE_COLS) if t is None else \
            t.filter(pc.equal(t["run_id"], run_id)).select(SAMPLE_COLS).to_pandas()
    return cache[(run_id, eval_key)]


def resample_run(row: dict, scores: np.ndarray | None, metric: str, rng: np.random.Generator, B: int) -> np.ndarray:
    """B bootstrap values of one run's evaluation: over its examples."""
    n = int(row["n_examples"])
    if scores is not None:
        return scores[rng.integers(0, n, size=(B, n))].mean(axis=1)
    if tasks.is_rate(metric) and n > 0:
        p = min(max(float(row["value"]), 0.0), 1.0)
        return rng.binomial(n, p, size=B) / n
    lo, hi = row.get("ci_low"), row.get("ci_high")
    se = (hi - lo) / (2 * Z95) if lo is not None and hi is not None and np.isfinite(lo) and np.isfinite(hi) else 0.0
    return float(row["value"]) + se * rng.standard_normal(B)


def resample_runs(rows: list[dict], scores: list, metric: str, rng: np.random.Generator, B: int) -> np.ndarray:
    """resample_run of each row in turn, stacked (runs, B). Where every row is a rate without per-example
    scores (what a sweep that keeps fewer samples than it evaluates has), one binomial draw of shape
    (runs, B): numpy draws it element by element in that order, so the values are those of the loop
    (the same generator states), at a fraction of the cost of 100,000 calls for a 10,000-run study."""
    ns = np.array([int(r["n_examples"]) for r in rows])
    if tasks.is_rate(metric) and (ns > 0).all() and all(s is None for s in scores):
        ps = np.clip(np.array([float(r["value"]) for r in rows]), 0.0, 1.0)
        return rng.binomial(ns[:, None], ps[:, None], size=(len(rows), B)) / ns[:, None]
    return np.stack([resample_run(r, s, metric, rng, B) for r, s in zip(rows, scores)])


# ---- the analysis ----------------------------------------------------------------------------------
def _rows(data: StudyData, split: str) -> list[tuple[str, str, str, pd.DataFrame]]:
    """(variant, metric, sampler, evals rows of that metric) per task variant: one split, one sampler,
    each model at its training depth (L_s = L_t)."""
    out = []
    for variant, metric, d in by_variant(data.evals, "effective-params", split):
        d = d[d["L_s"] == d["L_t"]]
        if not d.empty:
            cores = {k: family_core(k) for k in d["model_key"].unique()}  # once per model, not per row
            out.append((variant, metric, d["sampler"].iloc[0], d.assign(_family=d["model_key"].map(cores))))
    return out


def _describe(sizes: pd.DataFrame) -> str:
    return ", ".join(f"({r.K} x 1) d={r.d_model} {fmt_params(r.n_params)}" for r in
                     sizes.drop_duplicates("model_key").sort_values("n_params").itertuples())


def effective_params(data: StudyData, split: str = DEFAULT_SPLIT, n_boot: int = N_BOOT,
                     seed: int = 0) -> Effective:
    """m (and its interval) for every looped model at every T with MIN_SIZES single-pass sizes of its
    family, and beta per family. MissingData, naming what each family has, when no family qualifies."""
    rng = np.random.default_rng(seed)
    table, curves, betas, skipped, reasons = [], [], [], [], []
    cache: dict = {}
    for variant, metric, sampler, d in _rows(data, split):
        sign = -1.0 if tasks.lower_is_better(metric) else 1.0  # fit a non-decreasing curve of sign * metric
        families = list(d.groupby("_family"))
        fam_names = differing([g["model_key"].iloc[0] for _, g in families], (*SIZE_FIELDS, *LOOP_FIELDS)) \
            if len(families) > 1 else {}
        for core, g in families:
            fam = fam_names.get(g["model_key"].iloc[0], "")
            where = f"{variant}{' ' + fam if fam else ''}"
            single, looped = g[g["L_t"] == 1], g[g["L_t"] > 1]
            n_sizes = single["n_params"].nunique()
            if n_sizes < MIN_SIZES:
                reasons.append(f"{where}: {n_sizes} single-pass size{'s' if n_sizes != 1 else ''}"
                               f"{' (' + _describe(single) + ')' if n_sizes else ''}")
                continue
            if looped.empty:
                reasons.append(f"{where}: no looped model (L > 1) evaluated at L_s = L_t")
                continue
            res = _family(data, variant, metric, sampler, sign, single, looped, rng, n_boot, cache, fam)
            if res is None:
                reasons.append(f"{where}: no T at which {MIN_SIZES} single-pass sizes and a looped model are "
                               "all evaluated")
                continue
            t, c, b, sk = res
            table.append(t)
            curves.append(c)
            betas.append(b)
            skipped += [f"{where}: {s}" for s in sk]
    if not table:
        raise MissingData(f"effective-params needs, in one family of models (equal but for K, d_model, heads and "
                          f"the loop), at least {MIN_SIZES} single-pass (L = 1) sizes and a looped model (L > 1), "
                          f"evaluated at one T on split {split!r}; have: " + "; ".join(reasons))
    return Effective(pd.concat(table, ignore_index=True), pd.concat(curves, ignore_index=True),
                     pd.concat(betas, ignore_index=True), skipped + [f"not fitted: {r}" for r in reasons])


def _family(data, variant, metric, sampler, sign, single, looped, rng, B, cache, fam):
    keys = list(dict.fromkeys([*single["model_key"], *looped["model_key"]]))
    rows = pd.concat([single, looped])
    # per model: its runs, and one uniform draw per (replicate, seed slot) shared by every T, so a
    # replicate resamples the same seeds at every T
    runs = {k: sorted(rows.loc[rows["model_key"] == k, "run_id"].unique()) for k in keys}
    seed_u = {k: rng.random((B, len(runs[k]))) for k in keys}
    Ts = sorted(set(single["T"]) & set(looped["T"]))
    prefetch_scores(data, rows[rows["T"].isin(Ts)], cache)
    names = differing(looped["model_key"].unique(), ("model.K", "model.L"))
    info = {k: rows[rows["model_key"] == k].iloc[0] for k in keys}

    by_point: dict[tuple, list[dict]] = {}  # (model, T) -> its runs' rows, only the fields `value` reads
    for k, T, rid, ek, n, v in zip(*(rows[c].to_numpy() for c in
                                     ("model_key", "T", "run_id", "eval_key", "n_examples", "value"))):
        by_point.setdefault((k, T), []).append({"run_id": rid, "eval_key": ek, "n_examples": n, "value": v})

    def value(k: str, T: int) -> tuple[float, np.ndarray] | None:
        recs = by_point.get((k, T))
        if not recs:
            return None
        scores = [example_scores(data, x["run_id"], x["eval_key"], metric, int(x["n_examples"]), cache)
                  for x in recs]
        boots = resample_runs(recs, scores, metric, rng, B)  # (runs, B)
        idx = np.floor(seed_u[k][:, :len(recs)] * len(recs)).astype(int)  # (B, runs) seeds drawn
        return float(np.mean([x["value"] for x in recs])), boots[idx, np.arange(B)[:, None]].mean(axis=1)

    table, curves, skipped = [], [], []
    logm_boot: dict[tuple, np.ndarray] = {}
    for T in Ts:
        sizes = {}
        for k in single["model_key"].unique():
            v = value(k, T)
            if v is not None:
                sizes.setdefault(int(info[k]["n_params"]), []).append(v)
        if len(sizes) < MIN_SIZES:
            skipped.append(f"T = {T}: {len(sizes)} single-pass sizes evaluated (needs {MIN_SIZES})")
            continue
        P = np.array(sorted(sizes))
        x = np.log(P)
        # two models of one parameter count: one point, their mean
        y = np.array([np.mean([v for v, _ in sizes[p]]) for p in P])
        yb = np.stack([np.mean([b for _, b in sizes[p]], axis=0) for p in P])  # (sizes, B)
        fit = isotonic(sign * y)
        fits_b = isotonic_columns(sign * yb)  # (sizes, B)
        for p, yy, f in zip(P, y, fit):
            curves.append({"task_variant": variant, "family": fam, "metric": metric, "T": T, "n_params": int(p),
                           "value": yy, "fit": sign * f})
        for k in looped["model_key"].unique():
            v = value(k, T)
            if v is None:
                continue
            val, vb = v
            r = info[k]
            logp = math.log(int(r["n_params"]))
            xs = invert(x, fit, sign * val)
            xb = invert_columns(x, fits_b, sign * vb)
            lo, hi = _quantiles(xb - logp)
            inside = np.isfinite(xs)
            logm_boot[(k, T)] = np.where(np.isfinite(xb), xb - logp, np.nan) if inside else None
            label = shape_label(r["K"], r["L_t"], names.get(k))
            where = IN_RANGE if inside else (ABOVE if xs > 0 else BELOW)
            bound = P[-1] if xs == math.inf else P[0]
            note = "" if inside else (f"m {'>' if xs > 0 else '<'} {bound / math.exp(logp):.3g} (the "
                                      f"{'largest' if xs > 0 else 'smallest'} single-pass model); not extrapolated")
            table.append({"task_variant": variant, "family": fam, "model": label, "K": int(r["K"]),
                          "L": int(r["L_t"]), "T": int(T), "metric": metric, "sampler": sampler,
                          "n_params": int(r["n_params"]), "seeds": len(runs[k]), "value": val,
                          "single_min": float(y.min()), "single_max": float(y.max()),
                          "m": math.exp(xs - logp) if inside else float("nan"),
                          "m_low": float(np.exp(lo)), "m_high": float(np.exp(hi)),  # 0 / inf: open ends
                          "equiv_params": math.exp(xs) if inside else float("nan"), "where": where, "note": note,
                          "model_key": k})
    if not table:
        return None
    t = pd.DataFrame(table)
    return t, pd.DataFrame(curves), _betas(t, logm_boot, variant, fam, B), skipped


def _betas(t: pd.DataFrame, logm_boot: dict, variant: str, fam: str, B: int) -> pd.DataFrame:
    """m = L^beta over every in-range point of the family ('all') and at each T, with bootstrap intervals."""
    out = []
    for T, g in [("all", t), *((int(T), gt) for T, gt in t.groupby("T"))]:
        ok = g[g["where"] == IN_RANGE]
        row = {"task_variant": variant, "family": fam, "T": str(T), "points": len(ok),
               "out_of_range": int((g["where"] != IN_RANGE).sum()), "L_values": ", ".join(map(str, sorted(set(ok["L"])))),
               "beta": float("nan"), "beta_low": float("nan"), "beta_high": float("nan"), "m_at_L2": float("nan")}
        if len(ok):
            L = ok["L"].to_numpy(float)
            row["beta"] = beta_fit(L, ok["m"].to_numpy(float))
            logm = np.stack([logm_boot[(k, int(T_))] for k, T_ in zip(ok["model_key"], ok["T"])])  # (points, B)
            xl = np.log(L)[:, None]
            ok_b = np.isfinite(logm)
            num = np.where(ok_b, xl * np.nan_to_num(logm), 0.0).sum(axis=0)
            den = np.where(ok_b, xl ** 2, 0.0).sum(axis=0)
            bb = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
            row["beta_low"], row["beta_high"] = _quantiles(bb)
            row["m_at_L2"] = 2.0 ** row["beta"]
        out.append(row)
    return pd.DataFrame(out)


def effective_tables(eff: Effective) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The report's two tables: per looped model and T, and beta per family."""
    cols = ["task_variant", "family", "model", "T", "metric", "n_params", "seeds", "value", "single_min",
            "single_max", "m", "m_low", "m_high", "equiv_params", "where", "note"]
    t = eff.table.sort_values(["task_variant", "family", "L", "K", "model", "T"])[cols].reset_index(drop=True)
    return t, eff.beta.copy()

