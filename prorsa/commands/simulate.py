"""`prorsa sim`: a pipeline's rollout in virtual time under each policy, side by side.

    SimRequest                 the command's arguments as given
    simulate_policies(request) resolve the pipeline at the GPUs asked for, check every policy,
                               simulate each (printing as each ends), print and write the comparison:
                               a table, or with --format csv|json rows on stdout (the lines telling
                               the simulations go to stderr then)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from prorsa.commands.errors import fail
from prorsa.commands.inputs import load_pipeline, prior_path, with_options
from prorsa.metrics.run_dirs import output_problem

if TYPE_CHECKING:
    from prorsa.config.pipeline import PipelineConfig
    from prorsa.costmodel.misfit import ModelScale
    from prorsa.rollout.context import RunContext


@dataclass(frozen=True)
class SimRequest:
    pipeline: str
    overrides: tuple[str, ...]
    policies: str  # comma-separated; static:* is every static:P:D split
    gpus: int | None
    gpu: str | None
    model: str | None
    tp: int | None
    ep: int | None
    prefix_cache: str | None
    seed: int | None
    output: str | None
    model_error: str | None
    prior: str | None
    fmt: str = "table"  # or csv, json (metrics/row_formats.py)


def simulate_policies(request: SimRequest) -> None:
    from prorsa.console.clocked import command_console
    from prorsa.metrics.row_formats import rows_text
    from prorsa.sim.compare import compare, comparison_rows, comparison_table, expand_policies
    from prorsa.sim.run import write_run

    resolved = _resolve(request)
    cfg = resolved.cfg
    if cfg.runtime.cells > 1:
        fail(f"{request.pipeline}: runtime.cells: prorsa sim simulates one cell (benchmarks/cells.py --sim simulates "
             "cells); set runtime.cells 1")
    specs = expand_policies([p.strip() for p in request.policies.split(",") if p.strip()], cfg.engines.count)
    scale = _model_error(request.model_error)
    _check_policies(resolved, specs)
    console = command_console(stderr=request.fmt != "table")  # csv and json alone on stdout
    console.print(f"simulating {cfg.name}: {_engines_line(cfg)}, {cfg.workload.mode} {cfg.workload.label}, "
                  f"{len(specs)} policies")
    out = Path(request.output) if request.output else None
    if out is not None and (problem := output_problem(out, "runs")):  # before minutes of simulation
        fail(f"--output: got {request.output!r}; {problem}")

    def done(run) -> None:
        s = run.summary
        console.print(f"{run.policy}: {s['makespan_s']:.2f} simulated s, {s['role_switches']} switches "
                      f"({run.wall_s:.1f} wall s to simulate)")
        if out is not None:
            write_run(run, out / "runs" / run.policy.replace(":", "_"))

    ds, _ = compare(cfg, specs, done, scale)
    if request.fmt == "table":
        console.print(comparison_table(ds))
    else:
        click.echo(rows_text(comparison_rows(ds), request.fmt))
    if out is not None:
        from prorsa.metrics.outputs import write_dataset

        write_dataset(out / "results.nc", ds)
        console.print(f"wrote {out}")


def _resolve(request: SimRequest) -> RunContext:
    """The pipeline with the options over it; --gpus as the engine count its tp x ep makes of them."""
    overrides = with_options(request.overrides, **{
        "engines.gpu": request.gpu, "engines.model": request.model, "engines.tp": request.tp,
        "engines.ep": request.ep, "engines.prefix_cache": request.prefix_cache, "seed": request.seed,
        "prior": prior_path(request.prior)})
    if "engines.count" in overrides:  # --policy picks what runs; the pipeline's own need not fit the count
        overrides.setdefault("policy", "colocated")
    resolved = load_pipeline(request.pipeline, overrides)
    gpus = request.gpus
    if gpus is None:
        return resolved
    if resolved.cfg.engines.groups is not None:
        fail("--gpus: engines.groups size every engine; change the groups' counts instead")
    per_engine = resolved.cfg.engines.tp * resolved.cfg.engines.ep  # an EP engine is a DP-attention group of ep ranks
    if gpus % per_engine:
        fail(f"--gpus {gpus} is not a multiple of engines.tp x engines.ep = {per_engine}")
    return load_pipeline(request.pipeline, overrides | {"engines.count": gpus // per_engine, "policy": "colocated"})


def _model_error(text: str | None) -> ModelScale | None:
    from prorsa.costmodel.misfit import ModelScale

    try:
        return ModelScale.parse(text) if text else None
    except ValueError as err:
        fail(f"--model-error: {err}")


def _check_policies(resolved: RunContext, specs: list[str]) -> None:
    from prorsa.sim.compare import check_policies

    try:
        check_policies(resolved, specs)
    except ValueError as e:
        fail(f"--policy: {e}")


def _engines_line(cfg: PipelineConfig) -> str:
    """`3 x h200 engines (tp=1, ep=1) serving <model>`, or each group's sizes."""
    e = cfg.engines
    sizes = (f"(tp={e.tp}, ep={e.ep})" if e.groups is None else
             "in groups " + ", ".join(f"{g.count} x tp{g.tp} ep{g.ep} {'/'.join(g.roles)}" for g in e.engine_groups))
    return f"{e.count} x {e.gpu} engines {sizes} serving {e.model}"
