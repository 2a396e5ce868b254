"""The paper's figures, drawn with matplotlib + seaborn from the joined evals table."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis.load import MissingData  # noqa: E402

METRIC_LABEL = {"vpr": "valid puzzle rate (VPR)", "rtr": "reaches-target rate (RTR)", "cell_acc": "cell accuracy"}


def primary_metric(evals: pd.DataFrame) -> str:
    for m in ("vpr", "rtr", "nll"):
        if (evals["metric"] == m).any():
            return m
    raise MissingData("no primary metric (vpr, rtr, nll) in the evals table")


def iso_param(evals: pd.DataFrame, out_dir: str, study: str, fmt: str = "png") -> list[str]:
    """Metric vs T, one line per L (sampled at its training depth), one panel per (task variant, K)."""
    metric = primary_metric(evals)
    d = evals[(evals.metric == metric) & (evals.L_s == evals.L_t) & (evals.sampler == "confidence")]
    if d.empty:
        raise MissingData("iso-param needs evaluations at L_s = L_t with the confidence sampler")
    d = d.groupby(["task_variant", "K", "L_t", "T"], as_index=False).agg(
        value=("value", "mean"), ci_low=("ci_low", "mean"), ci_high=("ci_high", "mean"), n=("n_examples", "sum"))
    panels = list(d.groupby(["task_variant", "K"]))
    if d["T"].nunique() < 2:
        raise MissingData("iso-param needs at least two values of T")
    sns.set_theme(style="whitegrid", context="notebook")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4), squeeze=False, sharey=True)
    palette = sns.color_palette("viridis", d["L_t"].nunique())
    colors = dict(zip(sorted(d["L_t"].unique()), palette))
    for ax, ((variant, K), g) in zip(axes[0], panels):
        for L, gl in g.groupby("L_t"):
            gl = gl.sort_values("T")
            ax.plot(gl["T"], gl["value"], marker="o", color=colors[L], label=f"({K} x {L})  L_t = L_s = {L}")
            ax.fill_between(gl["T"], gl["ci_low"], gl["ci_high"], color=colors[L], alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(g["T"].unique()), [str(t) for t in sorted(g["T"].unique())])
        ax.set_title(f"{variant}, K = {K}")
        ax.set_xlabel("denoising steps T")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(title="model (K x L)", fontsize=8)
    axes[0][0].set_ylabel(METRIC_LABEL.get(metric, metric) + " (95% Wilson CI)")
    fig.suptitle(f"{study}: iso-parameter — recursion at fixed K")
    fig.tight_layout()
    return _save(fig, out_dir, "iso_param", fmt)


def _save(fig, out_dir: str, name: str, fmt: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for ext in dict.fromkeys(["png", fmt]):
        p = os.path.join(out_dir, f"{name}.{ext}")
        fig.savefig(p, dpi=130 if ext == "png" else None)
        paths.append(p)
    plt.close(fig)
    return paths


FIGURES = {"iso-param": iso_param}
