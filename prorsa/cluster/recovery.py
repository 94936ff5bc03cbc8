"""What keeps a leg placed by its role when the worker it is bound to cannot take it: the worker
died (a Nanny restarts it on a new address) or is being retagged.

    LegRescue               scheduler plugin: a leg bound for workers none of which is alive and
                            serves it is bound to its role instead (any worker with the leg's resource)
    stranded(ts, workers)   whether a leg is bound only to workers that cannot take it
    unbind(ts)              drop a leg's worker restriction: its role resource decides
    await live_addresses(client, addresses)   the engine workers alive now; addresses updated in place

Why the plugin: legs carry loose worker restrictions (the engine the router chose) and role
resources. Dask's rule for loose restrictions is that when none of the named workers is valid
the task may run anywhere, resources ignored. With the named worker dead, a prefill leg was sent
to the decode engine, which has no prefill slot, and waited there for good. With the named worker
alive but not yet retagged (the router moves an engine to its new role a scheduler round trip
before the worker's new resources arrive), a colocated leg was sent to a tool worker, where it
blocked every tool behind it and the run hung. Dropping the restriction before the scheduler
places the task leaves the resource to choose: another engine of the role, or no-worker until
the retag or the restarted worker wakes it. The prefill rebuilds the KV from the token history,
so the turn goes on where it lands.
"""

from __future__ import annotations

from distributed.diagnostics.plugin import SchedulerPlugin

PLUGIN_NAME = "prorsa-leg-rescue"


class LegRescue(SchedulerPlugin):
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.scheduler = None
        self.rescued = 0  # legs re-bound to their role from workers that could not take them

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        # "waiting" comes before the placement decision, both for a new task and for one whose
        # worker was just removed (processing -> released -> waiting)
        if finish != "waiting" or self.scheduler is None:
            return
        ts = self.scheduler.tasks.get(key)
        if ts is not None:
            self._rebind(ts)

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        # A leg that reached "waiting" while its worker was still there waits on its input
        # (the prefill it decodes after) and is placed when that input lands, with no second
        # "waiting" for the hook above to see: it is re-bound here, when its worker goes.
        for ts in list(scheduler.tasks.values()):
            if ts.state in ("waiting", "no-worker") and ts.worker_restrictions \
                    and worker in ts.worker_restrictions:
                self._rebind(ts)

    def _rebind(self, ts) -> None:
        if stranded(ts, self.scheduler.workers):
            unbind(ts)
            self.rescued += 1


def _serves(ws, resources: dict[str, float]) -> bool:
    return ws is not None and all(ws.resources.get(r, 0) >= q for r, q in resources.items())


def stranded(ts, workers: dict) -> bool:
    """A leg with a role resource bound only to workers (by address) that are gone or lack it."""
    if not ts.worker_restrictions or not ts.resource_restrictions:
        return False
    return not any(_serves(workers.get(addr), ts.resource_restrictions) for addr in ts.worker_restrictions)


def unbind(ts) -> None:
    ts.worker_restrictions = None
    ts.loose_restrictions = False


def rescued(dask_scheduler) -> int:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    return plugin.rescued if plugin is not None else 0


def _worker_names(dask_scheduler) -> dict[str, str]:
    return {str(ws.name): addr for addr, ws in dask_scheduler.workers.items()}


async def live_addresses(client, addresses: dict[str, str]) -> list[str]:
    """The engine workers alive now, with `addresses` brought up to date in place: the router,
    the controller and the sampler share that dict, so a restarted engine's new address reaches
    all of them. A worker that is gone is left out: a call to it waits out a 30 s connect
    timeout. One small scheduler call (an async client caches no worker list)."""
    by_name = await client.run_on_scheduler(_worker_names)
    for engine in addresses:
        if engine in by_name:
            addresses[engine] = by_name[engine]
    alive = set(by_name.values())
    return [addr for addr in addresses.values() if addr in alive]
