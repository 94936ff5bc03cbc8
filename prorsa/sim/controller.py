"""The simulator's control loop: the same ControlLoop and policy as live, on the engines directly.

    SimController(policy, router, runner, engines, recorder, interval_s, now)
    observe()                      events from the runner, loads from the engines (EmulatedEngine's
                                   queued, active, kv_tokens, kv_capacity, engine_id)
    tail                           the tail's layout (scheduling.tail_layout: sim/tail_merge.py),
                                   asked once an interval after the policy; None when off
    engines_changed()              an engine joined or left `engines` (cells: a move between cells)
    carry_out(engine, old, new)    the live protocol without the transport: the router already
                                   stopped sending old-role work; the engine serves both while the
                                   legs it holds of the old role finish, then serves only the new;
                                   into another layout (engines.parallelism), or across the KV
                                   connector's sides by restart (engines.role_switch), it takes no
                                   work until it is empty, then reshards or restarts

No leg moves between engines in either body, so a switch costs the same drain in both.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from prorsa.control.policy import Decision, Policy, Snapshot
from prorsa.engine.emulated import EmulatedEngine
from prorsa.metrics.recorder import RunRecorder
from prorsa.roles import Role, restarts_kv
from prorsa.rollout.control_loop import ControlLoop
from prorsa.rollout.legs import DECODE_LEGS, PREFILL_LEGS, WARM_LEGS, legs_to_drain
from prorsa.rollout.router import Router
from prorsa.sim.runner import SimTurnRunner
from prorsa.sim.tail_merge import TailMerge


def _no_cpu() -> float:
    return 0.0


class SimController(ControlLoop):
    # nothing in virtual time throttles on CPU or reports it, and a thread's CPU clock is a system
    # call: six a step took a sixth of a warm SWE MoE cell's simulation on a loaded machine
    cpu_clock = staticmethod(_no_cpu)

    def __init__(self, policy: Policy, router: Router, runner: SimTurnRunner, engines: dict[str, EmulatedEngine],
                 recorder: RunRecorder, interval_s: float, now: Callable[[], float]) -> None:
        super().__init__(policy, router, recorder, interval_s, now)
        self.runner = runner
        self.engines = engines
        self._sorted = [engines[e] for e in sorted(engines)]
        self.tail: TailMerge | None = None

    async def decide(self, snap: Snapshot) -> Decision:
        decision = await super().decide(snap)
        if self.tail is None:
            return decision
        held = self.tail.merged  # a merged engine keeps its role until the step ends
        if held:
            decision = replace(decision, targets={e: r for e, r in decision.targets.items() if e not in held})
        await self.tail.step(self.now(), set(self._switching) | set(decision.targets))
        return decision

    async def before_step(self, step: int) -> None:
        if self.tail is not None:
            await self.tail.restore()
        await super().before_step(step)

    def engines_changed(self) -> None:
        self._sorted = [self.engines[e] for e in sorted(self.engines)]

    async def observe(self) -> Snapshot:
        # The engines' load, not stats(): this runs every interval for every engine.
        backlog = self.runner.prefill_backlog
        engines = tuple(e.load(queued_prefill_tokens=backlog[e.engine_id]) for e in self._sorted)
        return Snapshot(time_s=self.now(), engines=engines, events=tuple(self.runner.take_events()))

    def empties(self, engine: str, old: Role, new: Role) -> bool:
        e = self.engines[engine]
        return e.reshards(new) or (e.cost.restart_s is not None and restarts_kv(old, new))

    async def carry_out(self, engine: str, old: Role, new: Role) -> None:
        e = self.engines[engine]
        if self.empties(engine, old, new):  # the router sends it nothing: every leg it holds finishes
            await self.runner.drained(engine, PREFILL_LEGS + DECODE_LEGS + WARM_LEGS)
            await e.relayout(new)
            await e.restart_as(new)
            return
        drain = legs_to_drain(new)
        self.engines[engine].set_role(Role.MIXED if drain else new)
        await self.runner.drained(engine, drain)
        self.engines[engine].set_role(new)
