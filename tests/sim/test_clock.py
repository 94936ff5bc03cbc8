"""The virtual-clock event loop: time jumps to the next timer, order is kept, threads still work."""

from __future__ import annotations

import asyncio
import time

import pytest

from prorsa.sim.clock import VirtualClockLoop, run_virtual


def test_sleeps_advance_virtual_time_without_wall_time():
    # Whether the loop waited is read off its real selector, not a stopwatch: a select that may
    # block (a timeout above zero, or none) is a real wait, and fails the run at once.
    def never_waits(select):
        def checked(timeout=None):
            assert timeout is not None and timeout <= 0, f"a real wait of {timeout} s"
            return select(timeout)
        return checked

    async def main():
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualClockLoop)
        real = loop._selector._real
        real.select = never_waits(real.select)
        t0 = loop.time()
        await asyncio.sleep(3600)
        return loop.time() - t0, loop.timers_fired

    elapsed, fired = run_virtual(main())
    assert elapsed == pytest.approx(3600) and fired == 1  # one timer: the hour passed in one step


def test_timers_fire_in_time_order_and_wait_for_times_out_on_time():
    async def main():
        loop = asyncio.get_running_loop()
        order = []

        async def after(delay, name):
            await asyncio.sleep(delay)
            order.append((name, loop.time()))

        await asyncio.gather(after(2.0, "b"), after(1.0, "a"), after(2.0, "c"), after(0, "z"))
        start = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), timeout=5.0)
        return order, loop.time() - start

    order, waited = run_virtual(main(), start=100.0)
    assert order == [("z", 100.0), ("a", 101.0), ("b", 102.0), ("c", 102.0)]
    assert waited == pytest.approx(5.0)


def test_threads_wake_the_loop_when_no_timer_is_pending():
    async def main():
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: time.sleep(0.05) or "done")

    assert run_virtual(main()) == "done"
