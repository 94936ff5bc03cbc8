"""`prorsa trace import`: recorded agent runs turned into a Prorsa trace file.

    import_recording(source, output, fmt, options)   read SOURCE (a progress bar for long reads on a
                                                     terminal), write the trace, print what it holds
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from prorsa.commands.errors import fail

if TYPE_CHECKING:
    from prorsa.agent.importers import ImportOptions

BIG = 8 << 20  # bytes: below this an import is done before a bar would draw


def import_recording(source: str, output: str, fmt: str, options: ImportOptions) -> None:
    """`fmt`: a format's name, or auto to tell it by content."""
    from prorsa.agent.importers import detect, import_trace, work
    from prorsa.agent.trace import TraceError, write_trace

    path = Path(source)
    try:
        name = detect(path) if fmt == "auto" else fmt
        total = work(path, name)
        console = Console(stderr=True)
        show = console.is_terminal and (total or 0) > (BIG if path.is_file() else 100)
        with _import_bar(console, total, show) as advance:
            name, specs = import_trace(path, name, options, advance)
    except TraceError as e:
        fail(str(e))
    out = Path(output)
    try:
        write_trace(out, specs)
    except OSError as e:
        fail(f"--output: cannot write {out} ({e.strerror or e})")
    click.echo(f"wrote {out}: {len(specs)} trajectories, {sum(len(s.turns) for s in specs)} turns (read as {name})")


@contextlib.contextmanager
def _import_bar(console: Console, total: int | None, show: bool) -> Iterator[Callable[[int], None]]:
    """A callback advancing a progress bar over the source, drawn only for long reads on a terminal."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("import"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=console, disable=not show) as bar:
        job = bar.add_task("import", total=total)
        yield lambda n: bar.advance(job, n)
