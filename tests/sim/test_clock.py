"""The virtual-clock event loop: time jumps to the next timer, order is kept, threads still work."""

from __future__ import annotations

import asyncio
import time

import pytest

from prorsa.sim.clock import VirtualClockLoop, run_virtual


def test_sleeps_advance_virtual_time_without_wall_time():
    async def main():
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualClockLoop)
        t0 = loop.time()
        await asyncio.sleep(3600)
        return loop.time() - t0

    wall = time.perf_counter()
    assert run_virtual(main()) == pytest.approx(3600)
    assert time.perf_counter() - wall < 0.5


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
