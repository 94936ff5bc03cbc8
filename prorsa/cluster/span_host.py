"""An engine spanning nodes, on Dask workers (cluster/nodes.py): node 0's worker hosts the engine as
any engine worker does (EngineHost: the API server and its ranks; legs, weights and role switches go
through it alone), each further node's worker a headless server of the remaining ranks.

    SpanPeers(worker, engine, span, node, host)  one node's view of the others (server.Peers), kept
                                        on the scheduler, as its metadata under [SPAN_KEY, engine]:
                                          "leader": {launch, host, rpc_port, serving}
                                          "failed": {launch, why}  (a follower's server died)
      .watch()                          on the worker's loop: reads the record every poll_s
      .report(why)                      a follower: its server of this launch died
    FollowerHost(index, node, cfg, run_dir)  WorkerPlugin of a further node's worker: starts its
                                        headless server on the leader's launch, relaunches it on
                                        each new one, reports its death

They start, fail and restart together:

    leader launch n    picks a free DP RPC port, writes leader={n, host, port, serving: False},
                       launches; vLLM's API server waits until every follower's ranks joined
    followers          see launch n, launch headless at host:port, wait for serving
    leader serves      writes serving: True; the followers' starts return
    a follower dies    writes failed={n, why}: the leader's start fails with `why`, or (running)
                       its server counts as dead, so the health check restarts it: launch n+1,
                       which the followers (the dead one included) join

The leader's host: the loopback for a run on one machine, else its worker's host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from distributed import WorkerPlugin
from distributed.comm import get_address_host

from prorsa.cluster.nodes import NodeSpan, node_args, spanning_engines
from prorsa.config.engines import EnginesConfig
from prorsa.engine.registry import engine_name, node_server
from prorsa.engine.vllm.errors import EngineUnavailable
from prorsa.engine.vllm.server import free_port

SPAN_KEY = "prorsa-span"
FOLLOWER_PLUGIN = "prorsa-span-follower"
log = logging.getLogger(__name__)


def meeting_host(worker, local: bool) -> str:
    return "127.0.0.1" if local else get_address_host(worker.address)


class SpanPeers:
    def __init__(self, worker, engine: str, span: NodeSpan, node: int, host: str, wait_s: float = 300.0,
                 poll_s: float = 0.5) -> None:
        """`wait_s`: how long a follower waits for the leader's next launch."""
        self.worker, self.engine, self.span, self.node, self.host = worker, engine, span, node, host
        self.nodes, self.local_dp = span.nodes, span.local_dp
        self.wait_s, self.poll_s = wait_s, poll_s
        self.closed = False  # the worker is going: a follower's wait ends (its thread holds the exit)
        self.loop = asyncio.get_running_loop()
        self.leader: dict | None = None  # the last record read
        self.failure: dict | None = None
        self.launch = 0  # the launch this node's server last joined (or, the leader, made)
        self._mine: dict | None = None  # the leader: the record of its launch

    async def _get(self, field: str):
        return await self.worker.scheduler.get_metadata(keys=[SPAN_KEY, self.engine, field], default=None)

    async def _set(self, field: str, value) -> None:
        await self.worker.scheduler.set_metadata(keys=[SPAN_KEY, self.engine, field], value=value)

    async def read(self) -> None:
        self.leader, self.failure = await self._get("leader"), await self._get("failed")

    async def watch(self) -> None:
        while True:
            with contextlib.suppress(OSError):  # the scheduler away for a moment: keep the last record
                await self.read()
            await asyncio.sleep(self.poll_s)

    def _call(self, coro):
        """From the server's start thread, on the worker's loop."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def newer_launch(self) -> dict | None:
        """The leader's record if it is of a launch this node has not joined."""
        leader = self.leader  # one read: watch() may replace it between two
        return leader if leader is not None and leader["launch"] > self.launch else None

    # --- server.Peers, called from the start thread ---

    def args(self) -> list[str]:
        # watch() rewrites self.leader on the loop while this thread runs: a read begun before our
        # write lands can set it back to the old record (or None), so this launch's record is kept aside
        if self.node == 0:
            self._call(self.read())
            self.launch = (self.leader or {"launch": 0})["launch"] + 1
            self._mine = {"launch": self.launch, "host": self.host, "rpc_port": free_port(), "serving": False}
            self._call(self._set("leader", self._mine))
            self.leader = leader = self._mine
        else:
            deadline = time.monotonic() + self.wait_s
            while (leader := self.newer_launch()) is None:
                if self.closed or time.monotonic() > deadline:
                    raise EngineUnavailable(f"node {self.node} of {self.engine}: no launch of its leader "
                                            f"within {self.wait_s:.0f} s")
                time.sleep(self.poll_s)
            self.launch = leader["launch"]
        return node_args(self.span, self.node, leader["host"], leader["rpc_port"])

    def failed(self) -> str | None:
        if self.node == 0 and self.failure and self.failure["launch"] == self.launch:
            return self.failure["why"]
        return None

    def serving(self) -> None:
        self._call(self._set("leader", {**self._mine, "serving": True}))

    def served(self) -> bool:
        leader = self.leader
        return bool(leader and leader["launch"] == self.launch and leader["serving"])

    async def report(self, why: str) -> None:
        await self._set("failed", {"launch": self.launch, "why": f"node {self.node} of {self.engine}: {why}"})


class FollowerHost(WorkerPlugin):
    name = FOLLOWER_PLUGIN

    def __init__(self, index: int, node: int, cfg: EnginesConfig, run_dir: str, local: bool = True,
                 node_gpus: int | None = None) -> None:
        """`node_gpus`: a node's GPUs (a batch job's engines.gpus), which GPU engines span."""
        self.index, self.node, self.cfg, self.run_dir, self.local = index, node, cfg, run_dir, local
        self.node_gpus = node_gpus
        self.check_s = 2.0
        self.server = None
        self.peers: SpanPeers | None = None
        self._tasks: list[asyncio.Task] = []

    async def setup(self, worker) -> None:
        span = spanning_engines(self.cfg, self.node_gpus)[self.index]
        engine = engine_name(self.index)
        self.peers = SpanPeers(worker, engine, span, self.node, meeting_host(worker, self.local),
                               wait_s=self.cfg.engine_vllm(self.index).start_timeout_s)
        self._tasks.append(asyncio.create_task(self.peers.watch()))
        self.server = node_server(self.index, self.cfg, Path(self.run_dir), self.peers)
        await self._start()
        log.info("node %d of %s joined launch %d on %s", self.node, engine, self.peers.launch, worker.address)
        self._tasks.append(asyncio.create_task(self._keep_up()))

    async def _start(self) -> None:
        try:
            await asyncio.to_thread(self.server.start)
        except EngineUnavailable as e:
            why = str(e).splitlines()[0].split("; last lines of")[0]
            await self.peers.report(why)
            raise EngineUnavailable(f"node {self.node} of {self.peers.engine} (headless): {why}; "
                                    f"see {self.server.log_path}") from None

    async def _keep_up(self) -> None:
        """Follow the leader: relaunch on its next launch; on our own death, tell it (it restarts)."""
        while True:
            await asyncio.sleep(self.check_s)
            if not self.server.alive():
                await self.peers.report(f"its headless server exited; see {self.server.log_path}")
            elif not self.peers.newer_launch():
                continue
            try:
                await asyncio.to_thread(self.server.stop)
                await self._start()
                log.info("node %d of %s rejoined at launch %d", self.node, self.peers.engine, self.peers.launch)
            except Exception:  # retried at the leader's next launch; never kill the worker
                log.exception("node %d of %s: relaunch failed", self.node, self.peers.engine)

    async def teardown(self, worker) -> None:
        if self.peers is not None:
            self.peers.closed = True
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
