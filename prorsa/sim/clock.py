"""A virtual clock for asyncio: code that only uses the loop's time runs unchanged, instantly.

    VirtualClockLoop(start)   an event loop whose time() jumps to the next timer instead of waiting;
                              timers_fired counts the timers it has run (the simulation's events)
    run_virtual(main)         asyncio.run(main) on a VirtualClockLoop; returns main's result

Anything written against `loop.time()`, `asyncio.sleep`, `asyncio.wait_for` and call_later (the
emulated engine, the agent loop's tool sleeps) runs on it unchanged. Only the wait changes
(SimPy's rt.py in reverse): the selector polls real I/O without blocking and, when none is ready,
advances virtual time by the timeout the loop asked for, which is exactly the gap to its next
timer, so timers fire in (time, scheduling) order with no wall time spent. With no timer pending
the loop blocks on real I/O as usual (a thread's call_soon_threadsafe still wakes it).

Speed: a simulated rollout runs ~10^6 loop iterations, most of them one callback each, so the
loop's own iteration (`_run_once`) is replaced by one that does the same in the same order with
less per-iteration work: real I/O is polled only when virtual time is about to move (a poll with
callbacks ready could only add work at the same instant, which a later poll finds just as well),
and timers sit in the heap as (when, handle) pairs, compared in C. A tie in `when` falls through
to TimerHandle.__lt__, which is False both ways as it is in asyncio's own heap of handles, so the
heap evolves, and equal-time timers fire, exactly as they would there.
"""

from __future__ import annotations

import asyncio
import heapq
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class _VirtualSelector(selectors.BaseSelector):
    """Delegates to a real selector; a select that would sleep advances the clock instead."""

    def __init__(self, loop: VirtualClockLoop):
        self._real = selectors.DefaultSelector()
        self._loop = loop
        self._watched = 0  # registered files; the first is the loop's own wake-up pipe

    def select(self, timeout: float | None = None):
        # With only the wake-up pipe watched there is nothing to poll before moving time: a
        # thread's call_soon_threadsafe puts its callback in the ready queue itself, and the
        # pipe is read when the loop next blocks.
        if timeout is not None and timeout > 0 and self._watched <= 1:
            self._loop.advance(timeout)
            return []
        events = self._real.select(0)
        if events or timeout is not None and timeout <= 0:
            return events
        if timeout is None:  # nothing scheduled: only real I/O can wake the loop
            return self._real.select(None)
        self._loop.advance(timeout)
        return []

    def register(self, fileobj, events, data=None):
        key = self._real.register(fileobj, events, data)
        self._watched += 1
        return key

    def unregister(self, fileobj):
        key = self._real.unregister(fileobj)
        self._watched -= 1
        return key

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_key(self, fileobj):
        return self._real.get_key(fileobj)

    def get_map(self):
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


# asyncio's own thresholds (base_events.py), kept so that cancelled timers are swept out of the
# heap at the same moments and the heap, ties included, stays the same.
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5
_MAXIMUM_SELECT_TIMEOUT = 24 * 3600


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0):
        self._now = float(start)  # virtual seconds; set before the base class may read time()
        self._timers: list[tuple[float, asyncio.TimerHandle]] = []  # heap; asyncio's _scheduled stays empty
        self.timers_fired = 0  # the simulation's events: each is a moment virtual time reaches
        super().__init__(selector=_VirtualSelector(self))

    def call_at(self, when, callback, *args, context=None) -> asyncio.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()
        if self._debug:
            self._check_thread()
            self._check_callback(callback, "call_at")
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        if timer._source_traceback:
            del timer._source_traceback[-1]
        heapq.heappush(self._timers, (when, timer))
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """BaseEventLoop._run_once on the timer heap above, polling real I/O only when idle.
        (Debug mode's slow-callback warning is left out: callbacks take no virtual time.)"""
        timers, ready = self._timers, self._ready
        n = len(timers)
        if (n > _MIN_SCHEDULED_TIMER_HANDLES
                and self._timer_cancelled_count / n > _MIN_CANCELLED_TIMER_HANDLES_FRACTION):
            kept = []
            for entry in timers:
                if entry[1]._cancelled:
                    entry[1]._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            self._timers = timers = kept
            self._timer_cancelled_count = 0
        else:
            while timers and timers[0][1]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(timers)[1]._scheduled = False

        if not ready and not self._stopping:
            timeout = min(max(0, timers[0][0] - self._now), _MAXIMUM_SELECT_TIMEOUT) if timers else None
            self._process_events(self._selector.select(timeout))

        end_time = self._now + self._clock_resolution
        while timers and timers[0][0] < end_time:
            handle = heapq.heappop(timers)[1]
            handle._scheduled = False
            if not handle._cancelled:
                self.timers_fired += 1
            ready.append(handle)

        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()
        handle = None  # breaks a reference cycle when a callback raised

    def close(self) -> None:
        super().close()
        self._timers.clear()

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
