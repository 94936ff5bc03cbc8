"""What every worker process does as it starts (dask's `preload`: imported and called before any
plugin, so a worker with none, a tool worker or the trainer's, gets it too).

    PRELOAD          the worker spec's `preload` list
    dask_setup(w)    quiet logs for faults the run survives (worker_logs.py), and Ctrl-C left to
                     the process that started the worker
    deaf_worker_processes() in the driver, before a cluster's Nannies start: worker processes are
                            forked from a forkserver that ignores SIGINT, so they start deaf to it

Why a worker process ignores SIGINT: Ctrl-C in a terminal reaches the whole process group, so
every Nanny's worker got it beside the run's own process, and each died in a KeyboardInterrupt
traceback of distributed's frames while the run was still winding down in order
(live/interrupt.py): saving what finished, then closing the workers itself. A worker the run did
not start (`dask worker` on another host) is left as it is: it is no child of a multiprocessing
parent, and its own Ctrl-C is its operator's.

Why a forkserver as well: a spawned worker takes seconds to import before its preload runs, and
a Ctrl-C then killed it mid-import, traceback and all. Neither a signal mask (multiprocessing's
spawn clears it) nor the driver ignoring SIGINT while it spawns (it would miss its own Ctrl-C)
closes that window; a forkserver that ignores SIGINT before it imports anything else does, and
forks each worker with distributed and Prorsa's worker modules already imported.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading

import dask

from prorsa.cluster.worker_logs import quiet_survived_faults

PRELOAD = [__name__]
# imported once by the forkserver, in this order; the first makes it (and its children) ignore SIGINT
FORKSERVER_PRELOAD = ["prorsa.cluster.forkserver_preload", "distributed", "prorsa.cluster.engine_host",
                      "prorsa.cluster.tool_host", __name__]


def dask_setup(worker) -> None:
    quiet_survived_faults()
    if spawned_by_a_run():  # what a worker spawned some other way needs
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def spawned_by_a_run() -> bool:
    """A Nanny's worker process (in-process workers share the driver's handlers, and keep them)."""
    return multiprocessing.parent_process() is not None and threading.current_thread() is threading.main_thread()


def deaf_worker_processes() -> None:
    """Nannies of this process fork their workers from a forkserver that ignores SIGINT, and that
    logs at the driver's levels. Called before the first Nanny starts (the forkserver reads its
    preloads and environment once, when it starts)."""
    from distributed.utils import get_mp_context

    # a worker process sets up its logging as it imports distributed, from the environment, before
    # any config its Nanny sends it; only local worker processes: a batch job's workers log to their
    # own files, at their own level
    levels = dask.config.get("logging", {})
    os.environ.update({f"DASK_LOGGING__{name.upper()}": str(level) for name, level in levels.items()
                       if isinstance(level, str)})
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    get_mp_context().set_forkserver_preload(FORKSERVER_PRELOAD)  # after dask's own choice, in its place
