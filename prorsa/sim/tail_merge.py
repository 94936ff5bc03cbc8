"""The simulator carrying out the tail's layout (scheduling.tail_layout; control/tail_layout.py).

    TailMerge(layout, scheduler, router, engines, runner)
    await merge.step(busy)     each control interval: if the plan says so, merge idle engines into
                               wide ones (one engine takes the wide layout, the others are lent:
                               closed to the router) and pin the remaining trajectories to them
    await merge.restore()      between synchronous steps: every wide engine, once empty, goes back
                               to its own layout and the lent engines reopen
    merged                     engines held by a merge (the role policy must leave them alone)

A merge uses only engines that hold nothing (no leg, no turn routed, no sequence): a sequence's
KV is laid out for its engine's ranks and no engine reshards KV in flight, so a trajectory moves
at its next turn, which recomputes its context on the wide engine (the emulated engine charges
that as a prefix-cache miss). The weight move is the cost model's reshard_time, charged by
EmulatedEngine.relayout. Nothing is cancelled or re-sent: a turn in flight when the merge starts
ends where it runs, so no trajectory is lost across it. One merge a step: the engines the tail
runs on are busy, so widening again would need them drained first.
"""

from __future__ import annotations

import asyncio

from prorsa.control.tail import TurnScheduler
from prorsa.control.tail_layout import TailLayout, TailPlan
from prorsa.costmodel import RoleCosts
from prorsa.engine.emulated import EmulatedEngine
from prorsa.rollout.legs import DECODE_LEGS, PREFILL_LEGS, WARM_LEGS
from prorsa.rollout.router import Router
from prorsa.sim.runner import SimTurnRunner

ALL_LEGS = PREFILL_LEGS + DECODE_LEGS + WARM_LEGS


class TailMerge:
    def __init__(self, layout: TailLayout, scheduler: TurnScheduler, router: Router,
                 engines: dict[str, EmulatedEngine], runner: SimTurnRunner) -> None:
        self.layout, self.scheduler, self.router = layout, scheduler, router
        self.engines, self.runner = engines, runner
        self.wide: dict[str, RoleCosts] = {}  # wide engine -> the layouts it had before
        self.lent: set[str] = set()
        self.plans: list[tuple[float, TailPlan]] = []  # (time, plan) of every merge, for tests and reports
        self._done = False  # merged this step already
        self._task: asyncio.Task | None = None

    @property
    def merged(self) -> set[str]:
        return set(self.wide) | self.lent

    def idle(self, busy: set[str]) -> list[str]:
        """Engines holding nothing, in engine order (ties break by it, so runs repeat)."""
        loads = {e: eng.load() for e, eng in self.engines.items()}
        return [e for e in sorted(self.engines)
                if e not in busy and e not in self.router.closed and not self.router.load[e]
                and not loads[e].active and not loads[e].queued and not self.runner.legs_on(e, ALL_LEGS)]

    async def step(self, now: float, busy: set[str]) -> TailPlan | None:
        if self._done:
            return None
        idle = self.idle(busy)
        left = self.scheduler.in_flight()
        plan = self.layout.plan([x for _, x in left], len(idle))
        if plan is None or plan.kind != "widen":
            return None  # all-decode is priced, never carried out: it never beats staying (tail_layout.py)
        hosts = [e for e in idle if self.engines[e].role.serves_decode][:plan.wide]
        spare = [e for e in idle if e not in hosts]
        groups = []
        for host in hosts:
            if len(spare) < plan.width - 1:
                break
            groups.append((host, spare[:plan.width - 1]))
            spare = spare[plan.width - 1:]
        if not groups:
            return None
        self._done = True
        self.plans.append((now, plan))
        wide = self.layout.wide_cost(plan.width)
        for host, lent in groups:  # nothing may be routed to them while the weights move
            self.router.close(host)
            for e in lent:
                self.router.close(e)
                self.lent.add(e)
            self.wide[host] = self.engines[host].layouts
        await asyncio.gather(*(self._widen(host, wide) for host, _ in groups))
        # read again: a trajectory may have ended while the weights moved
        for i, (tid, _) in enumerate(self.scheduler.in_flight()):  # longest predicted remainder first, round the wide engines
            self.router.pin(tid, groups[i % len(groups)][0])
        return plan

    async def _widen(self, host: str, wide) -> None:
        eng = self.engines[host]
        eng.layouts = RoleCosts.uniform(wide)
        await eng.relayout(eng.role)
        self.router.reopen(host)

    async def restore(self) -> None:
        self._done = False
        if not self.wide:
            return
        hosts, self.wide = self.wide, {}
        for host in hosts:
            self.router.close(host)
        await asyncio.gather(*(self._narrow(host, layouts) for host, layouts in hosts.items()))
        for e in self.lent:
            self.router.reopen(e)
        self.lent = set()

    async def _narrow(self, host: str, layouts: RoleCosts) -> None:
        await self.runner.drained(host, ALL_LEGS)
        eng = self.engines[host]
        eng.layouts = layouts
        await eng.relayout(eng.role)
        self.router.reopen(host)
