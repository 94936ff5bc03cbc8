"""The sweep's figure (matplotlib, drawn off-screen without pyplot).

    speedup_plot(ds, path) -> Path | None   speedup over colocated per policy and workload: one
                                            panel per model x mode (x gpu x n_gpus when swept),
                                            mean over seeds, each bar labelled with its value;
                                            None when colocated is not in the sweep
"""

from __future__ import annotations

from itertools import product
from pathlib import Path

import numpy as np
import xarray as xr
from matplotlib.figure import Figure

DPI = 150


def speedup_plot(ds: xr.Dataset, path: Path) -> Path | None:
    if "speedup_vs_colocated" not in ds.variables:
        return None
    gain = ds["speedup_vs_colocated"].mean("seed", skipna=True)
    policies = [str(p) for p in ds.policy.values if p != "colocated"]
    rows = list(product(*(ds[d].values for d in ("gpu", "n_gpus", "model"))))
    modes = list(ds["mode"].values)
    panel_w = 2.0 + 0.45 * ds.sizes["workload"] * max(len(policies), 1)
    fig = Figure(figsize=(max(6.5, panel_w) * len(modes), 4.2 * len(rows)))
    axes = fig.subplots(len(rows), len(modes), squeeze=False)
    width = 0.8 / max(len(policies), 1)
    x = np.arange(ds.sizes["workload"])
    for (gpu, n_gpus, model), row in zip(rows, axes):
        for mode, ax in zip(modes, row):
            cell = gain.sel(gpu=gpu, n_gpus=n_gpus, model=model, mode=mode)
            for i, policy in enumerate(policies):
                values = cell.sel(policy=policy).values
                bars = ax.bar(x + (i - (len(policies) - 1) / 2) * width, values, width, label=policy)
                ax.bar_label(bars, labels=[f"{v:.2f}x" if np.isfinite(v) else "n/a" for v in values], fontsize=7, padding=1,
                             rotation=90 if len(policies) > 3 else 0)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.margins(y=0.2)
            ax.set_xticks(x, [str(w) for w in ds.workload.values])
            ax.set_xlabel("workload")
            ax.set_title(f"{model}, {mode} ({n_gpus} x {gpu})", fontsize=10)
            ax.set_ylabel("speedup over colocated (x; > 1 faster)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(len(labels), 1), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.4 / fig.get_figheight(), 1, 1))  # room for the legend below
    fig.savefig(path, dpi=DPI, format="png")
    return path
