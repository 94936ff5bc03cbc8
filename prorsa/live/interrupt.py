"""Ctrl-C and SIGTERM for a live run: the rollout stops, the cleanup runs to its end.

    await run_interruptible(coro)      run a live run; a signal ends it with Interrupted (after its
                                       cleanup: journal flushed, engines, cluster and jobs stopped)
    await guarded(task)                inside it: await the rollout `task`; on a signal, cancel it
                                       until it has unwound, then raise Interrupted

Why not asyncio.run's own handler: it cancels the main task once, and a single cancellation can
be absorbed on the way (a library's wait_for racing it, on Python 3.11), after which the run
carried on as if nothing had happened. Cancelling the whole main task again would cut its
cleanup short, so only the rollout is cancelled again (every RECANCEL_S) until it is done; the
code around it then unwinds normally. A signal before the rollout starts cancels the main task
once, as asyncio.run would; a second signal raises KeyboardInterrupt at once.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any

RECANCEL_S = 1.0


class Interrupted(Exception):
    """The run was stopped by a signal; what finished is saved."""


class _Watch:
    def __init__(self, main: asyncio.Task) -> None:
        self.main = main
        self.signalled = asyncio.Event()
        self.rollout: asyncio.Task | None = None
        self.count = 0

    def on_signal(self) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.signalled.set()
        if self.rollout is None:
            self.main.cancel()


_watch: _Watch | None = None


async def run_interruptible(coro: Coroutine[Any, Any, Any]) -> Any:
    global _watch
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    _watch = _Watch(task)
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, _watch.on_signal)
    try:
        return await task
    except asyncio.CancelledError:
        if _watch.signalled.is_set():
            raise Interrupted from None
        raise
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
        while not rollout.done():
            rollout.cancel()
            await asyncio.wait({rollout}, timeout=RECANCEL_S)
        if watch.signalled.is_set():
            raise Interrupted
        return rollout.result()
    finally:
        watch.rollout = None
