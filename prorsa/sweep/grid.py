"""A sweep's grid: every point's coordinates, policy and validated pipeline, before anything runs.

    DIMS                          the Dataset's dimensions, in order
    Point                         one simulation: its cell, policy label and spec, pipeline, key
    Grid                          the points and each dimension's coordinate values
    load_grid(path, overrides)    the sweep file read (command-line KEY=VALUE over its overrides:)
                                  and expanded
    expand(spec, source) -> Grid  every point, each pipeline and policy checked up front; a bad
                                  point is one ConfigError line with the sweep file and its coordinates

`static:*` expands to every static:P:D split of the cell's engine count (which depends on n_gpus
and the model's tp x ep); those points carry the label `static:best`, and the merge keeps the best
of them per cell (merge.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path
from typing import Any

from prorsa.config.load import ConfigError, config_hash
from prorsa.config.pipeline import PipelineConfig
from prorsa.config.sweep import ModelChoice, SweepSpec, load_sweep
from prorsa.control.policy import PolicyContext, make_policy
from prorsa.rollout.context import RunContext, load_run
from prorsa.sim.compare import expand_policies

DIMS = ("policy", "workload", "model", "gpu", "n_gpus", "mode", "seed")
STATIC_ALL, STATIC_BEST = "static:*", "static:best"


@dataclass(frozen=True)
class Point:
    cell: tuple  # coordinates of every dimension but policy, in DIMS order
    label: str  # the policy coordinate: the spec itself, or static:best for a split of static:*
    spec: str  # the policy simulate() runs
    cfg: PipelineConfig
    key: str  # hash of pipeline and spec: the result's file name, the same in every run

    def coords(self) -> dict[str, Any]:
        return dict(zip(DIMS, (self.spec, *self.cell)))

    def describe(self) -> str:
        return _where(self.coords())


@dataclass(frozen=True)
class Grid:
    spec: SweepSpec
    points: list[Point]
    coords: dict[str, list]  # dimension -> values, policy labels with static:* as static:best
    models: list[ModelChoice]  # the model axis with tp and ep filled in


def expand(spec: SweepSpec, source: Path) -> Grid:
    base = _load(source, spec.base, spec.overrides, "base").cfg
    ax = spec.axes
    policies = ax.policy or [base.policy]
    models = [_fill_model(m, base) for m in (ax.model or [ModelChoice(name=base.engines.model)])]
    family = base.workload.label
    if ax.workload is not None and family in ("trace", "mix"):
        what = "replays a trace" if family == "trace" else "draws a mix of families"
        raise ConfigError(f"{source}: axes.workload: the base pipeline {what}; drop the {family} or the axis")
    coords = {
        "policy": list(dict.fromkeys(STATIC_BEST if p == STATIC_ALL else p for p in policies)),
        "workload": ax.workload or [family],
        "model": [m.name for m in models],
        "gpu": ax.gpu or [base.engines.gpu],
        "n_gpus": ax.n_gpus or [base.engines.count * base.engines.tp * base.engines.ep],
        "mode": ax.mode or [base.workload.mode],
        "seed": ax.seed or [base.seed],
    }
    by_name = {m.name: m for m in models}
    points = []
    for cell in product(*(coords[d] for d in DIMS[1:])):
        run = _cell_config(spec, source, dict(zip(DIMS[1:], cell)), by_name, ax.workload is not None)
        cfg = run.cfg
        # the oracle refuses a context without the workload's future; the simulator gives it one
        context = replace(run.policy, future=lambda traj_id: None)
        for label in policies:
            for policy in expand_policies([label], cfg.engines.count):
                _check_policy(source, cfg, context, policy, cell)
                key = hashlib.sha256(f"{config_hash(cfg)}|{policy}".encode()).hexdigest()[:20]
                points.append(Point(cell, STATIC_BEST if label == STATIC_ALL else label, policy, cfg, key))
    return Grid(spec, points, coords, models)


def load_grid(path: Path, overrides: dict[str, Any] | None = None) -> Grid:
    return expand(load_sweep(path, overrides), path)


def _fill_model(m: ModelChoice, base: PipelineConfig) -> ModelChoice:
    return m.model_copy(update={"tp": m.tp or base.engines.tp, "ep": m.ep or base.engines.ep})


def _cell_config(spec: SweepSpec, source: Path, cell: dict[str, Any], models: dict[str, ModelChoice],
                 set_family: bool) -> RunContext:
    model = models[cell["model"]]
    per_engine = model.tp * model.ep  # an EP engine is a DP-attention group of ep ranks
    where = _where(cell)
    if cell["n_gpus"] % per_engine:
        raise ConfigError(f"{source}: point {where}: n_gpus {cell['n_gpus']} is not a multiple of "
                          f"tp x ep = {per_engine}")
    # the policy is given to simulate() per point; the pipeline's own must only fit the engine count
    overrides = spec.overrides | {
        "engines.model": model.name, "engines.tp": model.tp, "engines.ep": model.ep,
        "engines.gpu": cell["gpu"], "engines.count": cell["n_gpus"] // per_engine,
        "workload.mode": cell["mode"], "seed": cell["seed"], "policy": "colocated"}
    if set_family:
        overrides["workload.family"] = cell["workload"]
    return _load(source, spec.base, overrides, f"point {where}")


def _load(source: Path, base: str, overrides: dict[str, Any], what: str) -> RunContext:
    try:
        return load_run(base, overrides)
    except ConfigError as e:
        raise ConfigError(f"{source}: {what}: {e}") from None


def _check_policy(source: Path, cfg: PipelineConfig, context: PolicyContext, policy: str, cell: tuple) -> None:
    try:
        make_policy(policy, context).initial_roles(cfg.engines.count)
    except ValueError as e:
        where = _where(dict(zip(DIMS, (policy, *cell))))
        raise ConfigError(f"{source}: point {where}: {e}") from None


def _where(coords: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{d}={v}" for d, v in coords.items()) + ")"
