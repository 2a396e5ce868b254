"""The study report: one self-contained HTML page (figures embedded as data URIs, no external
resource) and its Markdown twin (figures linked as PNG files beside it), with every figure drawn,
the tables (parameter counts, threshold crossings, iso-FLOP pairs, text8, tuning), the grid that
produced them and its provenance (code versions, per-run configs).
"""
from __future__ import annotations

import base64
import datetime as dt
import html
import json
import os

import pandas as pd

from analysis.figures import FIGURES, Options, aggregated, crossings_table, pairs_of
from analysis.load import MissingData, StudyData
from analysis.tables import param_table, text8_table

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
INTERVALS = ("A model's value is the mean over its seeds; its 95% interval is Student's t over the seed means "
             "(n_seeds - 1 degrees of freedom: it covers seed-to-seed and test-set variation), or, with 1 seed, "
             "that evaluation's own interval over its examples (Wilson for rates); when every seed scored the "
             "same value, the pooled evaluation interval. The ci_method column names which.")


def _fmt_value(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}" if abs(v) >= 10000 else str(int(v))
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


def tables(data: StudyData, opts: Options) -> list[tuple[str, str, pd.DataFrame | str]]:
    """(title, explanation, table or the reason it is missing) for every table of the report."""
    out: list[tuple[str, str, pd.DataFrame | str]] = []
    out.append(("Parameter counts", "Every model of the study: parameters (of the K shared layers plus embeddings "
                "and head), FLOPs of one forward pass (K*L layers), seeds and run status. A model is its whole "
                "training configuration but the seed; differs names the other fields that tell models of one "
                "task apart.", param_table(data.runs)))
    try:
        c = crossings_table(data, opts)
        c = c[["task_variant", "model", "K", "L_t", "schedule", "loss", "d_model", "metric", "threshold", "n_params",
               "crossing", "T", "L_s", "value", "best", "pareto"]]
        x = "T (at L_s = L_t)" if opts.pareto_x == "T" else "forward passes (steps run x L_s)"
        out.append(("Threshold crossings", f"Smallest {x} at which each model's seed-mean metric reaches the "
                    "threshold (— : never reached; best is the best value seen); pareto marks the non-dominated "
                    "models (fewest parameters and steps).", c))
    except MissingData as e:
        out.append(("Threshold crossings", "", str(e)))
    pairs = pairs_of(data).drop(columns=["key_recursive", "key_single"])
    out.append(("Iso-FLOP pairs", "Each recursive (K x L) with its single-pass (KL x 1) partner: equal FLOPs per "
                "denoising step, param_ratio times the parameters.",
                pairs if len(pairs) else "no (K x L), L > 1, with a (KL x 1) partner of the same task and width"))
    try:
        from analysis.compare import EXPLANATION, compare

        cmp = compare(data, list(opts.compare), opts.split, agg=aggregated(data))
        out.append(("Paired comparisons and verdicts", EXPLANATION,
                    cmp if len(cmp) else "no iso-parameter or iso-FLOP pair evaluated at a common T (and no --compare)"))
    except MissingData as e:
        out.append(("Paired comparisons and verdicts", "", str(e)))
    try:
        from analysis.effective import cached, effective_tables

        fitted = cached(data, opts.split)
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
    try:
        out.append(("Text8", "NLL bound (nats per character), bits per character and perplexity (lower is better).",
                    text8_table(aggregated(data), split=opts.split)))  # aggregated once per report
    except MissingData as e:
        out.append(("Text8", "", str(e)))
    try:
        from analysis.tuning import importances_table, load_searches

        imp = importances_table(load_searches(data.dir))
        out.append(("Tuning: parameter importances", "PED-ANOVA importances of the Optuna search's parameters "
                    "(Optuna's PedAnovaImportanceEvaluator, asked for by name; the method column says so).",
                    imp if len(imp) else "no search with two trials and a varied parameter"))
    except MissingData as e:
        out.append(("Tuning: parameter importances", "", str(e)))
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


def write_report(data: StudyData, out_dir: str, drawn: dict[str, list[str] | str],
                 opts: Options = Options()) -> tuple[str, str]:
    """Write report.html (self-contained) and report.md into out_dir; `drawn` maps each figure name to
    the paths it wrote or to the reason it was not drawn. Returns (html path, md path)."""
    os.makedirs(out_dir, exist_ok=True)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    status = ", ".join(f"{n} {s}" for s, n in data.runs["status"].value_counts().items())
    intro = (f"Study <b>{html.escape(data.name)}</b> from <code>{html.escape(data.dir)}</code>: "
             f"{data.runs['run_id'].nunique()} runs ({html.escape(status)}), {len(data.evals)} evaluation rows. "
             f"Generated {when} from the Parquet store alone (nothing retrained). {INTERVALS}")
    sup = data.superseded
    ev_left = data.left_out_evals
    note = f" Every number is from the {opts.split!r} split."
    if sup is not None and not sup.empty:
        note += (f" {len(sup)} runs are left out (a later run has the same whole training configuration and "
                 "seed): see Left out.")
    if ev_left is not None and not ev_left.empty:
        note += (f" {len(ev_left)} evaluation rows are left out (an older or smaller evaluation of a point "
                 "another row holds, never averaged in): see Left out.")
    intro += html.escape(note)
    h = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(data.name)} — R-MDM study "
         f"report</title><style>{CSS}</style></head><body>", f"<h1>{html.escape(data.name)}: R-MDM study report</h1>",
         f"<p>{intro}</p>"]
    md = [f"# {data.name}: R-MDM study report", "",
          f"Study **{data.name}** from `{data.dir}`: {data.runs['run_id'].nunique()} runs ({status}), "
          f"{len(data.evals)} evaluation rows. Generated {when} from the Parquet store alone (nothing retrained). "
          f"{INTERVALS}" + note, ""]

    if sup is not None and not sup.empty:
        left = sup.assign(created_at=sup["created_at"].astype(str))
        h += ["<h2>Left out</h2>", "<p>Runs not analysed, with the run analysed instead and why.</p>",
              html_table(left)]
        md += ["## Left out", "", "Runs not analysed, with the run analysed instead and why.", "", md_table(left), ""]
    if ev_left is not None and not ev_left.empty:
        left = ev_left.assign(created_at=ev_left["created_at"].astype(str))
        what = ("Evaluation rows not analysed: each run holds one row per point (T, L_s, sampler, split, metric); "
                "of rows with equal n_examples the newest is kept, of different sizes the largest. kept names "
                "the eval_key analysed instead.")
        if sup is None or sup.empty:
            h.append("<h2>Left out</h2>")
            md += ["## Left out", ""]
        h += [f"<p>{html.escape(what)}</p>", html_table(left)]
        md += [what, "", md_table(left), ""]

    h.append("<h2>Figures</h2>")
    md += ["## Figures", ""]
    for name, res in drawn.items():
        doc = (FIGURES[name].__doc__ or name).strip().split("\n\n")[0].replace("\n", " ")
        h.append(f"<h3>{html.escape(name)}</h3>")
        md += [f"### {name}", ""]
        if isinstance(res, str):
            h.append(f"<p class='missing'>Not drawn: {html.escape(res)}</p>")
            md += [f"*Not drawn:* {res}", ""]
            continue
        for p in res:
            if p.endswith(".png"):
                b64 = base64.b64encode(open(p, "rb").read()).decode()
                h.append(f"<figure><img src='data:image/png;base64,{b64}' alt='{html.escape(name)} figure'>"
                         f"<figcaption>{html.escape(doc)}</figcaption></figure>")
                md += [f"![{name}]({os.path.relpath(p, out_dir)})", "", f"*{doc}*", ""]
        others = [os.path.relpath(p, out_dir) for p in res if not p.endswith(".png")]
        if others:
            h.append("<p>Files: " + ", ".join(f"<code>{html.escape(o)}</code>" for o in others) + "</p>")
            md += ["Files: " + ", ".join(f"`{o}`" for o in others), ""]

    h.append("<h2>Tables</h2>")
    md += ["## Tables", ""]
    for title, note, t in tables(data, opts):
        h.append(f"<h3>{html.escape(title)}</h3>")
        md += [f"### {title}", ""]
        if isinstance(t, str):
            h.append(f"<p class='missing'>Not available: {html.escape(t)}</p>")
            md += [f"*Not available:* {t}", ""]
        else:
            h += [f"<p>{html.escape(note)}</p>", html_table(t)]
            md += [note, "", md_table(t), ""]

    h.append("<h2>Grid</h2>")
    md += ["## Grid", ""]
    if data.grid_text:
        h += [f"<p><code>{html.escape(data.dir)}/grid.yaml</code>, as last run:</p>",
              f"<pre>{html.escape(data.grid_text)}</pre>"]
        md += [f"`{data.dir}/grid.yaml`, as last run:", "", "```yaml", data.grid_text.rstrip(), "```", ""]
    else:
        h.append("<p class='missing'>No grid.yaml in the study directory.</p>")
        md += ["*No grid.yaml in the study directory.*", ""]
    # every grid the study ran (store/provenance.py), oldest first; runs name theirs in runs.grid
    from store.provenance import grids as grids_run

    ran = grids_run(data.store) if getattr(data, "store", None) is not None else []
    by_grid = data.runs["grid"].value_counts().to_dict() if "grid" in data.runs else {}
    h.append(f"<h3>Grids run ({len(ran)})</h3>")
    md += [f"### Grids run ({len(ran)})", ""]
    if not ran:
        h.append("<p class='missing'>No grid record (grids/log.jsonl): the study predates it.</p>")
        md += ["*No grid record (grids/log.jsonl): the study predates it.*", ""]
    for g in ran:
        when = "; ".join(f"{c} {t or 'time unknown'}" + (f" ({p})" if p else "") for t, c, p in g["runs"])
        line = f"grids/{g['grid']}.yaml: {when}; last grid of {by_grid.get(g['grid'], 0)} run(s)"
        h.append(f"<details><summary>{html.escape(line)}</summary><pre>{html.escape(g['text'] or '(file missing)')}"
                 "</pre></details>")
        md += [f"`{line}`", "", "```yaml", (g["text"] or "(file missing)").rstrip(), "```", ""]

    versions, per_run = provenance(data)
    h += ["<h2>Provenance</h2>", "<p>Code versions of the runs (runs.code_version):</p>", html_table(versions),
          f"<p>Per run ({len(data.configs)} resolved configs in <code>configs/</code>):</p>", html_table(per_run)]
    md += ["## Provenance", "", "Code versions of the runs (runs.code_version):", "", md_table(versions), "",
           f"Per run ({len(data.configs)} resolved configs in `configs/`):", "", md_table(per_run), ""]
    for run_id in sorted(data.configs):
        # the file's own text when read (written as this dump would write it), else the dump
        text = data.config_texts.get(run_id) or json.dumps(data.configs[run_id], indent=2, sort_keys=True, default=str)
        h.append(f"<details><summary>configs/{html.escape(run_id)}.json</summary><pre>{html.escape(text)}</pre>"
                 "</details>")
    md += [f"The resolved configs are in `{data.dir}/configs/<run_id>.json`.", ""]
    h.append("</body></html>")

    html_path, md_path = os.path.join(out_dir, "report.html"), os.path.join(out_dir, "report.md")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write("\n".join(h))
    with open(md_path, "w", encoding="utf-8") as f:
        f.write("\n".join(md))
    return html_path, md_path
