"""How a command refuses its input: one line on stderr and exit code 2, never a traceback.

    fail(msg)               print `error: msg` and exit 2
    or_fail(fn, *args)      fn(*args), or its ConfigError as that line
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click

from prorsa.config.load import ConfigError

T = TypeVar("T")


def fail(msg: str) -> NoReturn:
    click.echo(f"error: {msg}", err=True)
    sys.exit(2)


def or_fail(fn: Callable[..., T], *args) -> T:
    try:
        return fn(*args)
    except ConfigError as e:
        fail(str(e))
