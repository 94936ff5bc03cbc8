"""Engines and tools on workers that join by themselves (batch jobs, `dask worker` on a running
scheduler): nothing can be handed to them at start, so the plugins are registered with the
client, reach every worker, and each worker reads what it hosts off its name.

    WorkerEngineHost(roles, cfg, run_dir, node_gpus)   engine-<i> hosts engine i in roles[i] (the
                                            leader, if it spans nodes of node_gpus); others nothing. The
                                            engine takes the GPUs its worker was given (its job's
                                            CUDA_VISIBLE_DEVICES, else what NVML finds), not engines.devices:
                                            that list is a local run's machine
    WorkerFollowerHost(cfg, run_dir, node_gpus)   node-<k>-of-engine-<i> (nodes.follower_name)
                                            hosts node k's headless server of engine i, an engine
                                            spanning nodes of node_gpus GPUs each; others nothing
    WorkerToolHost(cfg, seed, model_dir)    tools-<j> hosts the toolbox; others nothing

They keep the plugin names of EngineHost, FollowerHost and ToolHost, so `engine_here` and the
tool tasks find them as on a LocalCluster. The nodes of a spanning engine meet on the leader's
host (span_host.meeting_host), not the loopback: each is a job of its own.
"""

from __future__ import annotations

from prorsa.cluster.engine_host import EngineHost
from prorsa.cluster.nodes import follower_of
from prorsa.cluster.span_host import FollowerHost
from prorsa.cluster.tool_host import ToolHost
from prorsa.roles import Role

ENGINE_PREFIX = "engine-"
TOOL_PREFIX = "tools-"


def engine_index(worker_name) -> int | None:
    name = str(worker_name)
    if not name.startswith(ENGINE_PREFIX) or not name[len(ENGINE_PREFIX):].isdigit():
        return None
    return int(name[len(ENGINE_PREFIX):])


class WorkerEngineHost(EngineHost):
    def __init__(self, roles: list[Role], cfg, run_dir: str, node_gpus: int | None = None) -> None:
        super().__init__(-1, Role.MIXED, cfg.model_copy(update={"devices": None}), run_dir)
        self.roles = list(roles)
        self.node_slot = (0, 1)  # one engine per job or joined worker
        self.node_gpus, self.local = node_gpus, False

    async def setup(self, worker) -> None:
        index = engine_index(worker.name)
        if index is None or index >= len(self.roles):
            return
        self.index, self.role = index, self.roles[index]
        await super().setup(worker)


class WorkerFollowerHost(FollowerHost):
    def __init__(self, cfg, run_dir: str, node_gpus: int | None = None) -> None:
        super().__init__(-1, 0, cfg.model_copy(update={"devices": None}), run_dir, local=False, node_gpus=node_gpus)

    async def setup(self, worker) -> None:
        if (which := follower_of(worker.name)) is None:
            return
        self.index, self.node = which
        await super().setup(worker)


class WorkerToolHost(ToolHost):
    async def setup(self, worker) -> None:
        if str(worker.name).startswith(TOOL_PREFIX):
            await super().setup(worker)
