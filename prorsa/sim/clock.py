"""A virtual clock for asyncio: code that only uses the loop's time runs unchanged, instantly.

    VirtualClockLoop(start)   an event loop whose time() jumps to the next timer instead of waiting
    run_virtual(main)         asyncio.run(main) on a VirtualClockLoop; returns main's result

Anything written against `loop.time()`, `asyncio.sleep`, `asyncio.wait_for` and call_later (the
emulated engine, the agent loop's tool sleeps) runs on it unchanged. Only the wait changes
(SimPy's rt.py in reverse): the selector polls real I/O without blocking and, when none is ready,
advances virtual time by the timeout the loop asked for, which is exactly the gap to its next
timer, so timers fire in (time, scheduling) order with no wall time spent. With no timer pending
the loop blocks on real I/O as usual (a thread's call_soon_threadsafe still wakes it).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class _VirtualSelector(selectors.BaseSelector):
    """Delegates to a real selector; a select that would sleep advances the clock instead."""

    def __init__(self, loop: VirtualClockLoop):
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def select(self, timeout: float | None = None):
        events = self._real.select(0)
        if events or timeout is not None and timeout <= 0:
            return events
        if timeout is None:  # nothing scheduled: only real I/O can wake the loop
            return self._real.select(None)
        self._loop.advance(timeout)
        return []

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_key(self, fileobj):
        return self._real.get_key(fileobj)

    def get_map(self):
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0):
        self._now = float(start)  # virtual seconds; set before the base class may read time()
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (the selector calls this when the loop would sleep)."""
        if seconds > 0:
            self._now += seconds


def run_virtual(main: Coroutine[Any, Any, _T], start: float = 0.0) -> _T:
    """Run `main` to completion on a fresh virtual-clock loop, like asyncio.run."""
    out: list[_T] = []

    async def keep() -> None:
        # The result stays out of the main task: on exit the Runner restores its SIGINT handler,
        # and CPython 3.11 formats a repr of that handler, the task and its result (seconds, for
        # a rollout's worth of trajectories).
        out.append(await main)

    with asyncio.Runner(loop_factory=lambda: VirtualClockLoop(start)) as runner:
        runner.run(keep())
    return out[0]
