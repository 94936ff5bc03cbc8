"""Ctrl-C and SIGTERM for a live run: the rollout stops, the cleanup runs to its end.

    await run_interruptible(coro[, abandon][, wind_down])
                                       run a live run; a signal ends it with Interrupted (after its
                                       cleanup: journal flushed, engines, cluster and jobs stopped);
                                       past HARD_STOP_S the process ends anyway (below); with
                                       `wind_down` (prorsa serve) a signal during the rollout calls
                                       it and gives the rollout WIND_DOWN_S to end by itself: a
                                       rollout that does is a run that finished (its cleanup gets a
                                       fresh HARD_STOP_S), one that does not is cancelled as above
    await guarded(task)                inside it: await the rollout `task`; on a signal, cancel it
                                       until it has unwound, then raise Interrupted
    kill_children()                    end what the cleanup left running, on the way out
    with stops_hard(abandon):          a command with no event loop of its own (prorsa sweep): a
                                       signal raises KeyboardInterrupt, as Ctrl-C does, and arms
                                       the same hard stop for the cleanup that follows

Why not asyncio.run's own handler: it cancels the main task once, and a single cancellation can
be absorbed on the way (a library's wait_for racing it, on Python 3.11), after which the run
carried on as if nothing had happened. Cancelling the whole main task again would cut its
cleanup short, so only the rollout is cancelled again (every RECANCEL_S) until it is done; the
code around it then unwinds normally. A signal before the rollout starts cancels the main task
once, as asyncio.run would; a second signal raises KeyboardInterrupt at once.

Why a hard stop: a signal reaches asyncio only when its event loop next runs, and code that holds
the loop (a library building thousands of workers in one go) or a cleanup that does not end (a
cluster closing workers still starting) would keep the run alive for minutes. HARD_STOP_S after
the first signal a timer thread asks `abandon` for the error line (it may tidy the run directory),
kills every process the run started and exits: what the journal committed stays (as after a
SIGKILL, `--resume` runs the rest). The timer stays armed after run_interruptible returns: the
process is on its way out, and its shutdown may hang too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import psutil

RECANCEL_S = 1.0
WIND_DOWN_S = 5.0
HARD_STOP_S = 10.0
HARD_STOP_EXIT = 2  # as the command's own error exit


class Interrupted(Exception):
    """The run was stopped by a signal; what finished is saved."""


class _Watch:
    def __init__(self, main: asyncio.Task, abandon: Callable[[], str],
                 wind_down: Callable[[], None] | None = None) -> None:
        self.main = main
        self.abandon = abandon
        self.wind_down = wind_down
        self.signalled = asyncio.Event()
        self.rollout: asyncio.Task | None = None
        self.count = 0
        self.timer: threading.Timer | None = None

    def arm(self, signum: int, frame: Any) -> None:
        """The interpreter-level handler: it runs between two bytecodes of the main thread, so
        even while the event loop is held (asyncio's own dispatch still follows through the
        loop's wakeup fd)."""
        if self.timer is None:
            self.timer = threading.Timer(HARD_STOP_S, self.hard_stop)
            self.timer.daemon = True
            self.timer.start()

    def rearm(self) -> None:
        """The rollout wound down by itself: the cleanup after it gets HARD_STOP_S of its own."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.arm(0, None)

    def hard_stop(self) -> None:
        try:
            message = self.abandon()
        except Exception as e:  # the exit must happen whatever tidying the run directory met
            message = f"interrupted ({type(e).__name__} while tidying up)"
        kill_children()
        sys.stderr.write(f"error: {message} (stopped hard: the run did not end within {HARD_STOP_S:g} s)\n")
        sys.stderr.flush()
        os._exit(HARD_STOP_EXIT)

    def on_signal(self) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.signalled.set()
        if self.rollout is None:
            self.main.cancel()


_watch: _Watch | None = None


def kill_children() -> None:
    """Every process this one started and that is still there: on the way out after a stop, only
    what the orderly cleanup could not end (a worker cut off mid-start, which would otherwise die
    later on its own, in a traceback about its parent gone). Its own children first: a forkserver
    (cluster/worker_setup.py) killed before its workers forks none for a request still queued."""
    me = psutil.Process()
    everyone = me.children(recursive=True)  # before a kill orphans the grandchildren
    for child in sorted(everyone, key=lambda p: _ppid(p) != me.pid):
        try:
            if not _resource_tracker(child):
                child.kill()
        except psutil.Error:  # gone already
            pass


def _ppid(proc: psutil.Process) -> int:
    try:
        return proc.ppid()
    except psutil.Error:
        return -1


def _resource_tracker(proc: psutil.Process) -> bool:
    """multiprocessing's resource tracker ends by itself once this process has gone, after
    unlinking what the workers left behind; killed, it would leave that for good."""
    return any("multiprocessing.resource_tracker" in arg for arg in proc.cmdline())


async def run_interruptible(coro: Coroutine[Any, Any, Any],
                            abandon: Callable[[], str] = lambda: "interrupted",
                            wind_down: Callable[[], None] | None = None) -> Any:
    """`abandon`: called (from a thread) when the hard stop comes, returns its error line;
    `wind_down`: asks the rollout to end by itself (called once, on the first signal)."""
    global _watch
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    _watch = _Watch(task, abandon, wind_down)
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, _watch.on_signal)
        signal.signal(sig, _watch.arm)  # after asyncio's, which it replaces; the wakeup fd stays
    try:
        result = await task
    except asyncio.CancelledError:
        if _watch.signalled.is_set():
            raise Interrupted from None
        raise
    else:
        # a signal during the write-out (synchronous: the loop sees it only once that is done) or
        # as the run ended stops it as one during the rollout would, with what it wrote kept; a
        # wind-down (prorsa serve) that ended the rollout by itself is a stop the caller says
        if _watch.timer is not None and _watch.wind_down is None:
            raise Interrupted
        return result
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        _watch = None


async def guarded(rollout: asyncio.Task) -> Any:
    """Without run_interruptible around it (tests, the simulator): a plain await."""
    watch = _watch
    if watch is None:
        return await rollout
    watch.rollout = rollout
    try:
        stop = asyncio.ensure_future(watch.signalled.wait())
        try:
            await asyncio.wait({rollout, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if watch.signalled.is_set() and watch.wind_down is not None and not rollout.done():
            watch.wind_down()
            await asyncio.wait({rollout}, timeout=WIND_DOWN_S)
            if rollout.done() and not rollout.cancelled() and rollout.exception() is None:
                watch.rearm()
                return rollout.result()
        while not rollout.done():
            rollout.cancel()
            await asyncio.wait({rollout}, timeout=RECANCEL_S)
        if watch.signalled.is_set():
            raise Interrupted
        return rollout.result()
    finally:
        watch.rollout = None


@contextlib.contextmanager
def stops_hard(abandon: Callable[[], str] = lambda: "interrupted") -> Iterator[None]:
    """SIGTERM as Ctrl-C; after either, HARD_STOP_S for the cleanup (closing a cluster whose
    jobs or workers do not answer) before the process ends anyway."""
    watch = _Watch(None, abandon)  # type: ignore[arg-type]  # no task to cancel: the interrupt is the exception

    def on_signal(signum: int, frame: Any) -> None:
        first = watch.timer is None
        watch.arm(signum, frame)
        if first:
            raise KeyboardInterrupt

    signals = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
