"""`prorsa validate`: any input file checked as the command that reads it would, nothing run.

    check_file(path) -> str     a one-line description of a good file; ConfigError otherwise
    file_kind(path) -> str      trace | cluster | sweep | pipeline

A trace is told by its `.jsonl` name and read whole (read_trace); a sweep file from a pipeline by
config/sweep.py's is_sweep (so both commands report the same first error), a cluster file by its
`kind`; a pipeline is resolved, its trace read whole (load_run) and its output_dir tried
(output_problem) and, where it lists engines.devices, its engines fitted to them
(cluster/devices.py), a sweep's every point built and its policies checked (load_grid), a
cluster file's certificates looked for (load_cluster).
"""

from __future__ import annotations

from pathlib import Path

from prorsa.agent.trace import TraceError, read_trace
from prorsa.config.load import ConfigError, is_file, read_mapping
from prorsa.metrics.run_dirs import output_problem
from prorsa.rollout.context import load_run


def file_kind(path: str | Path) -> str:
    path = Path(path)
    if path.suffix == ".jsonl":
        return "trace"
    data = read_mapping(path)
    from prorsa.config.sweep import is_sweep

    if is_sweep(data):
        return "sweep"
    return "cluster" if "kind" in data else "pipeline"  # a pipeline has no kind (config/cluster.py)


def check_file(path: str | Path, overrides: dict | None = None) -> str:
    """One line saying what `path` is, or ConfigError; `overrides` (dotted key -> value) apply to
    a pipeline."""
    path = Path(path)
    kind = file_kind(path)
    if kind == "trace":
        return _check_trace(path)
    if kind == "cluster":
        from prorsa.config.cluster import load_cluster

        spec = load_cluster(path)
        return f"ok: {path} (cluster {spec.kind})"
    if kind == "sweep":
        from prorsa.sweep.grid import load_grid

        grid = load_grid(path)
        return f"ok: {path} (sweep {grid.spec.name}: {len(grid.points)} points)"
    cfg = load_run(path, overrides or {}).cfg
    problem = output_problem(Path(cfg.output_dir), cfg.name)
    if problem:
        raise ConfigError(f"{path}: output_dir: got {cfg.output_dir!r}; {problem}")
    if cfg.engines.devices is not None:  # the node is known: its GPUs must hold the engines
        from prorsa.cluster.devices import DevicePlanError, node_plan

        try:
            node_plan(cfg.engines, cfg.engines.count)
        except DevicePlanError as e:
            raise ConfigError(f"{path}: {e}") from None
    cells = ""
    if cfg.runtime.cells > 1:
        from prorsa.rollout.cells import plan_cells

        cells = f"; {plan_cells(cfg, cfg.runtime.cells).describe()}"
    return (f"ok: {path} ({cfg.name}: {cfg.engines.count} {cfg.engines.backend} engines, "
            f"policy {cfg.policy}, {cfg.workload.mode} {cfg.workload.label}{cells})")


def _check_trace(path: Path) -> str:
    if not is_file(path):
        raise ConfigError(f"{path}: no such file")
    try:
        specs = read_trace(path)
    except TraceError as e:
        raise ConfigError(str(e)) from None
    if not specs:
        raise ConfigError(f"{path}: the trace holds no trajectories")
    turns = sum(len(s.turns) for s in specs)
    return f"ok: {path} (trace: {len(specs)} trajectories, {turns} turns)"
