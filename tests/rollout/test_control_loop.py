"""The control loop both bodies share, with a body that does nothing but record."""

from __future__ import annotations

import asyncio

from prorsa.agent.loop import TrajectoryResult, TurnResult
from prorsa.agent.workload import TrajectorySpec, TurnSpec
from prorsa.control.lifecycle import LifecycleEvent, Phase
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


class Looking(ControlLoop):
    """A body whose look takes a while: it reports what had happened when the look began, and
    the driver may see a trajectory end before the look returns (live: the scheduler call)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.happened: list[LifecycleEvent] = []
        self.ends_during_look: list[TrajectoryResult] = []

    async def observe(self) -> Snapshot:
        found, self.happened = tuple(self.happened), []
        await asyncio.sleep(0)
        for result in self.ends_during_look:
            self.trajectory_done(result)
        self.ends_during_look = []
        return Snapshot(time_s=self.now(), engines=(), events=found)


def test_an_end_the_driver_sees_during_the_look_waits_for_the_next_step():
    """The driver sees a trajectory end only after the body's last events for it; if it sees it
    while the body is looking, the look may have missed those events: the DONE goes with the next
    step, after them, never before its last turn's TOOL."""
    policy = Seen()
    loop = Looking(policy, Router({"e0": Role.MIXED}), RunRecorder(["e0"], 4, None), 1.0, lambda: 7.0)
    spec = TrajectorySpec("a1", "swe", 0, 0, 0, (TurnSpec(10, 5, 0.1, True),), 1)
    result = TrajectoryResult(spec=spec, turns=[TurnResult("a1", 0, "", "e0", 10, 0, 5)], status="completed")

    def ev(phase: Phase) -> LifecycleEvent:
        return LifecycleEvent(7.0, "a1", "swe", 0, phase)

    async def main():
        loop.happened = [ev(Phase.QUEUED), ev(Phase.DECODE)]
        loop.ends_during_look = [result]  # its decode ended after the look began, then the trajectory
        await loop.step()
        loop.happened = [ev(Phase.TOOL), ev(Phase.DONE)]  # what that look missed
        await loop.step()
        await loop.step()

    asyncio.run(main())
    shown = [[e.phase for e in snap.events] for snap in policy.snaps]
    assert shown == [[Phase.QUEUED, Phase.DECODE], [Phase.TOOL, Phase.DONE, Phase.DONE], []]


class Asks:
    """Asks for the targets it is given, one decision per step."""
    name = "asks"

    def __init__(self, *targets: dict[str, Role]):
        self.targets = list(targets)

    def initial_roles(self, n):
        return [Role.PREFILL] * n

    def decide(self, snap):
        return Decision(self.targets.pop(0) if self.targets else {})


class Gated(Quiet):
    """A switch that lasts until the test opens its gate."""

    def __init__(self, *args):
        super().__init__(*args)
        self.gate = asyncio.Event()
        self.done: list[tuple[str, Role, Role]] = []

    async def carry_out(self, engine, old, new):
        await self.gate.wait()
        self.done.append((engine, old, new))


def test_a_target_on_an_engine_mid_switch_is_carried_out_after_it_not_dropped():
    """A policy plans on the roles it asked for: a target that finds its engine switching waits for
    that switch and then runs (the latest target winning), rather than vanishing behind the policy's back."""
    async def main():
        policy = Asks({"e0": Role.DECODE}, {"e0": Role.MIXED}, {"e0": Role.PREFILL})
        loop = Gated(policy, Router({"e0": Role.PREFILL, "e1": Role.PREFILL, "e2": Role.DECODE}),
                     RunRecorder(["e0", "e1", "e2"], 4, None), 1.0, lambda: 0.0)
        await loop.step()  # P -> D starts and waits at the gate
        await loop.step()  # MIXED asked mid-switch
        await loop.step()  # PREFILL asked mid-switch: the latest wins
        assert loop.switching == {"e0"} and loop.done == []
        loop.gate.set()
        await asyncio.sleep(0)
        while loop.switching:
            await asyncio.sleep(0)
        assert loop.router.roles["e0"] is Role.DECODE
        await loop.step()  # the deferred PREFILL starts
        while loop.switching:
            await asyncio.sleep(0)
        return loop
    loop = asyncio.run(main())
    assert loop.done == [("e0", Role.PREFILL, Role.DECODE), ("e0", Role.DECODE, Role.PREFILL)]
    assert loop.router.roles["e0"] is Role.PREFILL


def test_a_target_for_a_held_engine_waits_for_its_release():
    async def main():
        loop = Gated(Asks({"e0": Role.DECODE}), Router({"e0": Role.PREFILL, "e1": Role.PREFILL}),
                     RunRecorder(["e0", "e1"], 4, None), 1.0, lambda: 0.0)
        loop.gate.set()
        await loop.hold("e0")
        await loop.step()
        assert loop.done == [] and loop.router.roles["e0"] is Role.PREFILL
        loop.release("e0")
        await loop.step()
        while loop.switching:
            await asyncio.sleep(0)
        return loop
    loop = asyncio.run(main())
    assert loop.done == [("e0", Role.PREFILL, Role.DECODE)]


def test_no_switch_closes_the_last_open_engine_of_a_phase():
    """Two switches away from decode asked in one interval, or in consecutive ones: the second
    waits until an engine that serves decode is open again, and a split with no decode at all
    never starts."""
    async def main():
        policy = Asks({"d0": Role.PREFILL}, {"d1": Role.PREFILL}, {}, {"d0": Role.DECODE})
        loop = Gated(policy, Router({"p": Role.PREFILL, "d0": Role.DECODE, "d1": Role.DECODE}),
                     RunRecorder(["p", "d0", "d1"], 4, None), 1.0, lambda: 0.0)
        await loop.step()  # d0 closes to drain its decodes: d1 still serves decode
        await loop.step()  # d1 would close the last open decode engine: it waits
        await asyncio.sleep(0)
        assert loop.switching == {"d0"} and loop.router.closed == {"d0"}
        loop.gate.set()
        while loop.switching:
            await asyncio.sleep(0)
        await loop.step()  # d0 is prefill now: d1 would leave no decode engine at all: still waits
        assert loop.switching == set() and loop.router.roles["d1"] is Role.DECODE
        await loop.step()  # d0 back to decode (prefill -> decode closes nothing)
        while loop.switching:
            await asyncio.sleep(0)
        await loop.step()  # d1's wait is over: d0 serves decode
        while loop.switching:
            await asyncio.sleep(0)
        return loop
    loop = asyncio.run(main())
    assert loop.done == [("d0", Role.DECODE, Role.PREFILL), ("d0", Role.PREFILL, Role.DECODE),
                         ("d1", Role.DECODE, Role.PREFILL)]


def test_two_switches_asked_at_once_do_not_close_both_decode_engines():
    async def main():
        loop = Gated(Asks({"d0": Role.PREFILL, "d1": Role.PREFILL}),
                     Router({"p": Role.PREFILL, "d0": Role.DECODE, "d1": Role.DECODE}),
                     RunRecorder(["p", "d0", "d1"], 4, None), 1.0, lambda: 0.0)
        await loop.step()
        await asyncio.sleep(0)
        assert loop.switching == {"d0"} and loop.router.closed == {"d0"} and set(loop._deferred) == {"d1"}
        loop.gate.set()
    asyncio.run(main())


def test_an_engine_does_not_leave_its_cell_as_the_last_open_engine_of_a_phase():
    """Cells: the coordinator chose d0 while d1 also served decode; d1's switch to prefill, under
    way, ends first, and then d0 stays (leave_loop says False) rather than closing the cell's
    decode."""
    from prorsa.rollout.cells import leave_loop

    async def main():
        loop = Gated(Asks({"d1": Role.PREFILL}), Router({"p": Role.PREFILL, "d0": Role.DECODE, "d1": Role.DECODE}),
                     RunRecorder(["p", "d0", "d1"], 4, None), 1.0, lambda: 0.0)
        await loop.step()
        await asyncio.sleep(0)
        assert loop.spares("d0") is False  # d1 is closed, draining to prefill
        drained = []

        async def drain(e):
            drained.append(e)
        leaving = asyncio.ensure_future(leave_loop(loop, "d0", drain))
        await asyncio.sleep(0)
        loop.gate.set()
        left = await leaving
        assert left is False and drained == [] and loop.switching == set()
        assert loop.router.roles == {"p": Role.PREFILL, "d0": Role.DECODE, "d1": Role.PREFILL}
        assert not loop.router.closed
        loop.router.set_role("p", Role.MIXED)  # now another engine serves decode: d0 may go
        assert await leave_loop(loop, "d0", drain) is True and drained == ["d0"] and "d0" not in loop.router.roles
    asyncio.run(main())


class AsksAndSees(Asks):
    def __init__(self, *targets):
        super().__init__(*targets)
        self.snaps: list[Snapshot] = []

    def decide(self, snap):
        self.snaps.append(snap)
        return super().decide(snap)


def test_the_policy_sees_which_switches_are_under_way():
    """A draining engine reports the role it serves meanwhile; the snapshot names where it is going,
    for as long as the switch lasts and no longer."""
    async def main():
        policy = AsksAndSees({"e0": Role.DECODE})
        loop = Gated(policy, Router({"e0": Role.PREFILL, "e1": Role.PREFILL, "e2": Role.DECODE}),
                     RunRecorder(["e0", "e1", "e2"], 4, None), 1.0, lambda: 0.0)
        await loop.step()  # P -> D starts and waits at the gate
        await loop.step()
        loop.gate.set()
        while loop.switching:
            await asyncio.sleep(0)
        await loop.step()
        return policy.snaps
    first, during, after = asyncio.run(main())
    assert first.heading == {} and during.heading == {"e0": Role.DECODE} and after.heading == {}
