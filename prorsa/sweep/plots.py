"""The sweep's figure (matplotlib, drawn off-screen without pyplot; report/style.py's rules).

    speedup_figure(ds) -> Figure | None     speedup over colocated per policy and workload: one
                                            panel per model x mode (x gpu x n_gpus when swept),
                                            mean over seeds, each bar labelled with its value and,
                                            for static:best, the split it chose; None when
                                            colocated is not in the sweep
    speedup_plot(ds, path) -> Path | None   that figure as PATH (.png) and beside it .svg and .pdf
"""

from __future__ import annotations

from itertools import product
from pathlib import Path

import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from prorsa.report.figures import static_best_split
from prorsa.report.style import FONT, Style, figure, legend_below, save, series
from prorsa.sweep.grid import STATIC_BEST


def speedup_plot(ds: xr.Dataset, path: Path) -> Path | None:
    fig = speedup_figure(ds)
    return None if fig is None else save(fig, path.with_suffix(""), Style("png"))


def speedup_figure(ds: xr.Dataset) -> Figure | None:
    if "speedup_vs_colocated" not in ds.variables:
        return None
    gain = ds["speedup_vs_colocated"].mean("seed", skipna=True)
    policies = [str(p) for p in ds.policy.values if p != "colocated"]
    rows = list(product(*(ds[d].values for d in ("gpu", "n_gpus", "model"))))
    modes = list(ds["mode"].values)
    panel_w = 2.5 + 0.6 * ds.sizes["workload"] * max(len(policies), 1)
    fig = figure(max(5.0, panel_w) * len(modes), 0.6 + 4.0 * len(rows))
    axes = fig.subplots(len(rows), len(modes), squeeze=False)
    width = 0.8 / max(len(policies), 1)
    x = np.arange(ds.sizes["workload"])
    for (gpu, n_gpus, model), row in zip(rows, axes):
        for mode, ax in zip(modes, row):
            at = dict(gpu=gpu, n_gpus=n_gpus, model=model, mode=mode)
            cell = gain.sel(at)
            for i, policy in enumerate(policies):
                values = cell.sel(policy=policy).values
                label = policy + (" (its P:D split on each bar)" if policy == STATIC_BEST else "")
                bars = ax.bar(x + (i - (len(policies) - 1) / 2) * width, values, width, label=label,
                              color=series(i)["color"], edgecolor="white", hatch=("", "//", "..", "xx")[i % 4])
                texts = [f"{v:.2f}x" if np.isfinite(v) else "n/a" for v in values]
                if policy == STATIC_BEST:
                    splits = [static_best_split(ds.sel(at | {"workload": w})) for w in ds.workload.values]
                    texts = [f"{t}\n{s}" for t, s in zip(texts, splits)]
                ax.bar_label(bars, labels=texts, fontsize=FONT - 1, padding=1,
                             rotation=90 if len(policies) > 3 else 0)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.margins(y=0.25)
            ax.set_xticks(x, [str(w) for w in ds.workload.values])
            ax.set_xlabel("workload")
            ax.set_title(f"{model}, {mode} ({n_gpus} x {gpu})", fontsize=10)
            ax.set_ylabel("speedup over colocated (x; > 1 faster)")
    legend_below(fig, *axes[0][0].get_legend_handles_labels())
    return fig
