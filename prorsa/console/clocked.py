"""The console a command writes to: one clock on every line, tables whole in a pipe.

    ClockedConsole(...)        a rich Console whose every printed line of text begins with the wall
                               seconds since the command began ("[  12.3 s] ..."); tables and
                               other renderables print as they are
    ClockFormatter()           log records on the same clock (-v, -vv)
    command_console(stderr=, clocked=)   the console a command prints on: clocked unless told
                               not; when not a terminal (a pipe, a log file), wide enough that
                               no table is cut or wrapped
    plain(line)                a line of text as it is: no markup, no highlighting, no wrap

A live run's lines come from many places (the cluster's start, the engines' logs, the policy,
the progress); stamping them where they are printed puts all of them on the one clock, the
one a person watching the run has: wall seconds since the command began.
"""

from __future__ import annotations

import logging
import sys
import time

from rich.console import Console

# a pipe has no width: rich would take 80 columns and cut a table's cells ("colocat…")
PIPE_WIDTH = 1000
STARTED = time.time()  # when this process began a command, near enough: the clock's zero


def stamp(seconds: float) -> str:
    return f"[{seconds:6.1f} s]"


class ClockedConsole(Console):
    def __init__(self, *args, origin: float | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.origin = STARTED if origin is None else origin

    def elapsed(self) -> float:
        return time.time() - self.origin

    def print(self, *objects, **kwargs) -> None:
        if objects and isinstance(objects[0], str):
            objects = (f"{stamp(self.elapsed())} {objects[0]}", *objects[1:])
        super().print(*objects, **kwargs)


class ClockFormatter(logging.Formatter):
    """Log records on the console's clock ("[  12.3 s] prorsa.cluster.engine_host INFO ..."), so
    -v's lines sort among the console's own."""

    def __init__(self) -> None:
        super().__init__("%(clock)s %(name)s %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.clock = stamp(record.created - STARTED)
        return super().format(record)


def command_console(stderr: bool = False, clocked: bool = True) -> Console:
    """`clocked` False: lines as they are (a plan's commands, to paste)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return (ClockedConsole if clocked else Console)(stderr=stderr, width=width)


def plain(console: Console, line: str) -> None:
    console.print(line, soft_wrap=True, markup=False, highlight=False)
