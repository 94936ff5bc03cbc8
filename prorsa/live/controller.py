"""The live control loop: the scheduler's lifecycle view -> the policy -> role switches on Dask.

    LiveController(client, policy, router, addresses, recorder, capacity, pace)   a ControlLoop
                                   (control_loop.py); EngineCapacity and ControlPace records
    observe()                      one scheduler call: lifecycle events and what each engine holds
                                   (with a dashboard feed, the same call carries the page's data)
    pause()                        the wait before the next step: control_interval_s, or longer
                                   when the recent steps' CPU is over control_cpu_share of a core
    carry_out(engine, old, new)    the switch protocol below, on Dask

The policy runs here, beside the router, so a decision reaches the router before the next turn
is routed; the scheduler plugin (lifecycle_plugin.py) is where the lifecycle comes from. The
brain sees body seconds: with emulated engines at time_scale s, one wall second is 1/s seconds
of the cost model the policy plans with (the plugin must be given the same unit).

The switch protocol (engine E from role A to role B):
  1. the router stops sending E new work of role A (new work of role B may go there at once)
  2. E's worker is retagged (Worker.set_resources) to serve both legs, its engine told its new
     role, and tasks that waited for a worker of role B (no-worker) are woken
     (bulk_schedule_unrunnable_after_adding_worker)
  3. drain: the A-legs already sent to E, or bound for it and waiting for their inputs, run and
     finish there (any engine serves either leg)
  4. in the scheduler call that finds the drain over, the scheduler's view of E is retagged to B
     alone, so no A-leg can be placed on E after that look (one arriving between a look and a
     later retag would sit at the head of E's queue for good); then E's worker itself, and the
     switch is recorded with its drain time
By restart (engines.role_switch, a switch across the KV connector's sides: roles.py restarts_kv),
E takes no new work from step 1; once no leg is on E or bound for it and no decode elsewhere still
pulls KV from it (_restart_ready), its server restarts into the other side (VllmEngine.restart_as)
and its worker is retagged to B. Nothing E held is lost: the KV of its prefills dies with the
server only after every decode that needed it is done.
Legs are never moved between workers: a task the scheduler has sent stays where it is, so none is
lost or run twice. That is also why work stealing is off (cluster/local.py): a stolen leg leaves the
engine that holds its prefix, and a leg stolen onto a worker whose resources then change blocks
that worker's queue (seen: a decode leg at the head of a tool worker's queue stalled every tool).
And why E keeps both resources until the drain ends: a leg whose preferred worker lacks its
resource falls back to any worker at all, resources ignored (the scheduler's rule for loose
restrictions), tool workers included.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from prorsa.cluster.engine_host import engine_here
from prorsa.cluster.lifecycle_plugin import observe_and_publish
from prorsa.cluster.recovery import stranded, unbind
from prorsa.control.policy import Decision, Policy, Snapshot
from prorsa.dashboard.feed import DashboardFeed
from prorsa.loads import EngineLoad
from prorsa.metrics.recorder import RunRecorder
from prorsa.roles import Role, restarts_kv, role_resources
from prorsa.rollout.control_loop import ControlLoop, timed
from prorsa.rollout.legs import DECODE_LEGS, PREFILL_LEGS, WARM_LEGS, legs_to_drain
from prorsa.rollout.router import Router


async def _retag(role: str, slots: int, dask_worker=None) -> None:
    await dask_worker.set_resources(**role_resources(Role(role), slots))
    engine_here(dask_worker).set_role(Role(role))


async def _restart_as(role: str, slots: int, dask_worker=None) -> None:
    await engine_here(dask_worker).restart_as(Role(role))
    await dask_worker.set_resources(**role_resources(Role(role), slots))


def _restart_ready(address: str, force: bool, dask_scheduler=None) -> bool:
    """No leg is on the worker or bound for it, and no decode elsewhere still needs the KV of a
    prefill that ran there (its result is the KV handle, kept on the worker: has_what); or `force`."""
    s = dask_scheduler
    if force:
        return True
    if _legs_on(address, PREFILL_LEGS + DECODE_LEGS + WARM_LEGS, s):
        return False
    ws = s.workers.get(address)
    held = () if ws is None else ws.has_what
    return not any((ts.annotations or {}).get("phase") in PREFILL_LEGS and
                   any(d.state not in ("memory", "released", "forgotten", "erred") for d in ts.dependents)
                   for ts in held)


def _wake(address: str, dask_scheduler=None) -> None:
    """Tasks that waited for a worker of a role nobody had (no-worker) are scheduled again."""
    s = dask_scheduler
    ws = s.workers.get(address)
    if ws is not None:
        s.transitions(s.bulk_schedule_unrunnable_after_adding_worker(ws), stimulus_id=f"prorsa-switch-{time.time()}")


def _admitted(load: EngineLoad, slots: int, kv_capacity: int) -> EngineLoad:
    """The scheduler counts legs sent to an engine; it admits `slots` of them, the rest wait."""
    held = load.prefill_legs + load.decode_legs
    return replace(load, queued=max(held - slots, 0), active=min(held, slots), kv_capacity=kv_capacity)


def _observe_timed(report=None, dask_scheduler=None):
    (events, loads), cpu = timed(observe_and_publish, report, dask_scheduler)
    return events, loads, cpu


def _legs_on(address: str, phases: tuple[str, ...], dask_scheduler=None) -> int:
    """Legs of these phases that are on the worker or bound for it: running or queued there, or
    still waiting for their inputs with the worker as their (loose) restriction."""
    s = dask_scheduler
    ws = s.workers.get(address)
    n = 0 if ws is None else sum((ts.annotations or {}).get("phase") in phases for ts in ws.processing)
    for ts in s.tasks.values():
        if ts.state in ("waiting", "no-worker", "queued") and ts.worker_restrictions \
                and address in ts.worker_restrictions and (ts.annotations or {}).get("phase") in phases:
            n += 1
    return n


def _give_up_when_drained(address: str, phases: tuple[str, ...], resources: dict[str, float], force: bool,
                          dask_scheduler=None) -> bool:
    """If no leg of these phases is on the worker or bound for it (or `force`: the drain timed
    out), the scheduler takes the worker's new resources now -> True. A leg still bound for it
    after a forced drain is placed by its role instead."""
    s = dask_scheduler
    if not force and _legs_on(address, phases, s):
        return False
    if address in s.workers:
        s.add_resources(worker=address, resources=resources)
        for ts in s.tasks.values():
            if ts.state == "waiting" and ts.worker_restrictions and address in ts.worker_restrictions \
                    and stranded(ts, s.workers):
                unbind(ts)
    return True


@dataclass(frozen=True)
class EngineCapacity:
    """Slots and KV tokens of the engines: one figure for engines alike, or each engine's (engines.groups)."""

    slots: int | dict[str, int]
    kv_tokens: int | dict[str, int]
    restarts: bool = False  # engines switch across the KV connector's sides by restart (engines.role_switch)

    def slots_of(self, engine: str) -> int:
        return self.slots[engine] if isinstance(self.slots, dict) else self.slots

    def kv_of(self, engine: str) -> int:
        return self.kv_tokens[engine] if isinstance(self.kv_tokens, dict) else self.kv_tokens


@dataclass(frozen=True)
class ControlPace:
    """The live control loop's clock and how often and how long it may act."""

    started_wall: float  # wall time the run's clock starts from
    interval_s: float  # between steps, wall seconds
    time_unit: float = 1.0  # wall seconds per body second
    drain_timeout_s: float = 120.0
    max_cpu_share: float = 0.05  # of one core, averaged over the last few steps


class LiveController(ControlLoop):
    def __init__(self, client, policy: Policy, router: Router, addresses: dict[str, str],
                 recorder: RunRecorder, capacity: EngineCapacity, pace: ControlPace,
                 feed: DashboardFeed | None = None) -> None:
        self.unit = pace.time_unit if pace.time_unit > 0 else 1.0  # wall seconds per body second
        super().__init__(policy, router, recorder, pace.interval_s,
                         lambda: (time.time() - pace.started_wall) / self.unit)
        self.client = client
        self.addresses = addresses
        self.capacity = capacity
        self.drain_timeout_s = pace.drain_timeout_s
        self.feed = feed
        self.max_cpu_share = pace.max_cpu_share

    def pause(self) -> float:
        # The policy's CPU comes out of the process that carries the rollout (in-process workers
        # and scheduler share its GIL): at a tenth of real time prorsa's 13-18 ms of CPU every
        # 200 ms was 7-9% of a core. A dear step is followed by a longer wait instead.
        recent = self.step_cpu_s[-5:]
        return max(self.interval_s, sum(recent) / len(recent) / self.max_cpu_share) if recent else self.interval_s

    async def observe(self) -> Snapshot:
        c = time.thread_time()
        report = self.feed.report(tuple(self._switching)) if self.feed is not None else None
        self.spent(time.thread_time() - c)
        events, loads, cpu = await self.client.run_on_scheduler(_observe_timed, report)
        c = time.thread_time()
        engines = tuple(_admitted(loads[e], self.capacity.slots_of(e), self.capacity.kv_of(e)) for e in sorted(loads))
        self.spent(cpu + time.thread_time() - c)
        return Snapshot(time_s=self.now(), engines=engines, events=tuple(events))

    async def call_policy(self, fn, snap: Snapshot) -> Decision:
        # prorsa's plan takes tens of ms of numpy and Python (a rehearsal between steps, seconds);
        # on the loop it would hold up every leg of the run (in-process workers and scheduler
        # share this loop)
        decision, cpu = await asyncio.to_thread(timed, fn, snap)
        self.spent(cpu)
        return decision

    def empties(self, engine: str, old: Role, new: Role) -> bool:
        return self.capacity.restarts and restarts_kv(old, new)

    async def carry_out(self, engine: str, old: Role, new: Role) -> None:
        address, slots = self.addresses[engine], self.capacity.slots_of(engine)
        if self.empties(engine, old, new):  # the router sends it nothing meanwhile (ControlLoop.switch)
            w0 = time.time()
            while not await self.client.run_on_scheduler(_restart_ready, address,
                                                         time.time() - w0 >= self.drain_timeout_s):
                await asyncio.sleep(min(0.05, self.interval_s))
            await self.client.run(_restart_as, new.value, slots, workers=[address])
            await self.client.run_on_scheduler(_wake, address)
            return
        drain = legs_to_drain(new)
        try:
            # serve both legs while the old ones drain: nothing already sent here is stranded
            # behind resources it no longer has (it would block the worker's queue)
            await self.client.run(_retag, (Role.MIXED if drain else new).value, slots, workers=[address])
            await self.client.run_on_scheduler(_wake, address)
            if drain:
                w0 = time.time()
                resources = role_resources(new, slots)
                while not await self.client.run_on_scheduler(
                        _give_up_when_drained, address, drain, resources, time.time() - w0 >= self.drain_timeout_s):
                    await asyncio.sleep(min(0.05, self.interval_s))
                await self.client.run(_retag, new.value, slots, workers=[address])
        except asyncio.CancelledError:
            raise
        except Exception:
            await self.client.run(_retag, old.value, slots, workers=[address])
            raise
