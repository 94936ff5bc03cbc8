"""How every figure looks and is written: the report's, the sweep's, one set of rules.

    Style(format, dpi)            the format report.md links (png | svg | pdf) and the PNG's dots per inch
    figure(w, h) -> Figure        off-screen (no pyplot: no global state, no display), laid out so
                                  legends outside the axes keep their room
    series(i) -> dict             colour, marker and dash of a figure's i-th line: the dashboard's
                                  palette, and a marker and dash of its own, so no line hides another
    count_axis(axis)              integer ticks on an axis that counts (turns, versions, engines, steps)
    legend_beside(ax, ...)        the axes' legend to their right, outside the data
    legend_below(fig, ...)        one legend for every panel, under them
    save(fig, stem, style) -> Path   writes STEM.png, .svg and .pdf; returns the one style.format names
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from prorsa.metrics.palette import SERIES

FORMATS = ("png", "svg", "pdf")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")  # one more than colours: no pair repeats soon
_DASHES = ("solid", "dashed", "dashdot", "dotted")
FONT = 8  # legends and bar labels: a panel's data keeps the room


@dataclass(frozen=True)
class Style:
    format: str = "png"  # the file report.md links; all of FORMATS are written
    dpi: int = 150  # PNG resolution; SVG and PDF are vector (dpi sizes only embedded rasters)

    def file(self, stem: str) -> str:
        return f"{stem}.{self.format}"


def figure(width: float, height: float) -> Figure:
    # constrained layout sizes the axes around legends placed outside them; tight_layout does not
    return Figure(figsize=(width, height), layout="constrained")


def series(i: int) -> dict[str, object]:
    """Keyword arguments for the i-th line: lines that coincide (two policies finishing together)
    stay told apart by marker and dash, drawn hollow so the one below shows through."""
    return {"color": SERIES[i % len(SERIES)], "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _DASHES[i % len(_DASHES)], "markerfacecolor": "none", "markersize": 5}


def count_axis(axis: Axis) -> None:
    axis.set_major_locator(MaxNLocator(integer=True))


def legend_beside(ax, **kw) -> None:
    if ax.get_legend_handles_labels()[0] or kw.get("handles"):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=FONT,
                  frameon=False, **kw)


def legend_below(fig: Figure, handles: list, labels: list[str]) -> None:
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), fontsize=FONT + 1,
                   frameon=False)


def save(fig: Figure, stem: Path, style: Style = Style()) -> Path:
    for fmt in FORMATS:
        fig.savefig(stem.with_name(f"{stem.name}.{fmt}"), dpi=style.dpi, format=fmt)
    return stem.with_name(style.file(stem.name))
