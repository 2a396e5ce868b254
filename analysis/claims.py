"""The claims a study declared (its grid's `claims:` section, kept in the store as claims.json) decided from
its evaluations: per claim the matched per-seed differences, the sequential interval and decision
(stats/sequential.py), and what the ordinary fixed-seed 95% t interval over the same seeds would say.

The difference is oriented so that positive means A is better: A - B for a metric where higher is better,
B - A where lower is (docs/DESIGN.md, "Claims").
"""
from __future__ import annotations

import json
import math
import textwrap

import pandas as pd

import tasks
from analysis.load import MissingData
from stats import t_ci
from stats.sequential import decide, design, settles, tied

CLAIMS_FILE = "claims.json"
COLUMNS = ["claim", "kind", "margin", "metric", "T", "seeds", "difference", "seq_low", "seq_high", "decision",
           "final", "fixed_low", "fixed_high", "fixed_says", "why", "method"]
EXPLANATION = ("Claims declared in the grid before the run, each decided from the matched per-seed differences "
               "(A better than B by, in the metric's units) by group-sequential repeated t intervals, 95% for "
               "all the claims together unless the grid said `claims_alpha: per-claim` (the method column says "
               "which; seq_low, seq_high: valid at every look taken, so stopping early costs no error rate); "
               "seeds: the seeds the decision used, and why one stopped undecided (constant or futile). "
               "fixed_low/high: the ordinary 95% t interval over the same seeds, and fixed_says what it alone "
               "would decide (not corrected for the looks: shown for comparison).")


def read_spec(store) -> dict | None:
    """The claims.json a claims run wrote into the study (None: the study declared no claims)."""
    if store is None:
        return None
    raw = store.read_bytes(store.path(CLAIMS_FILE))
    return None if raw is None else json.loads(raw)


def design_of(spec: dict):
    """The sequential design of a claims spec: alpha 0.05 split over its claims (Bonferroni) unless the grid said
    `claims_alpha: per-claim` (a spec written before that key was decided per claim)."""
    s = spec["seeds"]
    m = len(spec["claims"]) if spec.get("claims_alpha", "per-claim") == "family" else 1
    return design(s["min"], s["max"], s["batch"], alpha=0.05 / m, spending=s.get("spending", "obrien-fleming"))


def method_of(spec: dict) -> str:
    """The method column: the design, and whether the 5% error holds for the family of claims or per claim."""
    m = len(spec["claims"])
    if spec.get("claims_alpha", "per-claim") == "family":
        return (f"{design_of(spec).method}; family-wise: 5% for all {m} claims together (Bonferroni: each at "
                f"{0.05 / m:.3g})")
    return f"{design_of(spec).method}; per claim (claims_alpha: per-claim): 5% each, not for the {m} together"


def sides(claim: dict, evals: pd.DataFrame) -> tuple[list[float], list[float], float]:
    """A's and B's values per matched seed (seed 0, 1, ... while both models have that seed evaluated at the
    claim's point), and the metric's resolution (1/n for a rate over n examples, else 0)."""
    ev = evals[(evals["metric"] == claim["metric"]) & (evals["T"] == claim["T"])]

    def rows(side: dict) -> pd.DataFrame:
        d = ev[(ev["L_s"] == side["L_s"]) & (ev["sampler"] == side["sampler"]) & (ev["split"] == side["split"])]
        return d.set_index("run_id")

    a, b = rows(claim["A"]), rows(claim["B"])
    out_a, out_b = [], []
    for ra, rb in zip(claim["A"]["runs"], claim["B"]["runs"]):
        if ra not in a.index or rb not in b.index:
            break
        out_a.append(float(a.at[ra, "value"]))
        out_b.append(float(b.at[rb, "value"]))
    n = a["n_examples"].max() if "n_examples" in a and len(a) else 0
    return out_a, out_b, 1.0 / n if tasks.is_rate(claim["metric"]) and n > 0 else 0.0


def differences(claim: dict, evals: pd.DataFrame) -> list[float]:
    """The matched per-seed differences (A better by), oriented: B - A where lower is better."""
    a, b, _ = sides(claim, evals)
    sign = -1.0 if claim["lower_is_better"] else 1.0
    return [sign * (x - y) for x, y in zip(a, b)]


def evaluate(spec: dict, evals: pd.DataFrame) -> pd.DataFrame:
    """One row per claim: its decision so far (COLUMNS)."""
    d, method = design_of(spec), method_of(spec)
    rows = []
    for c in spec["claims"]:
        a, b, resolution = sides(c, evals)
        diffs = differences(c, evals)
        r = decide(diffs, d, c["kind"], c["margin"], resolution, (a, b))
        flo = fhi = math.nan
        if r.seeds >= 2 and r.seeds <= len(diffs) and not tied(diffs[:r.seeds], resolution):
            _, flo, fhi = t_ci(diffs[:r.seeds])
        fixed = settles(c["kind"], flo, fhi, c["margin"]) if math.isfinite(flo) and fhi > flo else "undecided"
        rows.append({"claim": c["name"], "kind": c["kind"], "margin": c["margin"], "metric": c["metric"],
                     "T": c["T"], "seeds": r.seeds, "difference": r.mean, "seq_low": r.low, "seq_high": r.high,
                     "decision": r.decision if r.final or r.decision != "undecided" else "undecided (more seeds)",
                     "final": r.final, "fixed_low": flo, "fixed_high": fhi, "fixed_says": fixed, "why": r.why,
                     "method": method, "A": c["A"]["model"], "B": c["B"]["model"]})
    return pd.DataFrame(rows, columns=COLUMNS + ["A", "B"])


def claims_table(data) -> pd.DataFrame:
    """The claims of a study (StudyData), decided from its evaluations; MissingData when it declared none."""
    spec = read_spec(data.store)
    if spec is None:
        raise MissingData("the study declared no claims (a grid's `claims:` section, run with `study run`)")
    return evaluate(spec, data.evals)


def _num(x: float) -> str:
    return f"{x:+.3g}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def lines(table: pd.DataFrame) -> list[str]:
    """The terminal's claims table: differences and margins in the metric's own units, as stored and as the API
    gives them (a rate as a fraction: 0.02 is 2 points)."""
    out = [f"{'claim':<40} {'margin':>7} {'seeds':>5} {'diff':>7} {'sequential 95%':>17} decision"]  # < 100
    for r in table.itertuples(index=False):
        margin = "-" if r.margin is None or (isinstance(r.margin, float) and math.isnan(r.margin)) \
            else f"{r.margin:g}"
        seq = f"[{_num(r.seq_low)}, {_num(r.seq_high)}]"
        out.append(f"{r.claim:<40} {margin:>7} {r.seeds:>5} {_num(r.difference):>7} {seq:>17} {r.decision}")
        said = (f"{f'{r.why}; ' if r.why else ''}fixed-seed 95% says {r.fixed_says} "
                f"[{_num(r.fixed_low)}, {_num(r.fixed_high)}]")
        out += textwrap.wrap(said, 98, initial_indent="    ", subsequent_indent="      ")  # 100 once indented
    return out + ["(A - B and margins in the metric's units: a rate as a fraction, 0.02 = 2 points)"]


def method_lines(table: pd.DataFrame) -> list[str]:
    """The claims table's heading: its method, wrapped to 100 columns."""
    return textwrap.wrap(f"claims ({table['method'].iloc[0] if len(table) else ''}):", 100, subsequent_indent="  ")


def plan_lines(spec: dict, evals: pd.DataFrame | None, reps: int = 2000) -> list[str]:
    """`study plan`'s lines for a claims grid: per claim the pilot's difference and spread (the seeds the store
    already holds), the expected seeds to decide and the chance of deciding within seeds.max, by simulation of
    normal seed differences with the pilot's mean and s.d. (stats.sequential.simulate); without a pilot, what
    is assumed instead."""
    import numpy as np

    from stats.sequential import simulate

    d = design_of(spec)
    s = spec["seeds"]
    out = [f"claims: seeds {s['min']}..{s['max']} per model, {s['batch']} at a time; looks at {list(d.looks)} "
           f"seeds; {method_of(spec)}"]
    for c in spec["claims"]:
        diffs = differences(c, evals) if evals is not None and len(evals) else []
        margin = c["margin"]
        if len(diffs) >= 2 and np.std(diffs, ddof=1) > 0:
            mean, sd = float(np.mean(diffs)), float(np.std(diffs, ddof=1))
            how = f"pilot of {len(diffs)} seeds: difference {mean:+.4g}, s.d. {sd:.4g}"
        else:
            sd = margin if margin else 1.0
            mean = 0.0 if c["kind"] == "matches" else sd
            how = (f"no pilot (fewer than 2 matched seeds with a spread in the store): assumed difference "
                   f"{mean:+.4g}, s.d. {sd:.4g}" + (" (the margin)" if margin else " (an effect of one s.d.)"))
        r = simulate(d, c["kind"], margin, mean, sd, reps, seed=1)
        out.append(f"  {c['name']}: {how}; expected seeds {r['mean_seeds']:.1f}, P(decided within {s['max']}) "
                   f"{r['supported'] + r['refuted']:.2f} (supported {r['supported']:.2f}, refuted "
                   f"{r['refuted']:.2f}; {reps} simulated studies)")
    return out
