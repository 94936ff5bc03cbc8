"""What keeps a run going when an engine's worker dies (a Nanny restarts it on a new address).

    LegRescue               scheduler plugin: a leg bound for a worker that is gone is bound to
                            its role instead (any worker with the leg's resource)
    await live_addresses(client, addresses)   the engine workers alive now; addresses updated in place

Why the plugin: legs carry loose worker restrictions (the engine the router chose) and role
resources. Dask's rule for loose restrictions is that when none of the named workers is valid
the task may run anywhere, resources ignored; with the named worker dead, a prefill leg was sent
to the decode engine, which has no prefill slot, and waited there for good. Dropping the dead
address before the scheduler places the task again leaves the resource to choose: another
engine of the role, or no-worker until the restarted one joins. The prefill rebuilds the KV
from the token history, so the turn goes on where it lands.
"""

from __future__ import annotations

from distributed.diagnostics.plugin import SchedulerPlugin

PLUGIN_NAME = "prorsa-leg-rescue"


class LegRescue(SchedulerPlugin):
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.scheduler = None
        self.rescued = 0  # legs re-bound from a dead worker to their role

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
        if not ts.worker_restrictions or not ts.resource_restrictions:
            return
        workers = self.scheduler.workers
        if any(addr in workers for addr in ts.worker_restrictions):
            return
        ts.worker_restrictions = None
        ts.loose_restrictions = False
        self.rescued += 1


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
