"""The few lines a study's result fits in on a terminal: what `study run` prints when its runs end, as a
trainer prints its final metrics. The headline table (each task variant's primary metric per model at
each T, sampled at L_s = L_t, mean over seeds with its 95% interval and the interval's method) and the
paired comparisons with their verdicts (the report's Headline verdicts: two or more matched seeds).
Nothing is computed here that the report does not compute (analysis.derived); `study report` has the rest.
"""
from __future__ import annotations

import textwrap

import pandas as pd

from analysis.compare import HEADLINE_SEEDS
from analysis.derived import Derived
from analysis.load import MissingData, StudyData, load_study
from analysis.tables import differing, fmt_params, shape_label
from store import Store

MAX_MODELS = 12  # model lines per task variant on a terminal; the report lists every one
WIDTH = 100  # a terminal's columns: every line here fits them


def fit(line: str, indent: int = 6) -> list[str]:
    """`line` wrapped at WIDTH, its continuation lines indented by `indent` columns more than it."""
    lead = " " * (len(line) - len(line.lstrip(" ")) + indent)
    return textwrap.wrap(line, WIDTH, subsequent_indent=lead, break_on_hyphens=False) or [line]


def comparison_lines(cmp: pd.DataFrame) -> list[str]:
    """Each paired comparison (analysis.compare's table): values, difference, interval, verdict; wrapped (fit)."""
    return [part for r in cmp.itertuples(index=False) for part in fit(
        f"  {r.comparison:13s} {r.task_variant}: {r.A} vs {r.B}, {r.metric} T={r.T}: "
        f"{r.value_A:.3f} vs {r.value_B:.3f}, difference {r.difference:+.3f} "
        f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] seeds {r.seeds}: {r.verdict}")]


def _cell(r, mark: str) -> str:
    ci = "[not estimable]" if pd.isna(r.ci_low) else f"[{r.ci_low:.3f}, {r.ci_high:.3f}]"
    return f"{r.value:.3f} {ci}{mark}" + (f" {r.learned}" if _split(r) else "")


def _split(r) -> bool:
    """Whether some seeds of row r (a rate) stayed at 0 of n while others learned: its cell says k/S."""
    k, _, s = str(getattr(r, "learned", "")).partition("/")
    return bool(s) and 0 < int(k) < int(s)


def headline_lines(derived: Derived, split: str = "test") -> list[str]:
    """Each task variant's primary metric, one line per model (at most MAX_MODELS), one column per T (in
    blocks of the Ts that fit WIDTH); each interval's method named once below its table."""
    out = []
    for variant, metric, d in derived.by_variant("the result table", split):
        d = d[d["L_s"] == d["L_t"]]
        if d.empty:
            continue
        methods = sorted(d["ci_method"].unique())
        marks = {m: (f" ({chr(97 + i)})" if len(methods) > 1 else "") for i, m in enumerate(methods)}
        names = differing(sorted(d["model_key"].unique()))
        Ts = sorted(d["T"].unique())
        rows = []
        for key, g in d.groupby("model_key"):
            r0 = g.iloc[0]
            label = shape_label(r0["K"], r0["L_t"], names.get(key))
            by_T = {r.T: _cell(r, marks[r.ci_method]) for r in g.itertuples(index=False)}
            rows.append(((int(r0["K"]), int(r0["L_t"]), label), label,
                         f"{fmt_params(r0['n_params'])} params, {int(g['n_seeds'].max())} seed(s)",
                         [by_T.get(T, "-") for T in Ts]))
        rows = [r[1:] for r in sorted(rows, key=lambda r: r[0])]  # by K, L, then what else differs
        w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
        ws = [max([len(f"T={T}")] + [len(r[2][i]) for r in rows]) for i, T in enumerate(Ts)]
        out.append(f"  {variant}: {metric}")
        blocks, used = [[]], 8 + w0 + w1
        for i, w in enumerate(ws):
            if blocks[-1] and used + w > WIDTH:
                blocks.append([])
                used = 8 + w0 + w1
            blocks[-1].append(i)
            used += w + 2
        for b in blocks:
            out.append(("    " + " " * (w0 + w1 + 4) + "  ".join(f"T={Ts[i]}".ljust(ws[i]) for i in b)).rstrip())
            for label, size, cells in rows[:MAX_MODELS]:
                out.append((f"    {label:<{w0}}  {size:<{w1}}  " + "  ".join(cells[i].ljust(ws[i]) for i in b)).rstrip())
        if len(rows) > MAX_MODELS:
            out.append(f"    ... and {len(rows) - MAX_MODELS} more models (study report lists every one)")
        out += [part for m, mark in marks.items() for part in fit(f"    interval{mark}: {m}")]
        if any(_split(r) for r in d.itertuples(index=False)):
            out.append("    k/S: k of the S seeds learned (scored above 0 of n); s.table() has its interval")
    return out


def verdict_lines(derived: Derived, split: str = "test") -> list[str]:
    """The headline verdicts (comparisons with HEADLINE_SEEDS or more matched seeds), and how many have too few."""
    cmp = derived.comparisons([], split)
    if cmp.empty:
        return []
    ok, few = cmp[cmp["matched_seeds"] >= HEADLINE_SEEDS], cmp[cmp["matched_seeds"] < HEADLINE_SEEDS]
    out = ([f"  verdicts (A - B, its paired 95% interval; the rule: the report's Paired comparisons):"]
           + ["  " + line for line in comparison_lines(ok)]) if len(ok) else []
    if len(few):
        out += fit(f"  {len(few)} of {len(cmp)} comparisons have fewer than {HEADLINE_SEEDS} matched seeds: no verdict "
                   "about the recipes (train more seeds of both models)")
    return out


def result_lines(data: StudyData, split: str = "test") -> list[str]:
    """What `study run` prints once its runs end: the headline table and the verdicts, or why there is none."""
    derived = Derived(data)
    try:
        body = headline_lines(derived, split) + verdict_lines(derived, split)
    except MissingData as e:
        body = [f"  no result table: {e}"]
    return [f"result of study {data.name} ({split} split; mean over seeds [95% interval]):"] + body


def print_result(store: Store, echo) -> None:
    """Echo the study's result (result_lines) and the command that reports the rest; a store it cannot
    summarise says why in one line (the run's own outcome is already said, and its exit code stands)."""
    try:
        lines = result_lines(load_study(store.root, store.study))
    except Exception as e:  # noqa: BLE001 -- the runs are done and kept whatever this summary meets
        what = str(e) if isinstance(e, (MissingData, ValueError)) else f"{type(e).__name__}: {e}"
        echo(f"result of study {store.study}: not available ({what}); `study report` says more")
        return
    for line in lines:
        echo(line)
    where = "" if store.root == "results" else f" --results {store.root}"
    echo(f"report: study report --study {store.study}{where} --figure all")
