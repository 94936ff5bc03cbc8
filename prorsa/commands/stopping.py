"""How a command that starts engines stops: SIGTERM (a batch system, `timeout`) unwinds as Ctrl-C
does, so that engines, servers and jobs are stopped on the way out, and a start that failed or an
interrupt ends in one error line (run_folder.py says what stays of the run).

    sigterm_as_ctrl_c()        SIGTERM passed on as SIGINT (for live/interrupt.py's own handling)
    sigterm_as_interrupt()     SIGTERM raised as KeyboardInterrupt where it arrives
    roll_out(rollout, folder, source, wind_down) -> dict   a live rollout to its summary
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from prorsa.commands.errors import fail
from prorsa.commands.run_folder import RunFolder, failed_start, interrupted, out_of_space


def _as_sigint(signum, frame) -> None:
    os.kill(os.getpid(), signal.SIGINT)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def sigterm_as_ctrl_c() -> None:
    signal.signal(signal.SIGTERM, _as_sigint)


def sigterm_as_interrupt() -> None:
    signal.signal(signal.SIGTERM, _raise_interrupt)


def roll_out(rollout: Coroutine[Any, Any, dict], folder: RunFolder, source: str,
             wind_down: Callable[[], None] | None = None) -> dict:
    """`source`: what the engines' error line names (the pipeline)."""
    from prorsa.cluster.local import EngineStartFailed
    from prorsa.live.interrupt import Interrupted, kill_children, run_interruptible

    # during the run SIGTERM and Ctrl-C both stop the rollout and let the cleanup finish
    # (live/interrupt.py); before the loop runs, SIGTERM is passed on as SIGINT
    sigterm_as_ctrl_c()
    try:
        return asyncio.run(run_interruptible(rollout, abandon=lambda: interrupted(folder), wind_down=wind_down))
    except EngineStartFailed as e:
        fail(failed_start(folder, f"{source}: engines did not start: {e}"))
    except (Interrupted, KeyboardInterrupt, asyncio.CancelledError):
        kill_children()
        fail(interrupted(folder))
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        fail(out_of_space(folder, e))
