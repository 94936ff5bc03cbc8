"""The sweep's figure (matplotlib, drawn off-screen without pyplot).

    speedup_plot(ds, path) -> Path | None   speedup over colocated per policy and workload: one
                                            panel per model x mode (x gpu x n_gpus when swept),
                                            mean over seeds; None when colocated is not in the sweep
"""

from __future__ import annotations

from itertools import product
from pathlib import Path

import numpy as np
import xarray as xr
from matplotlib.figure import Figure


def speedup_plot(ds: xr.Dataset, path: Path) -> Path | None:
    if "speedup_vs_colocated" not in ds.variables:
        return None
    gain = ds["speedup_vs_colocated"].mean("seed", skipna=True)
    policies = [str(p) for p in ds.policy.values if p != "colocated"]
    rows = list(product(*(ds[d].values for d in ("gpu", "n_gpus", "model"))))
    modes = list(ds["mode"].values)
    panel_w = 1.5 + 0.3 * ds.sizes["workload"] * max(len(policies), 1)
    fig = Figure(figsize=(max(5.0, panel_w) * len(modes), 3.2 * len(rows)))
    axes = fig.subplots(len(rows), len(modes), squeeze=False)
    width = 0.8 / max(len(policies), 1)
    x = np.arange(ds.sizes["workload"])
    for (gpu, n_gpus, model), row in zip(rows, axes):
        for mode, ax in zip(modes, row):
            cell = gain.sel(gpu=gpu, n_gpus=n_gpus, model=model, mode=mode)
            for i, policy in enumerate(policies):
                ax.bar(x + (i - (len(policies) - 1) / 2) * width, cell.sel(policy=policy).values, width,
                       label=policy)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xticks(x, [str(w) for w in ds.workload.values])
            ax.set_title(f"{model}, {mode} ({n_gpus} x {gpu})", fontsize=10)
            ax.set_ylabel("speedup vs colocated")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(len(labels), 1), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.4 / fig.get_figheight(), 1, 1))  # room for the legend below
    fig.savefig(path, dpi=100, format="png")
    return path
