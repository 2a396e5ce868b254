"""The options of `study report` and the files it writes: in a module of their own, so that the CLI and a
report's main process read them without importing matplotlib (analysis/plotting.py, which the figures
import them from)."""
from __future__ import annotations

from dataclasses import dataclass

from analysis.tables import DEFAULT_SPLIT

FORMATS = ("svg", "pdf")
PNG_DPI = 130
DATELESS = {"png": {}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}  # savefig's metadata per format


@dataclass(frozen=True)
class Options:
    """The options of `study report` that figures and the report read."""

    fmt: str = "svg"  # second format beside PNG
    threshold: float | None = None  # pareto: default 0.95 for VPR, 0.70 for RTR
    T: int | None = None  # cross-depth: denoising steps of the heatmap (default: the middle T of those with most cells)
    pareto_x: str = "T"  # pareto y-axis: "T" (at L_s = L_t) or "forward_passes" (T * L_s, any L_s)
    split: str = DEFAULT_SPLIT  # the one evaluation split every figure and table reads
    compare: tuple = ()  # (run id A, run id B) pairs the report compares beside its iso pairs
