"""`prorsa validate`: pipeline, sweep, cluster and trace files checked without running them.

    validate_files(files, plan, cluster_opt, gpus_per_node, devices)
                                               a line for each file (ok, or its error on stderr);
                                               --plan: each pipeline's launch plan as well (for
                                               nodes of --gpus-per-node GPUs, or --devices); exit 2
                                               when any file is bad, else 0; KEY=VALUE arguments
                                               among the files override every pipeline's fields,
                                               as for prorsa run
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from prorsa.commands.errors import fail
from prorsa.commands.inputs import cluster_from, load_pipeline, node_shape
from prorsa.config.load import ConfigError, parse_overrides


def validate_files(files: tuple[str, ...], plan: bool, cluster_opt: str | None,
                   gpus_per_node: int | None = None, devices: str | None = None) -> None:
    from prorsa.validate import check_file, file_kind

    if not plan and (gpus_per_node is not None or devices is not None):
        fail("--gpus-per-node and --devices say which node a plan is for: give --plan too")
    shape = node_shape(gpus_per_node, devices)
    cluster = cluster_from(cluster_opt)
    # a KEY=VALUE that names no file is an override, as `prorsa run` reads it
    given = [f for f in files if "=" in f and not Path(f).exists()]
    files = tuple(f for f in files if f not in given)
    try:
        overrides = parse_overrides(given)
        if overrides and not files:
            raise ConfigError(f"overrides {' '.join(given)}: give the pipeline file they apply to")
    except ConfigError as e:
        fail(str(e))
    bad = 0
    for f in files:
        try:
            kind = file_kind(f)
            line = check_file(f, overrides if kind == "pipeline" else {})
            plans = None
            if plan and kind == "pipeline":  # planned before `ok:` is said: a plan that fails is an error
                from prorsa.cluster.launch_check import check_launch

                plans = check_launch(load_pipeline(f, overrides), cluster, f, True, shape)
            click.echo(line)
            if plans is not None:
                from prorsa.cluster.launch_plan import print_plan

                print_plan(plans, Console(), shape)
        except ConfigError as e:
            click.echo(f"error: {e}", err=True)
            bad += 1
    sys.exit(2 if bad else 0)
