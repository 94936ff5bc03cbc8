"""A local run listens on this machine only: every socket the scheduler, the workers (in this
process or as processes, with their HTTP servers and Nannies) open is on a loopback address."""

from __future__ import annotations

import asyncio
import ipaddress

import psutil
import pytest

from prorsa.cluster.local import start_local_cluster
from prorsa.config.pipeline import PipelineConfig
from prorsa.roles import Role


def listening() -> set[tuple[int, str, int]]:
    me = psutil.Process()
    out = set()
    for p in [me, *me.children(recursive=True)]:
        try:
            conns = p.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out |= {(p.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return out


@pytest.mark.parametrize("processes", [False, True])
def test_every_listener_of_a_local_cluster_is_on_loopback(tmp_path, processes):
    cfg = PipelineConfig.model_validate({
        "name": "t", "engines": {"backend": "emulated", "count": 2, "time_scale": 0},
        "runtime": {"processes": processes, "dashboard_address": None}})  # fmt: skip
    before = listening()

    async def opened() -> set:
        async with await start_local_cluster(cfg, [Role.PREFILL, Role.DECODE], tmp_path):
            return listening() - before

    new = asyncio.run(opened())
    # the scheduler's and three workers' HTTP servers at least; as processes, their comm ports too
    assert len(new) >= (4 if not processes else 10), new
    assert [s for s in new if not ipaddress.ip_address(s[1]).is_loopback] == []
