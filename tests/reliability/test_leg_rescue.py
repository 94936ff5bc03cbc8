"""Legs on a real scheduler are placed by their role resource when the engine worker they are bound
to cannot take them (it died, or its retag has not reached the scheduler yet), and never on a worker
without the resource (which would hold it, unrunnable, at the head of its queue for good)."""

from __future__ import annotations

import asyncio

import dask
import pytest
from distributed import Client, Event, Scheduler, Worker

from prorsa.cluster.recovery import LegRescue, rescued
from prorsa.live.controller import _give_up_when_drained, _wake
from prorsa.rollout.legs import DECODE_LEGS

# How long a leg that should run is given to run: a guard against one held for good, not a
# bound on its speed (on a loaded host a leg can take seconds to be placed and run).
HANG_S = 60.0


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
                if not rescue:  # where it is held is known once it is placed; it cannot run there
                    while not decode.done() and s.tasks["decode"].processing_on is None:
                        await asyncio.sleep(0.01)
                try:
                    return await asyncio.wait_for(decode, timeout=HANG_S if rescue else 2)
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


async def _leg_ahead_of_the_retag(rescue: bool) -> tuple[str, str]:
    """The router has just made prefill engine E mixed and sends it a colocated leg; the leg
    reaches the scheduler before E's new resources do. -> (where the scheduler put the leg
    first, where it ran once E serves decodes)."""
    async with Scheduler(dashboard_address=":0", port=0) as s:
        async with Worker(s.address, name="E", resources={"prefill": 1, "decode": 0, "env": 0}, nthreads=2) as e, \
                Worker(s.address, name="T", resources={"prefill": 0, "decode": 0, "env": 1}, nthreads=2), \
                Client(s.address, asynchronous=True) as client:
            if rescue:
                await client.register_plugin(LegRescue())
            leg = client.submit(_where, "x", key="generate", workers=[e.address], resources={"decode": 1},
                                allow_other_workers=True)
            while s.tasks.get("generate") is None or s.tasks["generate"].state in ("released", "waiting"):
                await asyncio.sleep(0.01)
            ts = s.tasks["generate"]
            first = ts.state if ts.processing_on is None else f"{ts.state} on {ts.processing_on.name}"
            await e.set_resources(prefill=1, decode=1)  # the switch's retag, then its wake
            await client.run_on_scheduler(_wake, e.address)
            try:  # without the plugin only `first` is looked at
                return first, await asyncio.wait_for(leg, timeout=HANG_S if rescue else 3)
            except asyncio.TimeoutError:
                return first, "stuck"


@pytest.mark.parametrize("rescue", [True, False])
def test_a_leg_that_reaches_the_scheduler_before_its_engines_retag_waits_for_it(rescue):
    first, ran = asyncio.run(_leg_ahead_of_the_retag(rescue))
    if rescue:
        assert (first, ran) == ("no-worker", "E")
    else:  # dask's loose-restriction rule: sent at once to a worker without the decode resource
        assert first in ("processing on E", "processing on T")


async def _drain_forced(force: bool) -> tuple[bool, float, float, str]:
    """A decode leg bound for mixed engine E waits on its prefill while E gives up decodes.
    -> (given up, E's decode resource as the scheduler sees it, as E sees it, where the leg ran)."""
    async with Scheduler(dashboard_address=":0", port=0) as s:
        async with Worker(s.address, name="P", resources={"prefill": 1, "decode": 0}, nthreads=2) as p, \
                Worker(s.address, name="E", resources={"prefill": 1, "decode": 1}, nthreads=2) as e, \
                Worker(s.address, name="D", resources={"prefill": 0, "decode": 1}, nthreads=2), \
                Client(s.address, asynchronous=True) as client:
            prefill = client.submit(_wait_for, "go", key="prefill", workers=[p.address],
                                    resources={"prefill": 1}, allow_other_workers=True)
            with dask.annotate(phase="decode"):
                decode = client.submit(_where, prefill, key="decode", workers=[e.address],
                                       resources={"decode": 1}, allow_other_workers=True)
            while s.tasks.get("decode") is None or s.tasks["decode"].state != "waiting":
                await asyncio.sleep(0.01)
            given_up = await client.run_on_scheduler(_give_up_when_drained, e.address, DECODE_LEGS,
                                                     {"prefill": 1, "decode": 0}, force)
            seen = s.workers[e.address].resources["decode"], e.state.total_resources["decode"]
            await Event("go", client=client).set()
            return given_up, *seen, await asyncio.wait_for(decode, timeout=HANG_S)


def test_a_drain_keeps_the_role_while_a_leg_is_bound_for_it():
    assert asyncio.run(_drain_forced(False)) == (False, 1, 1, "E")  # the bound decode keeps E's role


def test_a_timed_out_drain_gives_up_the_role_and_its_bound_legs_go_to_the_role():
    assert asyncio.run(_drain_forced(True)) == (True, 0, 1, "D")  # the scheduler first; E's worker after
