"""The control loop both bodies share, with a body that does nothing but record."""

from __future__ import annotations

import asyncio

from prorsa.agent.loop import TrajectoryResult, TurnResult
from prorsa.agent.workload import TrajectorySpec, TurnSpec
from prorsa.control.lifecycle import Phase
from prorsa.control.policy import Decision, Snapshot
from prorsa.metrics.recorder import RunRecorder
from prorsa.roles import Role
from prorsa.rollout.control_loop import ControlLoop
from prorsa.rollout.router import Router


class Seen:
    name = "seen"

    def __init__(self):
        self.snaps: list[Snapshot] = []

    def initial_roles(self, n):
        return [Role.MIXED] * n

    def decide(self, snap):
        self.snaps.append(snap)
        return Decision({})


class Quiet(ControlLoop):
    async def observe(self) -> Snapshot:
        return Snapshot(time_s=self.now(), engines=())


def test_a_trajectory_the_driver_saw_end_reaches_the_policy_once():
    """An agent that answers early ends without a last-turn task: the driver's DONE reaches the
    policy in the next step's events, and only there."""
    policy = Seen()
    loop = Quiet(policy, Router({"e0": Role.MIXED}), RunRecorder(["e0"], 4, None), 1.0, lambda: 7.0)
    spec = TrajectorySpec("a1", "swe", 0, 0, 0, (TurnSpec(10, 5, 0.1, False), TurnSpec(3, 2, 0.0, True)), 1)
    result = TrajectoryResult(spec=spec, turns=[TurnResult("a1", 0, "", "e0", 10, 0, 5)], status="completed")
    loop.trajectory_done(result)
    asyncio.run(loop.step())
    asyncio.run(loop.step())
    first, second = policy.snaps
    (ev,) = first.events
    assert (ev.traj_id, ev.turn, ev.phase, ev.time_s) == ("a1", 0, Phase.DONE, 7.0)
    assert second.events == ()
