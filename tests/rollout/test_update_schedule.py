"""Asynchronous weight updates on a clock (workload.weight_update_every_s): a trainer that publishes
every X seconds, however many trajectories finished meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from prorsa.agent.workload import Workload
from prorsa.config.pipeline import WorkloadConfig
from prorsa.rollout.drivers import Hooks, run_async
from prorsa.sim.clock import run_virtual
from second_per_turn import SecondPerTurn


def updates_at(every: float | None, **kw) -> tuple[list[float], int, float]:
    cfg = WorkloadConfig(family="search", mode="async", prompts=2, group_size=2, concurrency=4, trajectories=24,
                         max_turns=3, weight_update_every_s=every, **kw)
    started: list[float] = []
    done: list[str] = []

    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        def now() -> float:
            return loop.time() - t0

        async def update() -> None:
            started.append(now())
            await asyncio.sleep(0.5)

        await run_async(Workload.from_config(cfg, 3), cfg, SecondPerTurn(), now,
                        Hooks(lambda r: done.append(r.spec.traj_id), update_weights=update))
        return now()

    end = run_virtual(main())
    return started, len(done), end


def test_updates_start_on_the_clock_while_rollout_goes_on():
    started, done, end = updates_at(2.5)
    assert done == 24
    assert started == pytest.approx([2.5 * k for k in range(1, len(started) + 1)])  # on schedule, never late
    assert len(started) == int(end // 2.5) or len(started) == int(end // 2.5) - 1  # none after the last start


def test_without_a_clock_updates_follow_the_finished_count():
    started, done, _ = updates_at(None)
    assert done == 24 and len(started) == 24 // 4 - 1  # every 4 finished, but not after the last


def test_a_clock_schedule_needs_async_mode():
    with pytest.raises(ValueError, match="weight_update_every_s .* needs mode async"):
        WorkloadConfig(family="search", mode="sync", weight_update_every_s=5.0)
