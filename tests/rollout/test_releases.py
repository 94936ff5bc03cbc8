"""Trajectory releases (a trace's start_s): the drivers start none before its release, on the clock
they are given, in that clock's seconds; a trajectory without one starts as it always did."""

from __future__ import annotations

import asyncio

import pytest

from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.agent.workload import Workload
from prorsa.config.pipeline import WorkloadConfig
from prorsa.rollout.drivers import Hooks, run_async, run_sync
from prorsa.sim.clock import run_virtual
from second_per_turn import SecondPerTurn


def _spec(i: int, turns: int, start_s: float | None) -> TrajectorySpec:
    return TrajectorySpec(f"t{i}", "swe", i, 0, 0, tuple(TurnSpec(10, 5, 0.0, k == turns - 1) for k in range(turns)),
                          seed=i, start_s=start_s)


# (turns, release) per trajectory of the trace
TRACE = [(2, None), (1, 3.0), (3, 0.5), (1, 10.0)]


def _drive(mode: str, trace=TRACE, clock_unit: float = 1.0, **kw) -> tuple[dict[str, float], dict[str, float], float]:
    """Starts and ends (seconds since the run began) by the trace's seed, and the makespan."""
    cfg = WorkloadConfig(trace="t.jsonl", mode=mode, **({"prompts": len(trace), "group_size": 1} | kw))
    workload = Workload(cfg, 0, family=None, trace=tuple(_spec(i, n, s) for i, (n, s) in enumerate(trace)))
    starts, ends = {}, {}

    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        def now() -> float:
            return loop.time() - t0

        def done(r) -> None:
            starts[r.spec.seed], ends[r.spec.seed] = r.start_s, r.end_s

        drive = run_sync if mode == "sync" else run_async
        await drive(workload, cfg, SecondPerTurn(), now, Hooks(done, clock_unit=clock_unit))
        return now()

    makespan = run_virtual(main())
    return starts, ends, makespan


def test_sync_starts_each_at_its_release_and_the_step_ends_with_the_last():
    starts, ends, makespan = _drive("sync")
    assert starts == pytest.approx({0: 0.0, 1: 3.0, 2: 0.5, 3: 10.0})
    assert ends == pytest.approx({0: 2.0, 1: 4.0, 2: 3.5, 3: 11.0})
    assert makespan == pytest.approx(11.0)


def test_sync_releases_count_from_each_steps_start():
    starts, ends, makespan = _drive("sync", steps=2, trace=[(2, None), (1, 3.0)])
    # step 0 ends at 4 (the released one: 3 + 1 turn); step 1's releases count from there
    assert makespan == pytest.approx(4.0 + 4.0)


def test_releases_are_wall_seconds_converted_by_the_clock_unit():
    starts, _, makespan = _drive("sync", clock_unit=0.5)  # a wall second is two of the drivers' clock
    assert starts == pytest.approx({0: 0.0, 1: 6.0, 2: 1.0, 3: 20.0})
    assert makespan == pytest.approx(21.0)


def test_without_releases_every_trajectory_starts_at_once():
    starts, _, makespan = _drive("sync", trace=[(n, None) for n, _ in TRACE])
    assert set(starts.values()) == {0.0} and makespan == 3.0


def test_async_fills_free_slots_in_release_order():
    # release order: seed 0 (none), 2 (0.5), 1 (3.0), 3 (10.0); two slots
    starts, ends, makespan = _drive("async", concurrency=2, trajectories=4)
    assert starts == pytest.approx({0: 0.0, 2: 0.5, 1: 3.0, 3: 10.0})
    assert makespan == pytest.approx(11.0)


def test_async_a_full_slot_holds_a_released_one_back():
    # one slot: seed 2 (released at 0.5) waits for seed 0 to end at 2; seed 1 (3.0) for seed 2 to end at 5;
    # seed 3 waits for its release at 10 with nothing in flight
    starts, _, makespan = _drive("async", concurrency=1, trajectories=4)
    assert starts == pytest.approx({0: 0.0, 2: 2.0, 1: 5.0, 3: 10.0})
    assert makespan == pytest.approx(11.0)


def test_async_stops_at_its_duration_even_with_releases_pending():
    starts, _, makespan = _drive("async", concurrency=4, duration_s=5.0)
    assert set(starts) == {0, 1, 2}  # the one released at 10 comes after the run stopped starting
    assert makespan == pytest.approx(4.0)


def test_async_repeats_of_a_cycled_trace_are_released_a_period_later():
    starts, _, _ = _drive("async", trace=[(1, 0.0), (1, 2.0)], concurrency=4, trajectories=6)
    assert sorted(starts.values()) == pytest.approx([0.0, 2.0, 2.0, 4.0, 4.0, 6.0])
