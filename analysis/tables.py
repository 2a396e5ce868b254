"""Pure computations behind the figures: intervals, seed aggregation, threshold crossings,
Pareto fronts, iso-FLOP pairs, cross-depth matrices. DataFrames in, DataFrames out; no drawing,
no files, so each is tested on hand-made tables.
"""
from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

import tasks
from analysis.load import MODEL_KEYS, MissingData
from stats import SEED_METHOD, learned_share, seed_interval, wilson  # noqa: F401 (wilson: tests check the one copy)

# the split every figure and table reads unless told otherwise (never several at once)
DEFAULT_SPLIT = "test"
# model fields a (K x L) label already says
SHAPE_FIELDS = ("model.K", "model.L")
# fields that only shape the loop (L > 1): an iso-FLOP (KL x 1) partner need not match them
LOOP_ONLY_FIELDS = {"train.loss", "train.schedule", "train.loss_weights", "train.truncate_k", "train.min_depth",
                    "model.step_emb", "model.reinject_input"}
# what identifies an evaluation point of a model
POINT_KEYS = ["T", "L_s", "sampler", "split", "metric"]
# metrics scored 0/1 per example, whose intervals are binomial (Wilson) from the evaluation size


def model_fields(key: str) -> dict:
    """The training fields of a model (analysis.load.model_key) as a dict."""
    return json.loads(key)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def differing(keys: Iterable[str], shown: Iterable[str] = SHAPE_FIELDS) -> dict[str, str]:
    """For models shown together: each model_key -> 'field=value, ...' naming the training fields whose
    values differ between them (a field one model lacks counts as None), apart from `shown` (what the
    label already says). '' for every model when nothing else differs. A field is named by its last
    part (truncate_k) unless two differing fields share it (task.seed, train.seed)."""
    keys = list(dict.fromkeys(keys))
    fields = {k: model_fields(k) for k in keys}
    names = sorted({f for d in fields.values() for f in d} - set(shown))
    vary = [f for f in names if len({json.dumps(d.get(f), sort_keys=True, default=str) for d in fields.values()}) > 1]
    short = {f: f.rsplit(".", 1)[-1] for f in vary}
    clash = {n for n in short.values() if list(short.values()).count(n) > 1}
    label = {f: f if short[f] in clash else short[f] for f in vary}
    return {k: ", ".join(f"{label[f]}={_fmt(fields[k].get(f))}" for f in vary) for k in keys}


def shape_label(K, L, extra: str | None = "") -> str:
    """A model's shape as the figures and tables name it: '(K x L)', then `extra` (what else tells it apart)."""
    return f"({K} x {L})" + (f" {extra}" if extra else "")


def fmt_params(n: float) -> str:
    """10_600_000 -> '10.6M', 150_000 -> '150k', 150 -> '150'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{int(n)}"


def one_split(d: pd.DataFrame, what: str) -> None:
    """Refuse rows from more than one split: a figure never averages test and validation numbers."""
    if "split" in d and d["split"].nunique() > 1:
        raise ValueError(f"{what} was given rows from several splits ({sorted(d['split'].unique())}); "
                         "select one split first")


def task_of(rows: pd.DataFrame) -> str | None:
    """The one task of `rows` (whose declaration of a metric name applies: each task names its metrics in a
    namespace of its own), None for rows of several tasks or none."""
    have = rows["task"].dropna().unique() if "task" in rows.columns else []
    return str(have[0]) if len(have) == 1 else None


def primary_metric(task: str, available) -> str:
    """The task's headline metric if present, else the first registered task's headline present."""
    try:
        return tasks.primary_metric(task, available)
    except LookupError as e:
        raise MissingData(str(e)) from None


def aggregate(evals: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, eval point, metric), seeds aggregated; each run holds one row per point
    (analysis.load.dedupe_evals), else ValueError: two evaluations of one run are never averaged.
    Columns: docs/guide/schema.md (Aggregates, s.table()); the intervals (stats.seed_interval, never
    pooling seeds x examples as independent trials): docs/guide/statistics.md. The value always lies
    inside its interval.
    """
    if evals.empty:
        return evals.assign(n_seeds=[], seed_sd=[], seed_min=[], seed_max=[], k=[], ci_method=[], learned=[],
                            learned_low=[], learned_high=[])
    keys = [c for c in MODEL_KEYS + POINT_KEYS if c in evals.columns]
    per_run = keys + ["run_id"]
    twice = evals[evals.duplicated(["run_id", *POINT_KEYS], keep=False)]
    if len(twice):
        r = twice.iloc[0]
        raise ValueError(f"run {r['run_id']} has {int((twice['run_id'] == r['run_id']).sum())} evals rows at one "
                         f"point (T={r['T']}, L_s={r['L_s']}, {r['sampler']}, {r['split']}, {r['metric']}); "
                         "keep one per point first (analysis.load.dedupe_evals, as load_study does)")
    # one value per run and point first (rows are unique per run and point: this only collapses the keys)
    runs = evals.groupby(per_run, as_index=False, dropna=False).agg(
        value=("value", "mean"), n_examples=("n_examples", "max"), ci_low=("ci_low", "mean"),
        ci_high=("ci_high", "mean"), n_params=("n_params", "first"),
        n_params_non_embedding=("n_params_non_embedding", "first"), flops_per_forward=("flops_per_forward", "first"),
        forward_passes=("forward_passes", "mean"), forward_passes_mean=("forward_passes_mean", "mean"))
    # tasks.is_rate and the declared bounds looked up once per (metric, task), not once per row (40,000 rows at
    # 1,000 runs, a handful of pairs)
    is_rate, bounds = functools.cache(tasks.is_rate), functools.cache(lambda m, t: tasks.metric(m, t).bounds)
    rate = [is_rate(m, t) for m, t in zip(runs["metric"], runs["task"] if "task" in runs else [None] * len(runs))]
    runs["k"] = np.where(np.array(rate, dtype=bool), (runs["value"] * runs["n_examples"]).round(), np.nan)
    g = runs.groupby(keys, as_index=False, dropna=False).agg(
        value=("value", "mean"), n_seeds=("run_id", "nunique"), seed_sd=("value", "std"), seed_min=("value", "min"),
        seed_max=("value", "max"), n_examples=("n_examples", "sum"), k=("k", "sum"), ci_low=("ci_low", "mean"),
        ci_high=("ci_high", "mean"), n_params=("n_params", "first"),
        n_params_non_embedding=("n_params_non_embedding", "first"), flops_per_forward=("flops_per_forward", "first"),
        forward_passes=("forward_passes", "mean"), forward_passes_mean=("forward_passes_mean", "mean"))
    g["seed_sd"] = g["seed_sd"].fillna(0.0)
    # the per-seed values and evaluation intervals of each aggregated row, in the groupby's order, cut from
    # one stable sort of the runs by group (a DataFrame per group costs a second at 1,000 runs)
    ids = runs.groupby(keys, dropna=False, sort=True).ngroup().to_numpy()
    order = np.argsort(ids, kind="stable")
    ends = np.cumsum(np.bincount(ids, minlength=len(g))).tolist()
    cols = [runs[c].take(order).tolist() for c in ("value", "n_examples", "ci_low", "ci_high")]
    lo, hi, how, learned = [], [], [], []
    for i, (metric, task) in enumerate(zip(g["metric"], g["task"] if "task" in g else [None] * len(g))):
        start = ends[i - 1] if i else 0
        v, n, el, eh = (c[start:ends[i]] for c in cols)
        rate = is_rate(metric, task)
        a, b, m = seed_interval(v, rate, n, el, eh, bounds=bounds(metric, task))
        lo.append(a)
        hi.append(b)
        how.append(SEED_METHOD[m])
        k, q_lo, q_hi = learned_share(v) if rate else (None, math.nan, math.nan)
        learned.append((f"{k}/{len(v)}" if rate else "", q_lo, q_hi))
    g["ci_method"] = how
    g["ci_low"], g["ci_high"] = lo, hi
    g["learned"], g["learned_low"], g["learned_high"] = zip(*learned) if learned else ([], [], [])
    # forward passes per example as stored (the sampler stops early once nothing is masked); a null mean
    # (adaptive depth: what it spent) is unknown, samples without a per-example cost: the most any example ran
    g["forward_passes_mean"] = g["forward_passes_mean"].fillna(g["forward_passes"])
    return g


def select(agg: pd.DataFrame, metric: str | None = None, sampler: str | None = None,
           split: str = DEFAULT_SPLIT) -> pd.DataFrame:
    """Rows of one metric, one sampler (default: confidence, else the commonest) and one split (default:
    test; rows of any other split are left out, never averaged in)."""
    d = agg
    if metric is not None:
        d = d[d["metric"] == metric]
    if d.empty:
        return d
    if sampler is None:
        sampler = "confidence" if (d["sampler"] == "confidence").any() else d["sampler"].mode().iloc[0]
    d = d[d["sampler"] == sampler]
    return d[d["split"] == split]


def split_rows(rows: pd.DataFrame, what: str, split: str) -> pd.DataFrame:
    """The rows (evals or aggregated) of one split; MissingData naming the splits present if none."""
    if rows.empty:
        raise MissingData(f"{what} needs evaluations: the study has no evals rows")
    if not (rows["split"] == split).any():
        raise MissingData(f"{what}: no evaluations on split {split!r} (splits present: "
                          f"{', '.join(sorted(map(str, rows['split'].unique())))})")
    return rows[rows["split"] == split]


def by_variant(rows: pd.DataFrame, what: str, split: str = DEFAULT_SPLIT) -> list[tuple]:
    """(task variant, its primary metric, its rows of that metric on `split` of the sampler select picks),
    variants with data only."""
    out = []
    for variant, g in split_rows(rows, what, split).groupby("task_variant"):
        metric = primary_metric(g["task"].iloc[0], g["metric"].unique())
        d = select(g, metric, split=split)
        if not d.empty:
            out.append((variant, metric, d))
    return out


def threshold_crossings(agg: pd.DataFrame, threshold: float, metric: str, x: str = "T",
                        split: str = DEFAULT_SPLIT) -> pd.DataFrame:
    """Per model: the smallest x (T at L_s = L_t, or forward passes T*L_s over every L_s) whose
    seed-mean metric reaches `threshold` (>=, or <= for lower-is-better metrics); NaN when never.

    Columns: the model keys, n_params, crossing (x or NaN), reached, T and L_s at the crossing,
    value at the crossing, best (the best value seen) and points (how many were evaluated).
    """
    if x not in ("T", "forward_passes"):
        raise ValueError(f"x must be 'T' or 'forward_passes', got {x!r}")
    d = select(agg, metric, split=split)
    if x == "T":
        d = d[d["L_s"] == d["L_t"]]
    lower = tasks.lower_is_better(metric, task_of(d))
    rows = []
    keys = [c for c in MODEL_KEYS if c in d.columns]
    for key, g in d.groupby(keys, dropna=False):
        ok = g[g["value"] <= threshold] if lower else g[g["value"] >= threshold]
        row = dict(zip(keys, key))
        row.update(n_params=int(g["n_params"].iloc[0]), points=len(g),
                   best=float(g["value"].min() if lower else g["value"].max()))
        if ok.empty:
            row.update(crossing=np.nan, reached=False, T=np.nan, L_s=np.nan, value=np.nan)
        else:
            # ties on x (same T*L_s from two (T, L_s)): take the better value
            first = ok.sort_values([x, "value"], ascending=[True, lower]).iloc[0]
            row.update(crossing=float(first[x]), reached=True, T=int(first["T"]), L_s=int(first["L_s"]),
                       value=float(first["value"]))
        rows.append(row)
    cols = keys + ["n_params", "crossing", "reached", "T", "L_s", "value", "best", "points"]
    return pd.DataFrame(rows, columns=cols)


def pareto_front(df: pd.DataFrame, x: str = "n_params", y: str = "crossing") -> pd.Series:
    """Boolean mask of the non-dominated rows when both x and y are minimised (NaN rows: never on it).

    A row is dominated if another row is <= on both and < on at least one.
    """
    xs, ys = df[x].to_numpy(dtype=float), df[y].to_numpy(dtype=float)
    # [i, j]: row j dominates row i (a NaN compares false: a row with one never dominates)
    dominated = ((xs[None, :] <= xs[:, None]) & (ys[None, :] <= ys[:, None])
                 & ((xs[None, :] < xs[:, None]) | (ys[None, :] < ys[:, None]))).any(axis=1)
    return pd.Series((df[x].notna() & df[y].notna()).to_numpy() & ~dominated, index=df.index, name="pareto")


def models(runs: pd.DataFrame) -> pd.DataFrame:
    """Distinct models of a runs table (seeds collapsed), with their seed count."""
    keys = [c for c in MODEL_KEYS if c in runs.columns]
    return runs.groupby(keys, as_index=False, dropna=False).agg(
        n_params=("n_params", "first"), n_params_non_embedding=("n_params_non_embedding", "first"),
        flops_per_forward=("flops_per_forward", "first"), seeds=("seed", "nunique"))


def loop_free(key: str) -> str:
    """A model's training fields but its shape and those that only shape the loop (LOOP_ONLY_FIELDS): what
    a recursive model and its single-pass partner share."""
    return json.dumps({f: v for f, v in model_fields(key).items()
                       if f not in LOOP_ONLY_FIELDS and f not in SHAPE_FIELDS}, sort_keys=True)


def single_pass(m: pd.DataFrame) -> dict[tuple, list]:
    """(K, loop_free) -> the single-pass models (L = 1) of a models table with them, in table order."""
    partners: dict[tuple, list] = {}
    for s in m[m["L_t"] == 1].itertuples(index=False):
        partners.setdefault((s.K, loop_free(s.model_key)), []).append(s)
    return partners


def iso_flop_pairs(runs: pd.DataFrame) -> pd.DataFrame:
    """Each recursive (K x L), L > 1, with its single-pass (KL x 1) partner: K' = K * L and every other
    training field equal, apart from those that only shape the loop (LOOP_ONLY_FIELDS: loss over loops,
    depth schedule, step embedding...). A model without a partner in the table is not listed; one with
    several gets a row per partner. `differs` names the fields that tell the listed recursive models apart.
    A model whose FLOPs were not recorded (flops_per_forward null) is in no pair.
    """
    m = models(runs)
    m = m[m["flops_per_forward"].notna()]
    rec, partners = m[m["L_t"] > 1], single_pass(m)
    names = differing(rec["model_key"])
    rows = []
    for r in rec.itertuples(index=False):
        for s in partners.get((r.K * r.L_t, loop_free(r.model_key)), []):
            rows.append({"task_variant": r.task_variant, "d_model": r.d_model, "K": r.K, "L": r.L_t,
                         "KL": r.K * r.L_t, "schedule": r.schedule, "loss": r.loss, "differs": names[r.model_key],
                         "params_recursive": int(r.n_params), "params_single": int(s.n_params),
                         "param_ratio": s.n_params / r.n_params,
                         "flops_recursive": int(r.flops_per_forward), "flops_single": int(s.flops_per_forward),
                         "key_recursive": r.model_key, "key_single": s.model_key})
    cols = ["task_variant", "d_model", "K", "L", "KL", "schedule", "loss", "differs", "params_recursive",
            "params_single", "param_ratio", "flops_recursive", "flops_single", "key_recursive", "key_single"]
    return pd.DataFrame(rows, columns=cols).sort_values(["task_variant", "KL", "K"]).reset_index(drop=True)


def family_key(key: str) -> str:
    """A model's identity without its depth L: the models of one cross-depth family share it."""
    return json.dumps({f: v for f, v in model_fields(key).items() if f != "model.L"}, sort_keys=True)


def heatmap_matrix(agg: pd.DataFrame, T: int, metric: str, split: str = DEFAULT_SPLIT) -> pd.DataFrame:
    """Seed-mean metric at denoising steps T, rows = training depth L_t, columns = sampling depth L_s
    (one model family: rows of models equal in everything but L, see family_key). Missing cells: NaN.
    """
    d = select(agg, metric, split=split)
    d = d[d["T"] == T]
    if d.empty:
        raise MissingData(f"no {metric} evaluations at T = {T}")
    if "model_key" in d and d.duplicated(["L_t", "L_s"]).any():
        raise ValueError("heatmap_matrix was given several models at one (L_t, L_s): pass one family "
                         "(family_key), so no cell averages two models")
    return d.pivot_table(index="L_t", columns="L_s", values="value", aggfunc="mean").sort_index().sort_index(axis=1)


def _likelihood_unit(task: str, metric: str) -> str:
    """The table's column of a likelihood task's metric, from the task's own declaration (Metric.likelihood):
    'nll' for the bound in nats (likelihood 1.0), 'bpc' in bits (ln 2), whatever the task names them; any
    other metric keeps its name (and is not the table's)."""
    m = tasks.TASKS[task][1].metric_of(metric)
    if m is not None and m.likelihood is not None:
        return "nll" if m.likelihood == 1.0 else "bpc" if math.isclose(m.likelihood, math.log(2)) else metric
    return metric


def text8_table(agg: pd.DataFrame, split: str = DEFAULT_SPLIT) -> pd.DataFrame:
    """NLL (nats/char), bits per char and perplexity per text8 model and sampling depth: the rows of the
    tasks evaluated by their likelihood (Task.eval_mode 'likelihood', tasks.is_likelihood).

    The three are one number in three units: the nll row (every likelihood task stores it), the bpc row
    where the task stores one (else nll / ln 2), and ppl = exp(nll), never stored. A task's metrics are read
    by their declared unit (Metric.likelihood), not their names: a likelihood task of its own may name them
    as it likes.
    """
    d = agg[agg["task"].map(tasks.is_likelihood).astype(bool)]
    d = d.assign(metric=[_likelihood_unit(t, m) for t, m in zip(d["task"], d["metric"])])
    if d.empty or not d["metric"].isin(["nll", "bpc"]).any():
        raise MissingData("text8 table needs text8 evaluations with an nll (or bpc) metric")
    d = select(d, split=split)
    d = d[d["metric"].isin(["nll", "bpc"])]
    if d.empty:
        raise MissingData(f"text8 table: no text8 nll / bpc evaluations on split {split!r}")
    keys = ["task_variant", "model_key", "K", "L_t", "schedule", "loss", "d_model", "L_s"]
    if d.groupby(keys)["T"].nunique().max() > 1:
        keys.append("T")
    wide = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="mean")
    seeds = d.groupby(keys)["n_seeds"].max()
    params = d.groupby(keys)["n_params"].first()
    out = wide.reset_index()
    if "bpc" not in out:
        out["bpc"] = out["nll"] / math.log(2)
    out["ppl"] = np.exp(out["nll"])
    out["n_params"] = params.to_numpy()
    out["seeds"] = seeds.to_numpy()
    names = differing(out["model_key"])
    out["model"] = [shape_label(k, l, names[key]) for k, l, key in zip(out["K"], out["L_t"], out["model_key"])]
    return out[["task_variant", "model", *keys[2:], "n_params", "seeds", "nll", "bpc", "ppl"]].sort_values(
        ["task_variant", "nll"]).reset_index(drop=True)


def param_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Parameters and FLOPs of every model in the study, with its seed count and run status."""
    keys = [c for c in MODEL_KEYS if c in runs.columns]
    status = runs.groupby(keys, as_index=False, dropna=False)["status"].agg(
        lambda s: ", ".join(f"{v} {n}" for v, n in s.value_counts().items()))
    m = models(runs).merge(status, on=keys, how="left")
    m = m.assign(model=[f"({k} x {l})" for k, l in zip(m["K"], m["L_t"])])
    # what else tells the models of a task variant apart (the table's columns say the rest)
    shown = (*SHAPE_FIELDS, "model.d_model", "train.schedule", "train.loss")
    names = {}
    for _, g in m.groupby("task_variant"):
        names.update(differing(g["model_key"], shown))
    m["differs"] = m["model_key"].map(names)
    cols = ["task_variant", "model", "K", "L_t", "d_model", "schedule", "loss", "differs", "n_params",
            "n_params_non_embedding", "flops_per_forward", "seeds", "status"]
    return m[cols].sort_values(["task_variant", "n_params", "L_t"]).reset_index(drop=True)
