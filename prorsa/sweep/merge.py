"""The finished points of a sweep as one xarray Dataset.

    merge(grid, results) -> xr.Dataset   results: point key -> summary; dims DIMS; NaN where missing
    speedup(ds) -> DataArray | None      each policy's figure relative to colocated (> 1: better)

Variables: the simulator's summary fields (compare.FIELDS: makespan_s, trajectories_per_s,
role_switches, prefix_hit_rate, recomputed_tokens, sim_wall_s, ...), `speedup_vs_colocated`, and
`static_best_prefill` / `static_best_decode`: the split behind `static:best` in each cell. The
headline figure is the makespan in sync mode and trajectories/s in async mode; `static:best` is
the static split with the best figure in its cell (in hindsight), and NaN unless every split of
that cell has a result, so a half-finished sweep never reports a best that is not one.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import xarray as xr

from prorsa.sim.compare import FIELDS
from prorsa.sweep.grid import DIMS, STATIC_BEST, Grid, Point


def merge(grid: Grid, results: dict[str, dict]) -> xr.Dataset:
    index = {d: {v: i for i, v in enumerate(vals)} for d, vals in grid.coords.items()}
    shape = tuple(len(grid.coords[d]) for d in DIMS)
    data = {f: np.full(shape, np.nan) for f in FIELDS}
    split = {r: np.full(shape[1:], np.nan) for r in ("prefill", "decode")}
    engines = np.zeros((len(grid.coords["model"]), len(grid.coords["n_gpus"])), dtype=int)
    statics: dict[tuple, list[Point]] = defaultdict(list)
    for p in grid.points:
        cell_at = tuple(index[d][v] for d, v in zip(DIMS[1:], p.cell))
        engines[cell_at[1], cell_at[3]] = p.cfg.engines.count
        if p.label == STATIC_BEST:
            statics[cell_at].append(p)
        elif p.key in results:
            _fill(data, (index["policy"][p.label], *cell_at), results[p.key])
    for cell_at, members in statics.items():
        if all(p.key in results for p in members):
            best = max(members, key=lambda p: _goodness(p, results[p.key]))
            _fill(data, (index["policy"][STATIC_BEST], *cell_at), results[best.key])
            _, n_prefill, n_decode = best.spec.split(":")
            split["prefill"][cell_at], split["decode"][cell_at] = int(n_prefill), int(n_decode)
    coords = {d: np.array(grid.coords[d], dtype=int if d in ("n_gpus", "seed") else str) for d in DIMS}
    coords |= {"model_tp": ("model", [m.tp for m in grid.models]), "model_ep": ("model", [m.ep for m in grid.models])}
    ds = xr.Dataset({f: (DIMS, a) for f, a in data.items()}, coords=coords,
                    attrs={"name": grid.spec.name, "base": grid.spec.base, "clock": "body seconds",
                           "figure": "sync: makespan_s (lower is better); async: trajectories_per_s",
                           "static_best": "the static:P:D split with the best figure per cell, in hindsight"})
    ds["static_best_prefill"] = (DIMS[1:], split["prefill"])
    ds["static_best_decode"] = (DIMS[1:], split["decode"])
    ds["engines"] = (("model", "n_gpus"), engines)
    gain = speedup(ds)
    if gain is not None:
        ds["speedup_vs_colocated"] = gain.transpose(*DIMS)
    return ds


def speedup(ds: xr.Dataset) -> xr.DataArray | None:
    if "colocated" not in ds.policy.values:
        return None
    base = ds.sel(policy="colocated")
    return xr.where(ds["mode"] == "sync", base.makespan_s / ds.makespan_s,
                    ds.trajectories_per_s / base.trajectories_per_s)


def _goodness(p: Point, summary: dict) -> float:
    if p.cfg.workload.mode == "sync":
        return -_num(summary.get("makespan_s"), math.inf)
    return _num(summary.get("trajectories_per_s"), -math.inf)


def _fill(data: dict[str, np.ndarray], at: tuple, summary: dict) -> None:
    for f in FIELDS:
        data[f][at] = _num(summary.get(f), np.nan)


def _num(x, missing: float) -> float:
    return missing if x is None else float(x)
