"""analysis/theme.py is seaborn's look without importing seaborn: the same rcParams as
seaborn.set_theme(style="whitegrid", context="notebook") (but image.cmap, which no figure uses), the same
"deep" and colormap palettes, the same luminance rule, and so the same PNG bytes for a figure drawn under
either. Each side runs in a fresh interpreter (rcParams are process-wide).

    .venv/bin/python -m pytest tests/test_theme.py -q
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRAW = """
import hashlib, json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
before = dict(matplotlib.rcParams)
if sys.argv[1] == "seaborn":
    import seaborn as sns
    sns.set_theme(style="whitegrid", context="notebook")
    pal = sns.color_palette
    lum = sns.utils.relative_luminance
else:
    sys.path.insert(0, {root!r})
    from analysis import theme
    theme.set_theme()
    pal = theme.color_palette
    lum = theme.relative_luminance
changed = {{k: repr(v) for k, v in matplotlib.rcParams.items() if before[k] != v and k != "image.cmap"}}
fig, ax = plt.subplots(figsize=(4, 3))
for i in range(4):
    ax.plot([0, 1, 2], [i, i + 1, i * 2], marker="o", label=f"line {{i}}")
ax.bar([0, 1], [1, 2], color=pal("deep")[2])
ax.plot([0, 2], [0, 1], color="k")
ax.table(cellText=[["a", "b"]], loc="bottom")
ax.legend(); ax.set_title("t"); ax.set_xlabel("x")
fig.savefig(sys.argv[2], dpi=80, metadata={{"Software": None}})
print(json.dumps({{"rc": changed, "deep": [list(c) for c in pal("deep")], "deep12": [list(c) for c in pal("deep", 12)],
                  "viridis": [list(c) for c in pal("viridis", 5)],
                  "lum": [lum(c) for c in ("#440154", (0.2, 0.7, 0.3), (0.99, 0.9, 0.1, 1.0))],
                  "codes": {{c: list(matplotlib.colors.to_rgb(c)) for c in "bgrmyck"}}}}))
"""


def _side(name: str, tmp_path) -> tuple[dict, bytes]:
    png = str(tmp_path / f"{name}.png")
    p = subprocess.run([sys.executable, "-c", DRAW.format(root=ROOT), name, png], capture_output=True, text=True,
                       timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), open(png, "rb").read()


def test_the_theme_is_seaborns_rcparam_by_rcparam_and_draws_the_same_bytes(tmp_path):
    ours, ours_png = _side("ours", tmp_path)
    theirs, theirs_png = _side("seaborn", tmp_path)
    assert ours["rc"] == theirs["rc"]
    for key in ("deep", "deep12", "viridis", "lum", "codes"):
        assert ours[key] == theirs[key], key
    assert ours_png == theirs_png


def test_a_report_of_one_figure_never_imports_seaborn():
    src = open(os.path.join(ROOT, "analysis", "plotting.py")).read()
    assert "import seaborn" not in src
    for name in os.listdir(os.path.join(ROOT, "analysis", "figures")):
        if name.endswith(".py"):
            assert "import seaborn" not in open(os.path.join(ROOT, "analysis", "figures", name)).read(), name
