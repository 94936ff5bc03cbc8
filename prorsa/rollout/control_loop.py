"""The control loop both bodies share: observe -> policy.decide -> switch engines -> record.

    ControlLoop(policy, router, recorder, interval_s, now)    subclassed by each body
    await loop.run()      every interval_s (the body's sleep) until cancelled
    await loop.step()     one interval: snapshot, decide, record, start the switches asked for (a
                          target on an engine mid-switch starts once that switch ends)
    await loop.switch(engine, role, reason, forecast)   router first, then the body's protocol
    await loop.before_step(step)   between synchronous steps: the policy's roles for the next one
                                   (Policy.between_steps), carried out before the step starts
    loop.switching                 the engines a switch (or a hold) is under way on
    loop.hold(engine) / release(engine)   no switch starts on the engine meanwhile (cells: it is
                                   leaving this loop's engines)
    loop.spares(engine)            whether the engine could close for good and leave every phase
                                   an open engine (no switch may close the last one either)
    loop.trajectory_done(result)   the driver saw a trajectory end: a DONE event for the next step
                                   (an answer before the turn cap ends it unannounced to the body)
    timed(fn, *args)               -> (result, CPU seconds this thread spent in it)
    loop.step_s, loop.step_cpu_s   each step's wall time, and the CPU it took (the policy's
                                   thread, the scheduler call, the loop's own part)

A body supplies two coroutines: `observe()` -> Snapshot (events since the last call and what each
engine holds) and `carry_out(engine, old, new)` (the switch protocol on its transport; it returns
once the engine serves only `new`, and raises to leave the engine in `old`); it may override
`decide(snapshot)`, where the policy runs, `empties(engine, old, new)`, whether a switch
needs the engine empty (a change of parallelism: the router then sends it nothing meanwhile), and
`pause()`, how long to wait before the next step (a body sharing its CPU with the rollout waits
longer after a dear step). A CPU cost spent off the loop's thread is added with `spent(cpu_s)`;
`on_decision(snapshot, decision)`, when set, hears every decision once it is recorded.
Everything else, the router's bookkeeping, the records and the targets that find their engine
switching (each waits for that switch, the latest winning), is here once, so the live Dask
controller and the simulator's differ only in transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import replace
from typing import Callable

from prorsa.agent.loop import TrajectoryResult
from prorsa.agent.trace import TrajectorySpec, turns_as_ran
from prorsa.control.forecast import ForecastSummary
from prorsa.control.lifecycle import LifecycleEvent, Phase
from prorsa.control.policy import RECENT_FINISHED, Decision, Policy, Snapshot
from prorsa.metrics.recorder import ControlRecord, RoleChange, RunRecorder
from prorsa.roles import Role
from prorsa.rollout.router import Router

log = logging.getLogger(__name__)


def as_ran(result: TrajectoryResult) -> TrajectorySpec:
    """A finished trajectory as it ran: what each turn appended and decoded, and its tool times."""
    return replace(result.spec, turns=turns_as_ran([(t.prefill_tokens, t.decode_tokens, t.tool_s) for t in result.turns]))


def timed(fn, *args):
    """fn(*args) and the CPU seconds this thread spent in it."""
    c = time.thread_time()
    return fn(*args), time.thread_time() - c


class ControlLoop:
    # the clock a step's CPU is read from (the live body throttles on it, control_cpu_share)
    cpu_clock = staticmethod(time.thread_time)

    def __init__(self, policy: Policy, router: Router, recorder: RunRecorder, interval_s: float,
                 now: Callable[[], float]) -> None:
        self.policy = policy
        self.router = router
        self.rec = recorder
        self.interval_s = interval_s  # as the body's asyncio.sleep counts it
        self.now = now  # body seconds since the rollout began
        self._switching: dict[str, asyncio.Task] = {}
        # engine -> (role, reason, forecast) a decision asked for while a switch or hold was under way on it
        self._deferred: dict[str, tuple[Role, str, ForecastSummary | None]] = {}
        self._heading: dict[str, Role] = {}  # engine -> the role a switch started on it is taking it to
        self._ended: list[LifecycleEvent] = []  # DONE/FAILED seen by the driver, for the next step
        self._ends_shown = 0  # ends taken out of _ended so far: _ends_reported() counts from the first
        self.step_s: list[float] = []  # wall time of each control step, for its cost
        self.step_cpu_s: list[float] = []  # and the CPU it took, wherever it ran
        self._cpu = 0.0  # this step's CPU so far
        self._recent: deque[TrajectorySpec] = deque(maxlen=RECENT_FINISHED)  # see _recent_finished
        self._converted = 0  # recorder trajectories already looked at
        self._recent_tuple: tuple[TrajectorySpec, ...] = ()
        self.on_decision: Callable[[Snapshot, Decision], None] | None = None

    def trajectory_done(self, result: TrajectoryResult) -> None:
        """A live agent may answer before its last planned turn; no task says so to the body's
        lifecycle source, so the driver does (a duplicate DONE is ignored by the tracker)."""
        phase = Phase.DONE if result.status == "completed" else Phase.FAILED
        self._ended.append(LifecycleEvent(self.now(), result.spec.traj_id, result.spec.family,
                                          max(len(result.turns) - 1, 0), phase))

    async def hold(self, engine: str) -> None:
        """Wait out a switch under way on `engine`, then start none until `release`."""
        while (task := self._switching.get(engine)) is not None:
            await asyncio.wait([task])
        self._switching[engine] = asyncio.get_running_loop().create_future()

    @property
    def switching(self) -> frozenset[str]:
        """Engines a switch (or a hold) is under way on."""
        return frozenset(self._switching)

    def release(self, engine: str) -> None:
        held = self._switching.pop(engine, None)
        if held is not None and not held.done():
            held.set_result(None)

    async def observe(self) -> Snapshot:
        raise NotImplementedError

    async def carry_out(self, engine: str, old: Role, new: Role) -> None:
        raise NotImplementedError

    def empties(self, engine: str, old: Role, new: Role) -> bool:
        return False

    async def decide(self, snap: Snapshot) -> Decision:
        return await self.call_policy(self.policy.decide, snap)

    async def call_policy(self, fn: Callable[[Snapshot], Decision], snap: Snapshot) -> Decision:
        """A policy call, its CPU counted; a body whose event loop also carries the rollout may
        run it off the loop (the simulator must not: its clock would move on meanwhile)."""
        c = self.cpu_clock()
        decision = fn(snap)
        self.spent(self.cpu_clock() - c)
        return decision

    def pause(self) -> float:
        return self.interval_s

    def spent(self, cpu_s: float) -> None:
        self._cpu += cpu_s

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.pause())
                await self.step()
        finally:
            self._deferred.clear()
            self._heading.clear()
            for task in self._switching.values():
                task.cancel()
            await asyncio.gather(*self._switching.values(), return_exceptions=True)

    def _recent_finished(self) -> tuple[TrajectorySpec, ...]:
        """The last RECENT_FINISHED completed trajectories as they ran, each converted once."""
        done = self.rec.trajectories
        if len(done) == self._converted:
            return self._recent_tuple  # most intervals: nothing ended, no copy
        for r in done[self._converted:]:
            if r.status == "completed":
                self._recent.append(as_ran(r))
        self._converted = len(done)
        self._recent_tuple = tuple(self._recent)
        return self._recent_tuple

    async def before_step(self, step: int) -> None:
        """A synchronous step is about to start and none is in flight: a policy that plans between
        steps (Policy.between_steps) sets the next step's roles now, and the step waits for them."""
        between = getattr(self.policy, "between_steps", None)
        if between is None or step == 0:
            return
        seen = self._ends_reported()
        snap = self._with_ended(await self.observe(), seen)
        self._learn(snap)
        snap = replace(snap, finished=tuple(as_ran(r) for r in self.rec.trajectories
                                            if r.spec.step == step - 1 and r.status == "completed"))
        decision = await self.call_policy(between, snap)
        self._record(snap, decision)
        moves = [self.switch(engine, role, decision.reason) for engine, role in decision.targets.items()
                 if engine not in self._switching and engine in self.router.roles
                 and role is not self.router.roles[engine]]
        await asyncio.gather(*moves)

    def _record(self, snap: Snapshot, decision: Decision) -> None:
        self.rec.control(ControlRecord(snap.time_s, {e.engine_id: e.role for e in snap.engines},
                                       decision.reason, decision.forecast, dict(decision.forecast_error)))
        if self.on_decision is not None:
            self.on_decision(snap, decision)

    def _ends_reported(self) -> int:
        return self._ends_shown + len(self._ended)

    def _with_ended(self, snap: Snapshot, seen: int) -> Snapshot:
        """The snapshot with the ends the driver had reported when the body's look (observe())
        that gave `snap` began (`seen`: _ends_reported() then), those not shown yet. The driver
        sees an end only after the body's events for that trajectory, so those ends follow events
        the look found; one reported while the look was under way waits for the next step: added
        here, it could come before its last turn's events that the look missed (seen live, under
        load: a DONE shown before the TOOL of its turn, which then came late)."""
        n = seen - self._ends_shown
        if n <= 0:
            return snap
        ended, self._ended = self._ended[:n], self._ended[n:]
        self._ends_shown += n
        return replace(snap, events=(*snap.events, *ended))

    def _learn(self, snap: Snapshot) -> None:
        """The router prices moves with a turn's mean decode: it learns it from the decodes seen."""
        for ev in snap.events:
            if ev.tokens > 0 and (ev.phase is Phase.TOOL or ev.phase.finished):
                self.router.decoded(ev.tokens)

    async def step(self) -> Decision:
        t0 = time.perf_counter()
        # thread_time counts only this thread, and only while the step holds it: other tasks run
        # on the loop during the awaits, so each stretch between awaits is counted on its own
        self._cpu = 0.0
        self._start_deferred()
        seen = self._ends_reported()
        snap = await self.observe()
        c = self.cpu_clock()
        snap = self._with_ended(snap, seen)
        self._learn(snap)
        snap = replace(snap, finished=self._recent_finished(), heading=dict(self._heading))
        self.spent(self.cpu_clock() - c)
        decision = await self.decide(snap)
        c = self.cpu_clock()
        self._record(snap, decision)
        for engine, role in decision.targets.items():
            if engine not in self.router.roles:
                continue  # an engine no longer this loop's (it left the cell) is not switched
            if engine in self._switching:
                # The policy now plans on this role: dropping the target would leave it believing
                # in a split that is not there (seen live: a reactive policy, told nothing, switched
                # a cell's last decode engine away). It waits for the switch or hold under way.
                self._deferred[engine] = (role, decision.reason, decision.forecast)
                continue
            self._deferred.pop(engine, None)
            if role is not self.router.roles[engine]:
                self._start(engine, role, decision.reason, decision.forecast)
        self.step_s.append(time.perf_counter() - t0)
        self.step_cpu_s.append(self._cpu + self.cpu_clock() - c)
        return decision

    def _start(self, engine: str, role: Role, reason: str, forecast: ForecastSummary | None) -> None:
        if self._strands(engine, role):  # it waits for another engine of that phase to open
            self._deferred[engine] = (role, reason, forecast)
            return
        self._heading[engine] = role
        self._switching[engine] = asyncio.create_task(self.switch(engine, role, reason, forecast))

    def _closes(self, engine: str, old: Role, new: Role) -> bool:
        return (old.serves_decode and not new.serves_decode) or self.empties(engine, old, new)

    def _serving(self, engine: str) -> Role | None:
        """What `engine` serves once the switches started so far have begun (None: closed); a
        switch task started this interval has not closed its engine yet."""
        if engine in self.router.closed:
            return None
        old, new = self.router.roles[engine], self._heading.get(engine)
        if new is None:
            return old
        return None if self._closes(engine, old, new) else new

    def spares(self, engine: str) -> bool:
        """Whether `engine` could close for good now (cells: leave for another cell) and every phase
        an open engine serves would still have one."""
        return not self._strands(engine, None)

    def _strands(self, engine: str, role: Role | None) -> bool:
        """Whether switching `engine` to `role` (None: closing it for good) now would leave a phase
        some open engine serves with none: a turn of that phase would find no engine and fail. Seen
        live: two switches away from decode asked in consecutive intervals closed a cell's only two
        decode engines at once."""
        others = [r for e in self.router.roles if e != engine and (r := self._serving(e)) is not None]
        now = self._serving(engine)
        before = others if now is None else [*others, now]
        closing = role is None or self._closes(engine, self.router.roles[engine], role)
        after = others if closing else [*others, role]
        return any(any(map(serves, before)) and not any(map(serves, after))
                   for serves in (lambda r: r.serves_prefill, lambda r: r.serves_decode))

    def _start_deferred(self) -> None:
        """The targets that found their engine switching (or held), or that would have left a phase
        no open engine, for engines free again: the latest one asked for each."""
        for engine in [e for e in self._deferred if e not in self._switching]:
            role, reason, forecast = self._deferred.pop(engine)
            if engine in self.router.roles and role is not self.router.roles[engine]:
                self._start(engine, role, reason, forecast)

    async def switch(self, engine: str, role: Role, reason: str = "",
                     forecast: ForecastSummary | None = None) -> RoleChange | None:
        old = self.router.roles[engine]
        t_req = self.now()
        # An engine giving up decode takes no new work until its decodes are done: prefill
        # chunks co-batched with them (at an MoE group's barrier, on every rank) would stretch
        # them many times over. One giving up prefill takes new decodes at once.
        closing = self._closes(engine, old, role)
        try:
            if closing:
                self.router.close(engine)
            else:
                self.router.set_role(engine, role)  # new work of the old role goes elsewhere from now
            await self.carry_out(engine, old, role)
            self.router.set_role(engine, role)
        except asyncio.CancelledError:
            raise
        except Exception:  # the engine keeps its old role; the policy sees that and may ask again
            log.exception("%s: switch %s -> %s failed", engine, old.value, role.value)
            self.router.set_role(engine, old)
            return None
        finally:
            self.router.reopen(engine)
            self._switching.pop(engine, None)
            self._heading.pop(engine, None)
        change = RoleChange(t_req, engine, old, role, reason, self.now() - t_req, forecast=forecast)
        self.rec.role_change(change)
        log.info("%s: %s -> %s in %.2fs: %s", engine, old.value, role.value, change.drain_s, reason)
        return change

