"""Several policies on one simulated workload, side by side: what `prorsa sim` prints and writes.

    expand_policies(specs, n_engines)     "static:*" -> every static:P:D split of n engines
    check_policies(run, specs)            ValueError for a spec that names no policy of this run
    compare(cfg, specs, on_run) -> (Dataset, runs)  one simulation per policy (dim `policy`), with
                                          the makespan lower bound in its attrs (bound_s, ...)
    figure(ds)                            the headline per policy: makespan (sync) or trajectories/s (async)
    speedups(ds)                          that figure relative to colocated (> 1: faster)
    comparison_rows(ds) -> [dict]         a row per policy: what `prorsa sim --format csv|json` writes
    comparison_table(ds)                  the rich Table `prorsa sim` prints

Every policy replays the same workload (same seed): only the roles differ.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import xarray as xr
from rich.table import Table

from prorsa.config.pipeline import PipelineConfig
from prorsa.control.policy import make_policy
from prorsa.costmodel.misfit import ModelScale
from prorsa.rollout.context import RunContext, resolve
from prorsa.sim.bounds import lower_bound
from prorsa.sim.run import SimRun, simulate

FIELDS = ("makespan_s", "trajectories_per_s", "tokens_per_s", "role_switches", "prefix_hit_rate",
          "recomputed_tokens", "trajectories_completed", "trajectories_failed", "sim_wall_s")


def expand_policies(specs: list[str], n_engines: int) -> list[str]:
    out: list[str] = []
    for spec in specs:
        if spec == "static:*":
            out += [f"static:{p}:{n_engines - p}" for p in range(1, n_engines)]
        elif spec not in out:
            out.append(spec)
    return out


def check_policies(run: RunContext, specs: list[str]) -> None:
    """Before minutes of simulation: each spec made into its policy for the run's engines."""
    # the oracle is given a future here that it never reads: it is made, not run
    context = replace(run.policy, future=lambda traj_id: None)
    for spec in specs:
        make_policy(spec, context).initial_roles(run.cfg.engines.count)


def compare(cfg: PipelineConfig, specs: list[str], on_run: Callable[[SimRun], None] | None = None,
            model_error: ModelScale | None = None) -> tuple[xr.Dataset, list[SimRun]]:
    """Each policy in `specs` simulated on `cfg`; `model_error`: the policies plan with a model
    wrong by it (sim/rehearse.py misfit), the engines keep the true one."""
    runs, resolved = [], resolve(cfg)
    for spec in specs:
        run = simulate(resolved, spec, model_error=model_error)
        runs.append(run)
        if on_run is not None:
            on_run(run)
    data = {k: ("policy", np.array([_num(r.summary.get(k)) for r in runs], dtype=float)) for k in FIELDS}
    bound = {}
    if cfg.workload.mode == "sync" or cfg.workload.trajectories is not None:
        b = lower_bound(resolved)
        bound = {"bound_s": b.makespan_s, "critical_path_s": b.critical_path_s, "work_s": b.work_s}
    ds = xr.Dataset(data, coords={"policy": np.array(specs, dtype=str)},
                    attrs={**bound, "name": cfg.name, "mode": cfg.workload.mode, "engines": cfg.engines.count,
                           "gpu": cfg.engines.gpu, "model": cfg.engines.model, "tp": cfg.engines.tp,
                           "ep": cfg.engines.ep, "seed": cfg.seed, "clock": "body seconds",
                           "model_error": str(model_error or ModelScale())})
    return ds, runs


def figure(ds: xr.Dataset) -> xr.DataArray:
    return ds["makespan_s"] if ds.attrs["mode"] == "sync" else ds["trajectories_per_s"]


def speedups(ds: xr.Dataset, baseline: str = "colocated") -> xr.DataArray | None:
    if baseline not in ds.policy.values:
        return None
    fig = figure(ds)
    base = fig.sel(policy=baseline)
    return base / fig if ds.attrs["mode"] == "sync" else fig / base


def comparison_rows(ds: xr.Dataset) -> list[dict]:
    """A row per policy, as `prorsa sim --format csv|json` writes them (times in simulated seconds,
    but wall_s_to_simulate); best_static marks the best static split."""
    fig, speed = figure(ds), speedups(ds)
    sync = ds.attrs["mode"] == "sync"
    statics = [p for p in ds.policy.values if str(p).startswith("static:")]
    best = None
    if statics:
        vals = fig.sel(policy=statics)
        best = str((vals.idxmin() if sync else vals.idxmax()).item())
    rows = []
    for p in map(str, ds.policy.values):
        row = ds.sel(policy=p)
        rows.append({"policy": p, "makespan_s" if sync else "trajectories_per_s": round(float(fig.sel(policy=p)), 4),
                     "vs_colocated": None if speed is None else round(float(speed.sel(policy=p)), 4),
                     "role_switches": int(row.role_switches), "prefix_hit_rate": round(float(row.prefix_hit_rate), 4),
                     "recomputed_tokens": int(row.recomputed_tokens),
                     "wall_s_to_simulate": round(float(row.sim_wall_s), 2), "best_static": p == best})
    return rows


def comparison_table(ds: xr.Dataset) -> Table:
    """Policies side by side, as `prorsa sim` prints them; * marks the best static split."""
    sync = ds.attrs["mode"] == "sync"
    table = Table(title=f"{ds.attrs['name']}: {ds.attrs['engines']} x {ds.attrs['gpu']}, {ds.attrs['model']}, "
                        f"{ds.attrs['mode']}  ({'makespan' if sync else 'throughput'}, simulated seconds)")
    bound = ds.attrs.get("bound_s")
    if bound is not None:
        table.caption = (f"lower bound: makespan >= {bound:.2f} simulated s (critical path "
                         f"{ds.attrs['critical_path_s']:.2f} s, work over capacity {ds.attrs['work_s']:.2f} s)")
    for col in ("policy", "makespan, simulated s" if sync else "traj per simulated s", "vs colocated", "switches",
                "prefix hit", "recomputed tok", "wall s to simulate"):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for r in comparison_rows(ds):
        ratio = "" if r["vs_colocated"] is None else f"{r['vs_colocated']:.3f}"
        table.add_row(r["policy"] + (" *" if r["best_static"] else ""),
                      f"{r['makespan_s']:.2f}" if sync else f"{r['trajectories_per_s']:.3f}", ratio,
                      f"{r['role_switches']}", f"{r['prefix_hit_rate']:.1%}", f"{r['recomputed_tokens']:,}",
                      f"{r['wall_s_to_simulate']:.1f}")
    return table


def _num(x) -> float:
    return float("nan") if x is None else float(x)
