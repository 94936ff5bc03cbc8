"""`prorsa report`: plots and report.md of stored runs and sweep Datasets.

    write_run_report(inputs, output, fig_format, dpi)   needs matplotlib; prints where it wrote
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from prorsa.commands.errors import fail


def write_run_report(inputs: tuple[str, ...], output: str | None, fig_format: str, dpi: int) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        fail("prorsa report needs matplotlib (pip install -e \".[plots]\")")
    from prorsa.report.document import ReportError, default_output, split_inputs, write_report
    from prorsa.report.style import Style

    paths = [Path(p) for p in inputs]
    run_dirs, sweeps = split_inputs(paths)
    try:
        written = write_report(run_dirs, sweeps, Path(output) if output else default_output(paths),
                               Style(fig_format, dpi))
    except ReportError as e:
        fail(str(e))
    click.echo(f"wrote {written}")
