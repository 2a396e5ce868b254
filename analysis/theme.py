"""The figures' look without importing seaborn (1.3 s of a one-figure report's start on a 2-core machine).

THEME is what `seaborn.set_theme(style="whitegrid", context="notebook")` sets in matplotlib's rcParams
(seaborn 0.13; tests/test_theme.py holds it equal to seaborn's, rcParam by rcParam, where seaborn is
installed), less `image.cmap` ('rocket', a seaborn colormap no figure here uses: every image names its
own), and its one-letter colour codes (COLOR_CODES). DEEP is seaborn's "deep" palette; `color_palette(name, n)` samples a matplotlib colormap as
seaborn's color_palette does (n evenly spaced bins, both ends left out), and `relative_luminance` is
seaborn's rule for text on a coloured cell.
"""
from __future__ import annotations

import matplotlib
import numpy as np
from cycler import cycler

DEEP = [(0.2980392156862745, 0.4470588235294118, 0.6901960784313725),
        (0.8666666666666667, 0.5176470588235295, 0.3215686274509804),
        (0.3333333333333333, 0.6588235294117647, 0.40784313725490196),
        (0.7686274509803922, 0.3058823529411765, 0.3215686274509804),
        (0.5058823529411764, 0.4470588235294118, 0.7019607843137254),
        (0.5764705882352941, 0.47058823529411764, 0.3764705882352941),
        (0.8549019607843137, 0.5450980392156862, 0.7647058823529411),
        (0.5490196078431373, 0.5490196078431373, 0.5490196078431373),
        (0.8, 0.7254901960784313, 0.4549019607843137),
        (0.39215686274509803, 0.7098039215686275, 0.803921568627451)]

THEME = {
    "axes.axisbelow": True, "axes.edgecolor": ".8", "axes.grid": True, "axes.labelcolor": ".15",
    "axes.labelsize": 12.0, "axes.linewidth": 1.25, "axes.prop_cycle": cycler("color", DEEP),
    "axes.titlesize": 12.0, "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans",
                                                 "sans-serif"],
    "font.size": 12.0, "grid.color": ".8", "grid.linewidth": 1.0, "legend.fontsize": 11.0,
    "legend.title_fontsize": 12.0, "lines.solid_capstyle": "round", "patch.edgecolor": "w",
    "patch.force_edgecolor": True, "text.color": ".15", "xtick.bottom": False, "xtick.color": ".15",
    "xtick.labelsize": 11.0, "xtick.major.size": 6.0, "xtick.major.width": 1.25, "xtick.minor.size": 4.0,
    "xtick.minor.width": 1.0, "ytick.color": ".15", "ytick.labelsize": 11.0, "ytick.left": False,
    "ytick.major.size": 6.0, "ytick.major.width": 1.25, "ytick.minor.size": 4.0, "ytick.minor.width": 1.0,
}


# the one-letter colour codes seaborn's set_theme remaps (set_color_codes("deep")): "k" is (.1, .1, .1), not
# black, wherever a figure or matplotlib names it (a table's cell edges, for one)
COLOR_CODES = dict(zip("bgrmyck", [DEEP[0], DEEP[2], DEEP[3], DEEP[4], DEEP[8], DEEP[9], (0.1, 0.1, 0.1)]))


def set_theme() -> None:
    matplotlib.rcParams.update(THEME)
    for code, rgb in COLOR_CODES.items():
        matplotlib.colors.colorConverter.colors[code] = rgb


def color_palette(name: str, n: int | None = None) -> list[tuple[float, float, float]]:
    """'deep' (its first n colours, cycled), or n colours of a matplotlib colormap as seaborn samples it."""
    if name == "deep":
        return [DEEP[i % len(DEEP)] for i in range(n or len(DEEP))]
    bins = np.linspace(0, 1, int(n) + 2)[1:-1]
    return [tuple(c) for c in matplotlib.colormaps[name](bins)[:, :3]]


def relative_luminance(color) -> float:
    """seaborn.utils.relative_luminance: the W3C relative luminance of an RGB(A) colour."""
    rgb = np.asarray(matplotlib.colors.to_rgba_array(color))[:, :3]
    rgb = np.where(rgb <= .03928, rgb / 12.92, ((rgb + .055) / 1.055) ** 2.4)
    lum = rgb.dot([.2126, .7152, .0722])
    return float(lum[0]) if lum.size == 1 else lum
