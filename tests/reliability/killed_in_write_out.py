"""`prorsa run` as a process that SIGKILLs itself (or sends itself WRITE_OUT_SIGNAL) at the K-th
Python call of its write-out (from the journal's finish to its seal), so a test can stop it at
instants spread over the whole window; K 0 runs it through and prints how many calls it made.

    python killed_in_write_out.py K prorsa-run-args...
"""

import os
import signal
import sys

from prorsa.metrics.journal import RunJournal

KILL_AT = int(sys.argv[1])
SIGNAL = signal.Signals[os.environ.get("WRITE_OUT_SIGNAL", "SIGKILL")]
calls = 0


def _count(frame, event, arg) -> None:
    global calls
    if event == "call":
        calls += 1
        if calls == KILL_AT:
            os.kill(os.getpid(), SIGNAL)


finish, seal = RunJournal.finish, RunJournal.seal


def _finish(self):
    sys.setprofile(_count)  # the write-out runs in the main thread, after the cluster has closed
    return finish(self)


def _seal(self):
    seal(self)
    sys.setprofile(None)
    print(f"write-out calls: {calls}", flush=True)


RunJournal.finish, RunJournal.seal = _finish, _seal

if __name__ == "__main__":
    from prorsa.cli import main

    main(sys.argv[2:], prog_name="prorsa")
