"""Print the measured tables of docs/REPRODUCTION.md from the Parquet store (never trains).

Run: python docs/reproduction_tables.py [--results results]
Reads results/cpu_sudoku, cpu_countdown, cpu_countdown_easy and cpu_text8 (whichever exist) and
prints Markdown: every value is a rate over the evaluation set with its 95% Wilson interval
(NLL: mean over sequences with a normal 95% interval).
"""
from __future__ import annotations

import argparse
import os

import pandas as pd
import pyarrow.dataset as ds


def load(results: str, study: str) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    root = os.path.join(results, study)
    if not os.path.isdir(os.path.join(root, "runs")) or not os.path.isdir(os.path.join(root, "evals")):
        return None
    runs = ds.dataset(os.path.join(root, "runs"), format="parquet").to_table().to_pandas()
    runs = runs[runs.status == "done"]
    evals = ds.dataset(os.path.join(root, "evals"), format="parquet").to_table().to_pandas()
    runs["model"] = [f"({k} x {l})" + (" reverse" if s == "reverse" else "")
                     for k, l, s in zip(runs.K, runs.L_t, runs.schedule)]
    # a rerun with newer code (other run ids: the task config gained fields) lands beside the old
    # runs in the same store: report the latest run of each model
    runs = runs.sort_values("created_at").drop_duplicates("model", keep="last")
    evals = evals.merge(runs[["run_id", "model", "K", "L_t", "schedule", "n_params", "train_seconds"]], on="run_id")
    return runs, evals


def md(df: pd.DataFrame) -> str:
    """A DataFrame as a Markdown table (no tabulate dependency)."""
    fmt = lambda v: f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)
    rows = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    rows += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(rows)


def cell(r, pct: bool = True) -> str:
    if pct:
        return f"{100 * r.value:.1f} [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}]"
    return f"{r.value:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]"


def table_over_T(ev: pd.DataFrame, metric: str, models: list[str], at_train_depth: bool = True) -> str:
    d = ev[(ev.metric == metric) & ev.model.isin(models)]
    if at_train_depth:
        d = d[d.L_s == d.L_t]
    Ts = sorted(set.intersection(*(set(d[d.model == m]["T"]) for m in models if (d.model == m).any())))
    lines = ["| model | params | " + " | ".join(f"T={t}" for t in Ts) + " |", "|---|---|" + "---|" * len(Ts)]
    for m in models:
        dm = d[d.model == m].set_index("T")
        if dm.empty:
            lines.append(f"| {m} | (not run) |" + " |" * len(Ts))
            continue
        lines.append(f"| {m} | {dm.n_params.iloc[0] / 1e6:.2f}M | " + " | ".join(cell(dm.loc[t]) for t in Ts) + " |")
    return "\n".join(lines)


def cross_depth(ev: pd.DataFrame, metric: str, model: str, Ts: list[int]) -> str:
    d = ev[(ev.metric == metric) & (ev.model == model)]
    Ls = sorted(d.L_s.unique())
    lines = [f"| {model}: T \\ L_s | " + " | ".join(str(l) for l in Ls) + " |", "|---|" + "---|" * len(Ls)]
    for t in Ts:
        dt = d[d["T"] == t].set_index("L_s")
        lines.append(f"| T={t} | " + " | ".join(cell(dt.loc[l]) if l in dt.index else "" for l in Ls) + " |")
    return "\n".join(lines)


def budget(ev: pd.DataFrame, metric: str, thresholds: list[float]) -> str:
    """Fewest forward passes T * L_s (and block-layer passes T * L_s * K) at which each model's
    point estimate reaches the threshold, over every (T, L_s) evaluated."""
    d = ev[ev.metric == metric]
    lines = ["| model | threshold | fewest forward passes T x L_s | layer passes T x L_s x K | at (T, L_s) | value |",
             "|---|---|---|---|---|---|"]
    for m in sorted(d.model.unique()):
        dm = d[d.model == m]
        for th in thresholds:
            ok = dm[dm.value >= th].copy()
            if ok.empty:
                best = dm.loc[dm.value.idxmax()]
                lines.append(f"| {m} | {100 * th:.0f}% | not reached (best {cell(best)} at T={best['T']}, "
                             f"L_s={best.L_s}) | | | |")
                continue
            ok["fp"] = ok["T"] * ok.L_s
            r = ok.sort_values(["fp", "value"], ascending=[True, False]).iloc[0]
            lines.append(f"| {m} | {100 * th:.0f}% | {r.fp} | {r.fp * r.K} | ({r['T']}, {r.L_s}) | {cell(r)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="results")
    a = ap.parse_args()
    s = load(a.results, "cpu_sudoku")
    if s:
        runs, ev = s
        print("## cpu_sudoku runs\n")
        print(md(runs[["model", "n_params", "flops_per_forward", "train_seconds", "final_loss", "code_version"]]
              .sort_values("model")))
        print("\n## Sudoku VPR (%) over T, L_s = L_t\n")
        print(table_over_T(ev, "vpr", ["(1 x 1)", "(1 x 3)", "(3 x 1)", "(1 x 3) reverse"]))
        print("\n## Sudoku compute budget\n")
        print(budget(ev, "vpr", [0.5, 0.9, 0.95]))
        print("\n## Sudoku cross-depth (VPR %)\n")
        for m in ["(1 x 3) reverse", "(1 x 3)"]:
            print(cross_depth(ev, "vpr", m, [1, 2, 4, 8]) + "\n")
    for study in ("cpu_countdown", "cpu_countdown_easy"):
        c = load(a.results, study)
        if not c:
            continue
        runs, ev = c
        print(f"\n## {study}: RTR (%) over T\n")
        print(table_over_T(ev, "rtr", ["(1 x 1)", "(1 x 3)"]))
        for m in ("well_formed", "ends_on_target", "exact"):
            print(f"\n{m}:\n")
            print(table_over_T(ev, m, ["(1 x 1)", "(1 x 3)"]))
        print()
        print(md(runs[["model", "n_params", "train_seconds", "final_loss"]]))
    t = load(a.results, "cpu_text8")
    if t:
        runs, ev = t
        print("\n## text8-style NLL (nats/char), L_s = L_t\n")
        d = ev[(ev.metric.isin(["nll", "bpc"])) & (ev.L_s == ev.L_t)]
        lines = ["| model | params | NLL nats/char | bits/char |", "|---|---|---|---|"]
        for m in sorted(d.model.unique()):
            dm = d[d.model == m].set_index("metric")
            lines.append(f"| {m} | {dm.n_params.iloc[0] / 1e6:.2f}M | {cell(dm.loc['nll'], False)} | "
                         f"{cell(dm.loc['bpc'], False)} |")
        print("\n".join(lines))
        print()
        print(md(runs[["model", "n_params", "train_seconds", "final_loss"]]))


if __name__ == "__main__":
    main()
