"""The live control loop: the scheduler's lifecycle view -> the policy -> role switches on Dask.

    LiveController(client, policy, router, addresses, recorder, ...)   a ControlLoop (control_loop.py)
    observe()                      one scheduler call: lifecycle events and what each engine holds
                                   (with a dashboard feed, the same call carries the page's data)
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
  4. E's worker is retagged to B alone; the switch is recorded with its drain time
Legs are never moved between workers: a task the scheduler has sent stays where it is, so none is
lost or run twice. That is also why work stealing is off (cluster.py): a stolen leg leaves the
engine that holds its prefix, and a leg stolen onto a worker whose resources then change blocks
that worker's queue (seen: a decode leg at the head of a tool worker's queue stalled every tool).
And why E keeps both resources until the drain ends: a leg whose preferred worker lacks its
resource falls back to any worker at all, resources ignored (the scheduler's rule for loose
restrictions), tool workers included.
"""

from __future__ import annotations

import asyncio
import time

from prorsa.control.policy import Decision, EngineSnapshot, Policy, Snapshot
from prorsa.dashboard.feed import DashboardFeed, observe_and_publish
from prorsa.metrics.recorder import RunRecorder
from prorsa.roles import Role, role_resources
from prorsa.rollout.control_loop import ControlLoop
from prorsa.rollout.engine_host import engine_here
from prorsa.rollout.legs import legs_to_drain
from prorsa.rollout.router import Router


async def _retag(role: str, slots: int, dask_worker=None) -> None:
    await dask_worker.set_resources(**role_resources(Role(role), slots))
    engine_here(dask_worker).set_role(Role(role))


def _wake(address: str, dask_scheduler=None) -> None:
    """Tasks that waited for a worker of a role nobody had (no-worker) are scheduled again."""
    s = dask_scheduler
    ws = s.workers.get(address)
    if ws is not None:
        s.transitions(s.bulk_schedule_unrunnable_after_adding_worker(ws), stimulus_id=f"prorsa-switch-{time.time()}")


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


class LiveController(ControlLoop):
    def __init__(self, client, policy: Policy, router: Router, addresses: dict[str, str],
                 recorder: RunRecorder, slots: int, kv_capacity: int, started_wall: float,
                 interval_s: float, time_unit: float = 1.0, drain_timeout_s: float = 120.0,
                 feed: DashboardFeed | None = None) -> None:
        self.unit = time_unit if time_unit > 0 else 1.0  # wall seconds per body second
        super().__init__(policy, router, recorder, interval_s,
                         lambda: (time.time() - started_wall) / self.unit)
        self.client = client
        self.addresses = addresses
        self.slots = slots
        self.kv_capacity = kv_capacity
        self.drain_timeout_s = drain_timeout_s
        self.feed = feed

    async def observe(self) -> Snapshot:
        report = self.feed.report(tuple(self._switching)) if self.feed is not None else None
        events, loads = await self.client.run_on_scheduler(observe_and_publish, report)
        engines = []
        for engine in sorted(loads):
            load = loads[engine]
            held = load["prefills"] + load["decodes"]
            engines.append(EngineSnapshot(
                engine_id=engine, role=Role(load["role"]), queued=max(held - self.slots, 0),
                active=min(held, self.slots), kv_tokens=load["kv_tokens"], kv_capacity=self.kv_capacity,
                queued_prefill_tokens=load["queued_prefill_tokens"],
            ))  # fmt: skip
        return Snapshot(time_s=self.now(), engines=tuple(engines), events=tuple(events))

    async def decide(self, snap: Snapshot) -> Decision:
        # prorsa's plan takes tens of ms of numpy and Python; on the loop it would hold up every
        # leg of the run (in-process workers and scheduler share this loop) at each interval
        return await asyncio.to_thread(self.policy.decide, snap)

    async def carry_out(self, engine: str, old: Role, new: Role) -> None:
        address = self.addresses[engine]
        drain = legs_to_drain(new)
        try:
            # serve both legs while the old ones drain: nothing already sent here is stranded
            # behind resources it no longer has (it would block the worker's queue)
            await self.client.run(_retag, (Role.MIXED if drain else new).value, self.slots, workers=[address])
            await self.client.run_on_scheduler(_wake, address)
            w0 = time.time()
            while drain and time.time() - w0 < self.drain_timeout_s:
                if not await self.client.run_on_scheduler(_legs_on, address, drain):
                    break
                await asyncio.sleep(min(0.05, self.interval_s))
            if drain:
                await self.client.run(_retag, new.value, self.slots, workers=[address])
        except asyncio.CancelledError:
            raise
        except Exception:
            await self.client.run(_retag, old.value, self.slots, workers=[address])
            raise
