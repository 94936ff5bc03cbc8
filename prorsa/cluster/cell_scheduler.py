"""The preload of a cell's scheduler when it runs in a process of its own (live/cells.py with
runtime.processes): what a scheduler in the driver's process gets from the driver's dask config.

A preload is imported in Scheduler.__init__, before the scheduler builds its extensions, so the
config set here on import decides whether it steals work. The process's stderr is a pipe that
distributed reads only if the scheduler fails to start: its INFO lines (a worker joining or
leaving) would fill the pipe over a long run with moves and block the scheduler, so only errors
are logged.
"""

from __future__ import annotations

import logging

import dask

from prorsa.cluster.local import SCHEDULER_CONFIG

dask.config.set(SCHEDULER_CONFIG)
logging.getLogger("distributed").setLevel(logging.ERROR)
