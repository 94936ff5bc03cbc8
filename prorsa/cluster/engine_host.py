"""An engine lives as long as its Dask worker: a WorkerPlugin starts it and stops it.

    EngineHost.setup(worker)      make and start the engine (vLLM: launch the server on its own GPUs
                                  of the node's device plan, cluster/devices.py; wait, warm up),
                                  then load the newest RL weight version, if the run has one;
                                  RUN_DIR/engines/<engine>.pid names the process hosting it
    EngineHost._watch_health()    every few seconds: restart the engine if it died or hangs
    EngineHost.teardown(worker)   stop it, so no server outlives the cluster
                                  (an engine spanning nodes: its leader's, the server launched
                                  with the DP arguments its followers join: span_host.py)
    engine_here(worker)           the engine of a worker (default: the one running this task)

Tasks reach the engine through the worker, never through a global, so a process hosting several
in-process workers (the default LocalCluster here) keeps each engine with its own worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from distributed import WorkerPlugin, get_worker

from prorsa.cluster.devices import gpus_for_slot
from prorsa.cluster.nodes import spanning_engines
from prorsa.cluster.pid_files import write_pid
from prorsa.cluster.span_host import SpanPeers, meeting_host
from prorsa.cluster.worker_logs import quiet_survived_faults
from prorsa.config.engines import EnginesConfig
from prorsa.engine.base import Engine
from prorsa.engine.registry import engine_name, make_engine
from prorsa.engine.vllm.errors import EngineUnavailable
from prorsa.roles import Role
from prorsa.shared_weights import WeightManifest
from prorsa.train.weights import newest_version, shared_manifest

PLUGIN_NAME = "prorsa-engine"
log = logging.getLogger(__name__)


class EngineHost(WorkerPlugin):
    name = PLUGIN_NAME

    def __init__(self, index: int, role: Role, cfg: EnginesConfig, run_dir: str) -> None:
        self.index = index
        self.role = role
        self.cfg = cfg
        self.run_dir = run_dir
        # (slot, engines on the node): a local run puts every engine on this machine
        self.node_slot = (index, cfg.count)
        # an engine spanning nodes: the node's GPUs (a batch job's engines.gpus; None: GPU engines
        # span none), and whether its nodes meet on the loopback (a run on one machine)
        self.node_gpus: int | None = None
        self.local = True
        self.engine: Engine | None = None
        self.health_interval_s = 5.0
        self.health_timeout_s = 30.0
        self.health_misses = 3
        self.restarts = 0
        self._watch: asyncio.Task | None = None
        self._peers_watch: asyncio.Task | None = None

    async def setup(self, worker) -> None:
        quiet_survived_faults()
        peers = None
        if span := spanning_engines(self.cfg, self.node_gpus).get(self.index):
            peers = SpanPeers(worker, engine_name(self.index), span, 0, meeting_host(worker, self.local))
            self._peers_watch = asyncio.create_task(peers.watch())
        # a leader's node is its job's GPUs, as a follower's (no plan of whole engines holds it)
        gpus = None if span else gpus_for_slot(self.cfg, *self.node_slot, index=self.index)
        self.engine = make_engine(self.index, self.role, self.cfg, Path(self.run_dir), gpus, peers)
        await self.engine.start()
        # A worker restarted mid-run (its process died) starts from the --model path, version 0
        # of an RL run: it must serve the policy the others serve, not wait for the next push.
        await self._load_newest_weights()
        write_pid(Path(self.run_dir) / "engines" / f"{self.engine.engine_id}.pid")
        log.info("%s started on %s as %s%s", self.engine.engine_id, worker.address, self.role.value,
                 f" on GPUs {','.join(gpus)}" if gpus is not None else "")
        if hasattr(self.engine, "ensure_healthy"):
            self._watch = asyncio.create_task(self._watch_health())

    async def _load_newest_weights(self) -> None:
        shared = shared_manifest(self.run_dir)
        manifest = WeightManifest.from_json(shared) if shared is not None else None
        # train.weight_sync: memory; a region gone with its session's driver: the resume pushes anew
        if manifest is not None and Path(manifest.path).exists() and hasattr(self.engine, "load_shared"):
            await self.engine.load_shared(manifest)
            log.info("%s loaded the trainer's shared weights", self.engine.engine_id)
            return
        newest = newest_version(self.run_dir)
        if newest is not None:
            await self.engine.load_weights(newest)
            log.info("%s loaded %s", self.engine.engine_id, newest.name)

    async def _watch_health(self) -> None:
        """A dead or hung server is restarted here; meanwhile its requests fail with
        EngineUnavailable and the runtime retries those turns on other engines. A busy CPU
        server can be slow to answer /health, so only a dead process or several long misses
        in a row count as hung."""
        server, misses = self.engine.server, 0
        while True:
            await asyncio.sleep(self.health_interval_s)
            alive = server.alive()
            if alive and await asyncio.to_thread(server.healthy, self.health_timeout_s):
                misses = 0
                continue
            misses += 1
            if alive and misses < self.health_misses:
                continue
            try:
                misses = 0
                if await self.engine.ensure_healthy():  # False: a request's restart got there first
                    self.restarts += 1
                    log.warning("%s was %s and has been restarted", self.engine.engine_id,
                                "unresponsive" if alive else "dead")
            except EngineUnavailable as e:  # the new server went too (killed again as it started)
                log.warning("%s: restart failed, tried again next interval: %s", self.engine.engine_id,
                            str(e).splitlines()[0])
            except Exception:  # a failed restart is retried next interval; never kill the worker
                log.exception("%s: restart failed", self.engine.engine_id)

    async def teardown(self, worker) -> None:
        for task in (self._watch, self._peers_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.engine is not None:
            await self.engine.stop()


def engine_here(worker=None) -> Engine:
    """`worker` is given by `client.run(..., dask_worker)`; inside a task it is found."""
    worker = worker or get_worker()
    host = worker.plugins.get(PLUGIN_NAME)
    if host is None or host.engine is None:
        raise RuntimeError(f"worker {worker.name} hosts no engine")
    return host.engine
