"""`prorsa validate`: any input file checked as the command that reads it would, nothing run.

    check_file(path) -> str     a one-line description of a good file; ConfigError otherwise

A sweep file is told from a pipeline by its `base` key (a pipeline has none), a cluster file by
its `kind`; a pipeline is resolved and its trace read whole (load_run), a sweep's every point built and its
policies checked (load_grid), a cluster file's certificates looked for (load_cluster).
"""

from __future__ import annotations

from pathlib import Path

from prorsa.config.load import read_mapping
from prorsa.rollout.context import load_run


def check_file(path: str | Path) -> str:
    path = Path(path)
    data = read_mapping(path)
    if "kind" in data and "base" not in data:  # a cluster file (config/cluster.py); a pipeline has no kind
        from prorsa.config.cluster import load_cluster

        spec = load_cluster(path)
        return f"ok: {path} (cluster {spec.kind})"
    if "base" in data:
        from prorsa.sim.sweep_grid import load_grid

        grid = load_grid(path)
        return f"ok: {path} (sweep {grid.spec.name}: {len(grid.points)} points)"
    cfg = load_run(path).cfg
    return (f"ok: {path} ({cfg.name}: {cfg.engines.count} {cfg.engines.backend} engines, "
            f"policy {cfg.policy}, {cfg.workload.mode} {cfg.workload.family or 'trace'})")
