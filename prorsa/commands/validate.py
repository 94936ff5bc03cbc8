"""`prorsa validate`: pipeline, sweep, cluster and trace files checked without running them.

    validate_files(files, plan, cluster_opt)   a line for each file (ok, or its error on stderr);
                                               --plan: each pipeline's launch plan as well; exit 2
                                               when any file is bad, else 0
"""

from __future__ import annotations

import sys

import click
from rich.console import Console

from prorsa.commands.inputs import cluster_from, load_pipeline
from prorsa.config.load import ConfigError


def validate_files(files: tuple[str, ...], plan: bool, cluster_opt: str | None) -> None:
    from prorsa.validate import check_file, file_kind

    cluster = cluster_from(cluster_opt)
    bad = 0
    for f in files:
        try:
            click.echo(check_file(f))
            if plan and file_kind(f) == "pipeline":
                from prorsa.cluster.launch_check import check_launch

                check_launch(load_pipeline(f, {}), cluster, f, show=Console())
        except ConfigError as e:
            click.echo(f"error: {e}", err=True)
            bad += 1
    sys.exit(2 if bad else 0)
