"""Which process hosts a worker's engine or toolbox: `<run_dir>/engines/<engine>.pid` and
`<run_dir>/tools/<worker>.pid`, rewritten by a restarted worker. What an operator, or a fault
test, signals to stop one."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def write_pid(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{os.getpid()}\n")
    except OSError as e:  # a run directory this node cannot write: the run goes on without it
        log.warning("cannot write %s: %s", path, e)
