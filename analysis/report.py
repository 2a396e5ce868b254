"""The study report: one self-contained HTML page (figures embedded as data URIs, no external
resource) and its Markdown twin (figures linked as PNG files beside it), with every figure drawn,
the tables (parameter counts, threshold crossings, iso-FLOP pairs, text8, tuning), the grid that
produced them and its provenance (code versions, per-run configs). Both pages are written from one
list of blocks (headings, paragraphs, tables, figures, files' text) by two small renderers, so they
say the same things in the same order.
"""
from __future__ import annotations

import base64
import datetime as dt
import html
import json
import os
from dataclasses import dataclass

import pandas as pd

from analysis.claims import EXPLANATION as CLAIMS_EXPLANATION
from analysis.claims import claims_table, read_spec
from analysis.compare import EXPLANATION, HEADLINE_SEEDS
from analysis.derived import Derived
from analysis.effective import effective_tables
from analysis.options import Options
from analysis.load import MissingData, StudyData, not_done_summary
from analysis.tables import param_table, text8_table
from analysis.tuning import importances_table, load_searches
from store.provenance import grids as grids_run

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1200px;color:#222;
padding:0 1rem;line-height:1.45}
h1{border-bottom:2px solid #444;padding-bottom:.3rem}
h2{margin-top:2.2rem;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.85rem;margin:.6rem 0}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:right}
th{background:#f0f0f0}
td:first-child,th:first-child{text-align:left}
figure{margin:1rem 0}
figure img{max-width:100%;border:1px solid #ddd}
figcaption{font-size:.9rem;color:#444}
pre{background:#f6f6f6;padding:.8rem;overflow-x:auto;font-size:.8rem}
.missing{color:#8a4b00}
details{margin:.3rem 0}
"""


# how every interval of the report is computed (stats.seed_interval; the paired table says its own)
INTERVALS = ("A model's value is the mean over its seeds; its 95% interval comes from the seed values alone "
             "(they carry seed-to-seed and test-set variation): for rates, Student's t over the seed logit rates "
             "(n_seeds - 1 degrees of freedom) mapped to the mean rate, or, where some seeds stayed at 0 and two or "
             "more learned, the share that learned (Clopper-Pearson) times their rate ('split'; k/S in the result "
             "table, learned in s.table()); for other metrics, t over the seed means, "
             "clipped to the metric's range; with 1 seed, that evaluation's own interval over its examples (about "
             "that seed only). When every seed scored the same value no interval is given ('not estimable'). "
             "The ci_method column names which.")


def _fmt_value(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        v = int(v)
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _cells(df: pd.DataFrame) -> list[list[str]]:
    return [[_fmt_value(v.item() if hasattr(v, "item") else v) for v in row] for row in df.itertuples(index=False)]


def html_table(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in _cells(df))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def md_table(df: pd.DataFrame) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(esc(c) for c in df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in _cells(df)]
    return "\n".join(lines)


NO_PAIRS = "no iso-parameter or iso-FLOP pair evaluated at a common T (and no --compare)"


def tables(data: StudyData, opts: Options, derived: Derived) -> list[tuple[str, str, pd.DataFrame | str]]:
    """(title, explanation, table or the reason it is missing) for every table of the report."""
    out: list[tuple[str, str, pd.DataFrame | str]] = []

    def add(title: str, note: str, make, empty: str | None = None) -> None:
        """The table make() returns; why it is missing (MissingData), or `empty` when it has no row."""
        try:
            t = make()
        except MissingData as e:
            out.append((title, "", str(e)))
        else:
            out.append((title, note, empty if empty is not None and t.empty else t))

    out.append(("Parameter counts", "Every model of the study: parameters (of the K shared layers plus embeddings "
                "and head), FLOPs of one forward pass (K*L layers), seeds and run status. A model is its whole "
                "training configuration but the seed; differs names the other fields that tell models of one "
                "task apart.", param_table(data.runs)))
    x = "T (at L_s = L_t)" if opts.pareto_x == "T" else "forward passes (steps run x L_s)"
    add("Threshold crossings", f"Smallest {x} at which each model's seed-mean metric reaches the threshold (— : "
        "never reached; best is the best value seen); pareto marks the non-dominated models (fewest parameters and "
        "steps).", lambda: derived.crossings(opts.threshold, opts.pareto_x, opts.split)[
            ["task_variant", "model", "K", "L_t", "schedule", "loss", "d_model", "metric", "threshold", "n_params",
             "crossing", "T", "L_s", "value", "best", "pareto"]])
    pairs = derived.pairs().drop(columns=["key_recursive", "key_single"])
    add("Iso-FLOP pairs", "Each recursive (K x L) with its single-pass (KL x 1) partner: equal FLOPs per denoising "
        "step, param_ratio times the parameters.", lambda: pairs,
        "no (K x L), L > 1, with a (KL x 1) partner of the same task and width")
    add("Paired comparisons and verdicts", EXPLANATION, lambda: derived.comparisons(list(opts.compare), opts.split),
        NO_PAIRS)
    if read_spec(data.store) is not None:  # a study whose grid declared claims (analysis/claims.py)
        out.append(("Claims", CLAIMS_EXPLANATION, claims_table(data)))
    try:
        fitted = derived.effective(opts.split)
        eff, beta = effective_tables(fitted)
        skipped = (" Left out: " + "; ".join(fitted.skipped) + ".") if fitted.skipped else ""
        out.append(("Effective parameters", "Each looped (K x L), sampled at L_s = L, placed on its family's "
                    "single-pass metric-vs-parameters curve at the same T (monotone fit on log parameters): it "
                    "performs like a single-pass model with m x its parameters (equiv_params). m_low, m_high: 95% "
                    "bootstrap interval over seeds and evaluation examples (0 or inf: open end). A model beyond "
                    "the single-pass range is said to be so, never extrapolated." + skipped, eff))
        out.append(("What a loop is worth (m = L^beta)", "beta from log m = beta log L (least squares through "
                    "the origin) over the in-range points of each family, over all T and at each T; m_at_L2 = "
                    "2^beta; beta_low, beta_high: 95% bootstrap interval.", beta))
    except MissingData as e:
        out.append(("Effective parameters", "", str(e)))
    add("Text8", "NLL bound (nats per character), bits per character and perplexity (lower is better).",
        lambda: text8_table(derived.aggregated(), split=opts.split))
    add("Tuning: parameter importances", "PED-ANOVA importances of the Optuna search's parameters (Optuna's "
        "PedAnovaImportanceEvaluator, asked for by name; the method column says so).",
        lambda: importances_table(load_searches(data.dir)), "no search with two trials and a varied parameter")
    return out


def provenance(data: StudyData) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(code versions with run counts, per-run provenance: run, model, seed, status, code, node, device, created)."""
    r = data.runs
    versions = r.groupby(r["code_version"].fillna("unknown")).agg(runs=("run_id", "nunique")).reset_index()
    per_run = pd.DataFrame({
        "run_id": r["run_id"], "task": r["task_variant"], "model": [f"({k} x {l})" for k, l in zip(r["K"], r["L_t"])],
        "schedule": r["schedule"], "loss": r["loss"], "seed": r["seed"], "status": r["status"],
        "code_version": r["code_version"], "node": r["node"], "device": r["device"],
        "created_at": r["created_at"].astype(str), "config": ["yes" if i in data.configs else "missing"
                                                             for i in r["run_id"]]})
    return versions, per_run.sort_values(["task", "model", "seed"]).reset_index(drop=True)


# ---- the document: one list of blocks, each said once in HTML and in Markdown ----------------------
@dataclass(frozen=True)
class Bold:
    text: str


@dataclass(frozen=True)
class Mono:
    text: str  # a path, a file or a command


Spans = tuple  # of str, Bold and Mono: a paragraph's text
Block = tuple  # (its HTML, its Markdown): None where that page leaves it out


def _html_spans(spans: Spans) -> str:
    return "".join(f"<b>{html.escape(s.text)}</b>" if isinstance(s, Bold) else
                   f"<code>{html.escape(s.text)}</code>" if isinstance(s, Mono) else html.escape(s) for s in spans)


def _md_spans(spans: Spans) -> str:
    return "".join(f"**{s.text}**" if isinstance(s, Bold) else f"`{s.text}`" if isinstance(s, Mono) else s
                   for s in spans)


def heading(level: int, text: str) -> Block:
    return f"<h{level}>{html.escape(text)}</h{level}>", f"{'#' * level} {text}"


def paragraph(spans: Spans, in_html: bool = True) -> Block:
    """A paragraph; in_html False: the Markdown's only (the HTML says it with its details)."""
    return f"<p>{_html_spans(spans)}</p>" if in_html else None, _md_spans(spans)


def missing(text: str, lead: str = "") -> Block:
    """Something the report would show but cannot: `lead` (as 'Not drawn:') then why."""
    return (f"<p class='missing'>{html.escape(' '.join(filter(None, [lead, text])))}</p>",
            f"*{lead}* {text}" if lead else f"*{text}*")


def table(df: pd.DataFrame) -> Block:
    return html_table(df), md_table(df)


def image(path: str, rel: str, name: str, caption: str) -> Block:
    """The PNG at `path`: embedded in the HTML, linked from the Markdown by `rel`."""
    b64 = base64.b64encode(open(path, "rb").read()).decode()
    return (f"<figure><img src='data:image/png;base64,{b64}' alt='{html.escape(name)} figure'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>", f"![{name}]({rel})\n\n*{caption}*")


def pre(text: str) -> Block:
    """A file's text (YAML)."""
    return f"<pre>{html.escape(text)}</pre>", f"```yaml\n{text.rstrip()}\n```"


def details(summary: str, text: str, html_only: bool = False) -> Block:
    """A file's text under a summary line, folded in the HTML; in the Markdown (unless html_only) the line
    and the text."""
    return (f"<details><summary>{html.escape(summary)}</summary><pre>{html.escape(text)}</pre></details>",
            None if html_only else f"`{summary}`\n\n```yaml\n{text.rstrip()}\n```")


def to_html(title: str, blocks: list[Block]) -> str:
    head = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>")
    return "\n".join([head, *(h for h, _ in blocks if h is not None), "</body></html>"])


def to_markdown(blocks: list[Block]) -> str:
    return "\n".join(part for _, md in blocks if md is not None for part in (md, ""))


# ---- the report's sections ------------------------------------------------------------------------
def _intro(data: StudyData, opts: Options) -> list:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    status = ", ".join(f"{n} {s}" for s, n in data.runs["status"].value_counts().items())
    sup, ev_left = data.superseded, data.left_out_evals
    note = f" Every number is from the {opts.split!r} split."
    if sup is not None and not sup.empty:
        note += (f" {len(sup)} runs are left out (a later run has the same whole training configuration and "
                 "seed): see Left out.")
    nd = data.not_done
    if nd is not None and not nd.empty:
        note += (f" {len(nd)} runs did not finish ({not_done_summary(nd)}) and are left out: only done runs "
                 "are averaged; see Left out.")
    if ev_left is not None and not ev_left.empty:
        note += (f" {len(ev_left)} evaluation rows are left out (an older or smaller evaluation of a point "
                 "another row holds, never averaged in): see Left out.")
    return [heading(1, f"{data.name}: R-MDM study report"),
            paragraph(("Study ", Bold(data.name), " from ", Mono(data.dir),
                       f": {data.runs['run_id'].nunique()} runs ({status}), {len(data.evals)} evaluation rows. "
                       f"Generated {when} from the Parquet store alone (nothing retrained). {INTERVALS}{note}"))]


HEADLINE_COLUMNS = ["comparison", "task_variant", "A", "B", "metric", "T", "seeds", "difference", "ci_low",
                    "ci_high", "verdict"]


def _headline(opts: Options, derived: Derived) -> list:
    """The verdicts the study supports about the recipes: comparisons with two or more matched seeds only
    (a one-seed verdict is about that seed pair: it stays in the Paired comparisons table)."""
    out = [heading(2, "Headline verdicts")]
    try:
        cmp = derived.comparisons(list(opts.compare), opts.split)
    except MissingData as e:
        return out + [missing(str(e), lead="Not available:")]
    if cmp.empty:
        return out + [missing(NO_PAIRS)]
    ok = cmp[cmp["matched_seeds"] >= HEADLINE_SEEDS]
    few = cmp[cmp["matched_seeds"] < HEADLINE_SEEDS]
    too_few = (f"{len(few)} of {len(cmp)} comparisons have fewer than {HEADLINE_SEEDS} matched seeds (the same "
               f"train.seed for A and B; they have {', '.join(map(str, sorted(set(few['matched_seeds']))))}): no "
               "headline verdict for them; train more seeds of both models. Their per-seed-pair verdicts are in "
               "Tables: Paired comparisons and verdicts.") if len(few) else ""
    if ok.empty:
        return out + [missing(too_few)]
    out += [paragraph((f"Comparisons with {HEADLINE_SEEDS} or more matched seeds (verdict rule and methods: "
                       "Tables: Paired comparisons and verdicts).",)), table(ok[HEADLINE_COLUMNS])]
    return out + ([missing(too_few)] if too_few else [])


def _left_out(data: StudyData) -> list:
    out = []
    for left, what in (
            (data.not_done, "Runs that did not finish (status other than done): none of their rows is analysed."),
            (data.superseded, "Runs not analysed, with the run analysed instead and why."),
            (data.left_out_evals, "Evaluation rows not analysed: each run holds one row per point (T, L_s, sampler, "
             "split, metric); of rows with equal n_examples the newest is kept, of different sizes the largest. kept "
             "names the eval_key analysed instead.")):
        if left is not None and not left.empty:
            dated = left.assign(created_at=left["created_at"].astype(str)) if "created_at" in left else left
            out += [paragraph((what,)), table(dated)]
    return [heading(2, "Left out"), *out] if out else []


def _figures(drawn: dict[str, list[str] | str], out_dir: str) -> list:
    out = [heading(2, "Figures")]
    for name, res in drawn.items():
        out.append(heading(3, name))
        if isinstance(res, str):
            out.append(missing(res, lead="Not drawn:"))
            continue
        from analysis.figures import FIGURES

        caption = FIGURES[name].caption
        out += [image(p, os.path.relpath(p, out_dir), name, caption) for p in res if p.endswith(".png")]
        others = [os.path.relpath(p, out_dir) for p in res if not p.endswith(".png")]
        if others:  # "Files: " then each path, comma-separated
            out.append(paragraph(("Files: ", *(x for i, o in enumerate(others) for x in [", "][:i] + [Mono(o)]))))
    return out


def _tables(data: StudyData, opts: Options, derived: Derived) -> list:
    out = [heading(2, "Tables")]
    for title, note, t in tables(data, opts, derived):
        out.append(heading(3, title))
        out += [missing(t, lead="Not available:")] if isinstance(t, str) else [paragraph((note,)), table(t)]
    return out


def _grids(data: StudyData) -> list:
    out = [heading(2, "Grid")]
    if data.grid_text:
        out += [paragraph((Mono(f"{data.dir}/grid.yaml"), ", as last run:")), pre(data.grid_text)]
    else:
        out.append(missing("No grid.yaml in the study directory."))
    # every grid the study ran (store/provenance.py), oldest first; runs name theirs in runs.grid
    ran = grids_run(data.store) if data.store is not None else []
    by_grid = data.runs["grid"].value_counts().to_dict()
    out.append(heading(3, f"Grids run ({len(ran)})"))
    if not ran:
        out.append(missing("No grid record (grids/log.jsonl): no grid of the study was run."))
    for g in ran:
        when = "; ".join(f"{c} {t or 'time unknown'}" + (f" ({p})" if p else "") for t, c, p in g["runs"])
        out.append(details(f"grids/{g['grid']}.yaml: {when}; last grid of {by_grid.get(g['grid'], 0)} run(s)",
                           g["text"] or "(file missing)"))
    return out


def _provenance(data: StudyData) -> list:
    versions, per_run = provenance(data)
    out = [heading(2, "Provenance"), paragraph(("Code versions of the runs (runs.code_version):",)), table(versions),
           paragraph((f"Per run ({len(data.configs)} resolved configs in ", Mono("configs/"), "):")), table(per_run)]
    for run_id in sorted(data.configs):
        # the file's own text when read (written as this dump would write it), else the dump
        text = data.config_texts.get(run_id) or json.dumps(data.configs[run_id], indent=2, sort_keys=True, default=str)
        out.append(details(f"configs/{run_id}.json", text, html_only=True))
    return out + [paragraph(("The resolved configs are in ", Mono(f"{data.dir}/configs/<run_id>.json"), "."),
                            in_html=False)]


def write_report(data: StudyData, out_dir: str, drawn: dict[str, list[str] | str],
                 opts: Options = Options(), derived: Derived | None = None) -> tuple[str, str]:
    """Write report.html (self-contained) and report.md into out_dir, from one list of blocks; `drawn`
    maps each figure name to the paths it wrote or to the reason it was not drawn; `derived`: the tables
    the figures computed (analysis.derived), reused here. Returns (html path, md path)."""
    derived = derived if derived is not None else Derived(data)
    os.makedirs(out_dir, exist_ok=True)
    blocks = (_intro(data, opts) + _headline(opts, derived) + _left_out(data) + _figures(drawn, out_dir) + _tables(data, opts, derived)
              + _grids(data) + _provenance(data))
    html_path, md_path = os.path.join(out_dir, "report.html"), os.path.join(out_dir, "report.md")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(to_html(f"{data.name} — R-MDM study report", blocks))
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(to_markdown(blocks))
    return html_path, md_path
