"""What the cluster's processes log about faults the run survives: a line each, no traceback.

    quiet_survived_faults()   once per process: the driver (scheduler, in-process workers) when it
                              starts a cluster, every worker process as it starts (worker_setup.py)

distributed logs two kinds of such faults as errors with their tracebacks:
  - a leg that failed because its engine went down ("Compute Failed" with EngineUnavailable or
    KvTransferFailed): the turn's retry says so in a line (live/runtime.py); dropped here
  - a connection to a process that died, found closed mid-exchange: a worker fetching a leg's
    result from it ("Worker stream died during communication"), a worker serving one to it
    ("failed during get data with ..."), a handler whose caller went ("Lost connection to ...").
    Each is a closed stream chained to a closed comm, two tracebacks of distributed's own frames;
    the scheduler fetches the data again or re-runs the leg that made it. Kept, as one line
    naming the error, at WARNING at most
Anything else keeps its traceback.
"""

from __future__ import annotations

import logging

from distributed.comm.core import CommClosedError
from tornado.iostream import StreamClosedError

# failures a turn's retry re-runs from token history (live/runtime.py)
_RETRIED = ("EngineUnavailable(", "KvTransferFailed(")
# a filter sees only what its own logger logs, not its children's: every module that logs a comm
_LOGGERS = ("distributed.worker", "distributed.core", "distributed.scheduler", "distributed.nanny",
            "distributed.batched", "distributed.client", "distributed.comm.tcp", "distributed.comm.utils",
            "distributed.utils", "distributed.utils_comm")


def _connection_closed(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 8:  # the error or what it was raised from
        if isinstance(exc, (CommClosedError, StreamClosedError)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class SurvivedFaults(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        args = record.args if isinstance(record.args, tuple) else ()
        if msg.startswith("Compute Failed") and len(args) > 3 and str(args[3]).startswith(_RETRIED):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if _connection_closed(exc):
            record.msg = f"{record.getMessage()} ({type(exc).__name__}: {exc})"
            record.args = ()
            record.exc_info, record.exc_text = None, None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_QUIET = SurvivedFaults()


def quiet_survived_faults() -> None:
    for name in _LOGGERS:
        logging.getLogger(name).addFilter(_QUIET)  # the same object: added once
