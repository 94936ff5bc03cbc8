"""LegRescue on a real scheduler: a leg bound to an engine worker that dies is placed by its role
resource, never on a worker of the other role (which would hold it, unrunnable, for good)."""

from __future__ import annotations

import asyncio

import pytest
from distributed import Client, Event, Scheduler, Worker

from prorsa.rollout.recovery import LegRescue, rescued


def _wait_for(event_name: str) -> str:
    Event(event_name).wait()
    return "prefilled"


def _where(_: str, dask_worker=None) -> str:
    from distributed import get_worker

    return str(get_worker().name)


async def _decode_after_prefill(rescue: bool) -> str:
    """A prefill leg on P; its decode leg bound (loosely) to D with the decode resource; D dies
    while the decode waits on the prefill and comes back on a new address; -> where it ran."""
    async with Scheduler(dashboard_address=":0", port=0) as s:
        async with Worker(s.address, name="P", resources={"prefill": 1, "decode": 0}, nthreads=2) as p, \
                Client(s.address, asynchronous=True) as client:
            if rescue:
                await client.register_plugin(LegRescue())
            d = await Worker(s.address, name="D", resources={"prefill": 0, "decode": 1}, nthreads=2)
            prefill = client.submit(_wait_for, "go", key="prefill", workers=[p.address],
                                    resources={"prefill": 1}, allow_other_workers=True)
            decode = client.submit(_where, prefill, key="decode", workers=[d.address],
                                   resources={"decode": 1}, allow_other_workers=True)
            while s.tasks.get("decode") is None or s.tasks["decode"].state != "waiting":
                await asyncio.sleep(0.01)
            await d.close()  # the decode is "waiting" on its input when its worker goes
            while d.address in s.workers:
                await asyncio.sleep(0.01)
            async with Worker(s.address, name="D2", resources={"prefill": 0, "decode": 1}, nthreads=2):
                await Event("go", client=client).set()
                try:
                    return await asyncio.wait_for(decode, timeout=5)
                except asyncio.TimeoutError:
                    return "stuck on " + str(s.tasks["decode"].processing_on.name)
                finally:
                    if rescue:
                        assert await client.run_on_scheduler(rescued) == 1


@pytest.mark.parametrize("rescue", [True, False])
def test_a_decode_leg_whose_engine_died_while_it_waited_runs_on_a_decode_engine(rescue):
    where = asyncio.run(_decode_after_prefill(rescue))
    if rescue:
        assert where == "D2"
    else:  # what the plugin is for: dask's loose-restriction rule puts it on the prefill engine
        assert where == "stuck on P"
