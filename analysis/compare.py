"""Paired comparisons of two models scored on the same test examples, with a verdict computed from the
interval of the difference (stats.paired_difference, stats.verdict): every iso-parameter pair
((K x L) vs (K x 1)), every iso-FLOP pair ((K x L) vs (KL x 1)), and any two models a user names,
at every T both were evaluated at, each sampled at its own training depth (L_s = L_t).
"""
from __future__ import annotations

import pandas as pd

import tasks
from analysis.effective import example_scores
from analysis.load import MissingData, StudyData
from analysis.tables import (DEFAULT_SPLIT, aggregate, differing, iso_flop_pairs, loop_free, model_fields, models,
                             primary_metric, shape_label, single_pass)
from stats import ONE_SEED, PAIR_METHOD, VERDICT_RULE, needs_examples, paired_difference, verdict

COLUMNS = ["comparison", "task_variant", "A", "B", "metric", "T", "seeds", "value_A", "value_B", "difference",
           "ci_low", "ci_high", "verdict", "A_better_in", "method", "matched_seeds"]
HEADLINE_SEEDS = 2  # matched seeds a comparison needs for the report's headline verdicts


def one_seed_scope(a: dict, b: dict, how: str, used: int) -> tuple[str | None, str]:
    """(which seeds, why) when the interval of A - B rests on one seed of a model, so its verdict is about
    that seed pair and not the recipe; (None, "") when it rests on two or more seeds of each."""
    if how in ("seeds", "welch") or (how == "examples" and used >= 2) or \
            (how == "unpaired" and min(len(a), len(b)) >= 2):
        return None, ""
    common = sorted(set(a) & set(b))
    if common:
        return f"seed {common[0]}", ONE_SEED
    if len(a) == 1 and len(b) == 1:
        return f"seeds {next(iter(a))} / {next(iter(b))}", ONE_SEED
    side, one = ("A", a) if len(a) == 1 else ("B", b)
    return f"{side}'s seed {next(iter(one))}", f"(one seed of {side}; not a claim about the recipe)"


def iso_param_pairs(runs: pd.DataFrame) -> pd.DataFrame:
    """Each recursive (K x L), L > 1, with its single-pass (K x 1) partner: the same K and every other
    training field equal, apart from those that only shape the loop (LOOP_ONLY_FIELDS)."""
    m = models(runs)
    partners = single_pass(m)
    rows = [{"task_variant": r.task_variant, "key_a": r.model_key, "key_b": s.model_key}
            for r in m[m["L_t"] > 1].itertuples(index=False) for s in partners.get((r.K, loop_free(r.model_key)), [])]
    return pd.DataFrame(rows, columns=["task_variant", "key_a", "key_b"])


def study_pairs(data: StudyData, named: list[tuple[str, str]] = ()) -> pd.DataFrame:
    """(comparison, task_variant, key_a, key_b) of every iso-parameter and iso-FLOP pair of the study,
    then the pairs of runs a user named (`named`: (run id A, run id B); any seed's run names its model)."""
    ip = iso_param_pairs(data.runs).assign(comparison="iso-parameter")
    fl = iso_flop_pairs(data.runs)
    fl = pd.DataFrame({"comparison": "iso-FLOP", "task_variant": fl["task_variant"], "key_a": fl["key_recursive"],
                       "key_b": fl["key_single"]})
    key_of = dict(zip(data.runs["run_id"], data.runs["model_key"]))
    variant_of = dict(zip(data.runs["run_id"], data.runs["task_variant"]))
    rows = []
    for a, b in named:
        missing = [r for r in (a, b) if r not in key_of]
        if missing:
            raise MissingData(f"--compare: no run {missing[0]!r} in study {data.name!r} "
                              f"(runs: {', '.join(sorted(key_of)[:6])}{', ...' if len(key_of) > 6 else ''})")
        if variant_of[a] != variant_of[b]:
            raise MissingData(f"--compare {a}:{b}: the runs are of different tasks ({variant_of[a]} vs "
                              f"{variant_of[b]}), never scored on the same examples")
        rows.append({"comparison": "named", "task_variant": variant_of[a], "key_a": key_of[a], "key_b": key_of[b]})
    cols = ["comparison", "task_variant", "key_a", "key_b"]
    return pd.concat([ip[cols], fl[cols], pd.DataFrame(rows, columns=cols)], ignore_index=True)


def _points(agg: pd.DataFrame, metric_of: dict[str, str], split: str) -> dict[tuple, tuple]:
    """(task variant, model_key) -> (sampler, {T: aggregated row}) of each model sampled at its training depth
    (L_s = L_t) on one split, in its task variant's primary metric and the sampler analysis.tables.select
    picks (confidence, else the commonest): in one pass over the table, not a select() per model (a second
    at 1,000 runs)."""
    primary = agg[agg["metric"].eq(agg["task_variant"].map(metric_of))]
    pick = primary.groupby(["task_variant", "model_key"], sort=False)["sampler"].agg(
        lambda s: "confidence" if s.eq("confidence").any() else s.mode().iloc[0]).rename("_pick")
    at = primary.join(pick, on=["task_variant", "model_key"])
    at = at[at["sampler"].eq(at["_pick"]) & at["split"].eq(split) & at["L_s"].eq(at["L_t"])]
    found: dict[tuple, tuple] = {}  # each T's first row in table order, as select(...).drop_duplicates("T")
    for r in at.drop_duplicates(["task_variant", "model_key", "T"]).drop(columns="_pick").to_dict("records"):
        found.setdefault((r["task_variant"], r["model_key"]), (r["sampler"], {}))[1][r["T"]] = r
    return found


class _SeedRows:
    """The evals rows of each (model, T, L_s, sampler, metric) as positions, with the columns compare reads
    as plain lists: one pass over the table instead of a DataFrame per group (4,000 at 1,000 runs)."""

    def __init__(self, ev: pd.DataFrame):
        self.ev, self.cols = ev, {}
        # a group of rows with a key missing is left out, as a groupby leaves it out
        self.at = {k: pos.tolist() for k, pos in
                   ev.groupby(["model_key", "T", "L_s", "sampler", "metric"], sort=False).indices.items()}

    def column(self, name: str, pos: list[int]) -> list:
        if name not in self.cols:
            self.cols[name] = self.ev[name].tolist()
        col = self.cols[name]
        return [col[i] for i in pos]

    def scores(self, data: StudyData, cache: dict, pos: list[int], metric: str) -> dict:
        """{seed: per-example scores, None where the samples do not keep every example} of the rows at `pos`
        (the last row of a seed seen twice wins)."""
        cols = (self.column(c, pos) for c in ("seed", "run_id", "eval_key", "n_examples"))
        return {sd: example_scores(data, r, e, metric, int(n), cache) for sd, r, e, n in zip(*cols)}


def compare(data: StudyData, named: list[tuple[str, str]] = (), split: str = DEFAULT_SPLIT,
            agg: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per pair (study_pairs) and T both models were evaluated at (each at L_s = its L_t, the
    default sampler, one split): the difference A - B in the task's primary metric with its paired 95%
    interval (stats.paired_difference; `method` says which) and the verdict (stats.VERDICT_RULE)."""
    pairs = study_pairs(data, named)
    if pairs.empty:
        return pd.DataFrame(columns=COLUMNS)
    agg = aggregate(data.evals) if agg is None else agg
    ev = data.evals[data.evals["split"] == split]
    label = {}  # (K x L) and, where models of one task variant differ otherwise, what differs
    for _, g in pairs.groupby("task_variant"):
        names = differing(pd.concat([g["key_a"], g["key_b"]]))
        label.update({k: shape_label(model_fields(k).get("model.K"), model_fields(k).get("model.L"), extra)
                      for k, extra in names.items()})
    cache: dict = {}  # the samples read (analysis.effective.example_scores)
    metric_of = {v: primary_metric(g["task"].iloc[0], g["metric"].unique())
                 for v, g in agg.groupby("task_variant", sort=False)}
    points = _points(agg, metric_of, split)
    seed_rows = _SeedRows(ev)

    rows = []
    for p in pairs.itertuples(index=False):
        if p.task_variant not in metric_of:
            continue
        metric = metric_of[p.task_variant]
        (sampler, pa), (sampler_b, pb) = (points.get((p.task_variant, k), (None, {}))
                                          for k in (p.key_a, p.key_b))
        if not pa or not pb or sampler != sampler_b:
            continue
        for T in sorted(set(pa) & set(pb)):
            ra, rb = pa[T], pb[T]
            # the per-seed rows of each model at this point (each of its runs' evals rows)
            ea = seed_rows.at.get((p.key_a, T, int(ra["L_s"]), sampler, metric))
            eb = seed_rows.at.get((p.key_b, T, int(rb["L_s"]), sampler, metric))
            if not ea or not eb:
                continue
            na, nb = seed_rows.column("n_examples", ea), seed_rows.column("n_examples", eb)
            same_n = len({n for n in na if not pd.isna(n)}) == 1 and set(na) == set(nb)
            a_vals = dict(zip(seed_rows.column("seed", ea), seed_rows.column("value", ea)))
            b_vals = dict(zip(seed_rows.column("seed", eb), seed_rows.column("value", eb)))
            a_sc = b_sc = None
            if same_n and needs_examples(a_vals, b_vals):  # per-example scores only where they are used
                a_sc, b_sc = (seed_rows.scores(data, cache, e, metric) for e in (ea, eb))
            diff, lo, hi, how, used = paired_difference(
                a_vals, b_vals, tasks.is_rate(metric, ra.get("task")), a_sc, b_sc,
                (float(ra["ci_low"]), float(ra["ci_high"])), (float(rb["ci_low"]), float(rb["ci_high"])))
            # the per-seed signs beside the interval: in how many matched seeds A scored better
            common = sorted(set(a_vals) & set(b_vals))
            lower = tasks.lower_is_better(metric, ra.get("task"))
            sign = -1 if lower else 1
            better = sum(1 for sd in common if sign * (a_vals[sd] - b_vals[sd]) > 0)
            on, why = one_seed_scope(a_vals, b_vals, how, used)
            rows.append({"A_better_in": f"{better} / {len(common)} seeds" if common else "",
                         "comparison": p.comparison, "task_variant": p.task_variant, "A": label[p.key_a],
                         "B": label[p.key_b], "metric": metric, "T": int(T),
                         "seeds": f"{len(a_vals)} / {len(b_vals)}" + (f" ({used} paired)" if how in ("seeds", "examples") else ""),
                         "value_A": float(ra["value"]), "value_B": float(rb["value"]), "difference": diff,
                         "ci_low": lo, "ci_high": hi,
                         "verdict": verdict(lo, hi, lower, on, why),
                         "method": PAIR_METHOD[how], "matched_seeds": len(common)})
    return pd.DataFrame(rows, columns=COLUMNS)


EXPLANATION = ("Each pair of models scored on the same test examples, at every T both were evaluated at (each "
               "sampled at its training depth): difference = A - B in the task's primary metric, with a paired "
               "95% interval (method: t over the per-seed differences when two or more seeds are matched and their "
               "differences vary; otherwise paired over the test examples within each seed pair, Agresti-Min for "
               "rates; Welch over seed means when seeds are not matched). Verdict: " + VERDICT_RULE + ". A_better_in: "
               "in how many matched seeds A scored better than B (a count, not a test); matched_seeds: the seeds "
               "both models were trained with.")
