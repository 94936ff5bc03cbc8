"""The simulator's transport: turns go straight to emulated engines on the virtual-clock loop.

    SimTurnRunner(engines, router, now, tool_unit, dispatch_s, scheduler, context_budget)
                                          a TurnRunner (agent/loop.py), like the Dask runtime's;
                                          tool latencies are divided by tool_unit, every leg waits
                                          dispatch_s before its engine sees it (the hardware
                                          profile's dispatch_latency_s), legs are admitted by the
                                          scheduler's key (control/tail.py), and a decode's cap is
                                          what context_budget leaves (rollout/legs.py)
    run_turn(turn)                        route, run the legs on their engines, sleep the tool out
                                          (and, where the router moves the trajectory, warm its
                                          next engine meanwhile: the turn ends when both have)
    add_engine(name, engine)              an engine joins (cells: moved from another cell)
    take_events()                         the lifecycle events since the last call (for observe)
    legs_on(engine, phases)               legs of those phases on the engine now
    await drained(engine, phases)         returns once the engine holds none of them

Events are emitted at the points the live scheduler plugin reads them off task transitions
(lifecycle_plugin.py): QUEUED when the turn is routed, PREFILL/DECODE when a leg is handed to its
engine, TOOL when the decode returns, DONE when the last turn's (empty) tool returns. So a policy
sees the same stream in both bodies, without the scheduler's latency.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from typing import Callable

from prorsa.agent.loop import TurnRequest, TurnResult
from prorsa.control.lifecycle import LifecycleEvent, Phase
from prorsa.control.tail import TurnScheduler
from prorsa.engine.base import Engine
from prorsa.rollout.legs import leg_requests, turn_result, warm_request
from prorsa.rollout.router import Router


class SimTurnRunner:
    needs_token_ids = False
    vocab_size = 0

    def __init__(self, engines: dict[str, Engine], router: Router, now: Callable[[], float],
                 tool_unit: float = 1.0, dispatch_s: float = 0.0, scheduler: TurnScheduler | None = None,
                 context_budget: int | None = None) -> None:
        self.engines = engines
        self.context_budget = context_budget  # the run's, in tokens: replies are capped at what it leaves
        self.scheduler = scheduler or TurnScheduler(None)  # None: every turn alike, first come
        self.tool_unit = tool_unit  # wall seconds per body second of the workload's tool latencies
        self.dispatch_s = dispatch_s
        self.router = router
        self.now = now
        self._events: list[LifecycleEvent] = []
        self._legs: dict[str, Counter] = {e: Counter() for e in engines}  # engine -> phase -> legs
        self.prefill_backlog: dict[str, int] = dict.fromkeys(engines, 0)  # tokens of prefill legs held
        self.migrated = 0  # turns after which the trajectory moved while its tool ran (scheduling.migrate)
        self._changed: dict[str, asyncio.Event] = {}

    def add_engine(self, name: str, engine: Engine) -> None:
        """An engine joins (cells: moved from another cell); its legs are counted from now."""
        self.engines[name] = engine
        self._legs[name] = Counter()
        self.prefill_backlog[name] = 0

    def take_events(self) -> list[LifecycleEvent]:
        events, self._events = self._events, []
        return events

    def legs_on(self, engine: str, phases: tuple[str, ...]) -> int:
        held = self._legs[engine]
        return sum(held[p] for p in phases)

    async def drained(self, engine: str, phases: tuple[str, ...]) -> None:
        while self.legs_on(engine, phases):
            event = self._changed.setdefault(engine, asyncio.Event())
            event.clear()
            await event.wait()

    async def run_turn(self, turn: TurnRequest) -> TurnResult:
        start = self.now()
        context = turn.context_tokens - turn.appended_tokens
        sched = self.scheduler
        warm = None
        route = self.router.route(turn.traj_id, appended=turn.appended_tokens if turn.turn else None,
                                   context=context, remaining=sched.remaining(turn))
        self._emit(turn, Phase.QUEUED, turn.appended_tokens, context)
        sched.began(turn)
        key = sched.key(turn, start)
        pre_req, dec_req = leg_requests(turn, route, key, self.context_budget)
        try:
            pre = None
            if pre_req is not None:
                self._emit(turn, Phase.PREFILL, turn.appended_tokens, context, route.prefill)
                self.prefill_backlog[route.prefill] += turn.appended_tokens
                with self._leg(route.prefill, "prefill"):
                    try:
                        await self._dispatch()
                        pre = await self.engines[route.prefill].prefill(pre_req)
                    finally:
                        self.prefill_backlog[route.prefill] -= turn.appended_tokens
                dec_req = replace(dec_req, kv=pre.kv)
                phase = "decode"
            else:
                phase = "local" if route.local_prefill else "generate"
            self._emit(turn, Phase.DECODE, 0, context, route.decode)
            engine = self.engines[route.decode]
            with self._leg(route.decode, phase):
                await self._dispatch()
                dec = await (engine.generate(dec_req) if phase == "generate" else engine.decode(dec_req))
            left = sched.left_after(turn, dec.n_tokens)
            to = None if left is None else self.router.relocate(turn.traj_id, route, turn.context_tokens + dec.n_tokens, left)
            if to is not None:
                self.migrated += 1
                warm = asyncio.ensure_future(self._warm(to, warm_request(turn, dec.n_tokens, priority=key)))
        finally:
            self.router.finished(route)
        sched.ended(turn, dec.n_tokens, dec.decode_s)
        self._emit(turn, Phase.TOOL, dec.n_tokens, context)  # what came back: known once it has
        t_tool = self.now()
        if turn.tool_latency_s > 0:
            await asyncio.sleep(turn.tool_latency_s / self.tool_unit)
        tool_end = self.now()
        if warm is not None:
            await warm
        if turn.done:
            self._emit(turn, Phase.DONE, 0, context)
            self.router.forget(turn.traj_id)
        return turn_result(turn, pre, dec, start, self.now(), tool_end - t_tool)

    async def _warm(self, engine: str, req) -> None:
        with self._leg(engine, "warm"):
            await self._dispatch()
            await self.engines[engine].warm(req)

    async def _dispatch(self) -> None:
        # counted as the leg's (held by its engine) while in flight, as a live leg's Dask task is
        if self.dispatch_s > 0:
            await asyncio.sleep(self.dispatch_s)

    def _emit(self, turn: TurnRequest, phase: Phase, tokens: int, context: int, engine: str | None = "") -> None:
        self._events.append(LifecycleEvent(self.now(), turn.traj_id, turn.family, turn.turn, phase,
                                           tokens, context, engine or ""))

    def _leg(self, engine: str, phase: str) -> _Leg:
        return _Leg(self, engine, phase)


class _Leg:
    """Counts a leg on its engine while it runs, and wakes a switch waiting for the engine."""

    def __init__(self, runner: SimTurnRunner, engine: str, phase: str) -> None:
        self.runner, self.engine, self.phase = runner, engine, phase

    def __enter__(self) -> None:
        self.runner._legs[self.engine][self.phase] += 1

    def __exit__(self, *exc) -> None:
        self.runner._legs[self.engine][self.phase] -= 1
        event = self.runner._changed.get(self.engine)
        if event is not None:
            event.set()
