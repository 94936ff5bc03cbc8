"""Engines and tools on workers that join by themselves (batch jobs, `dask worker` on a running
scheduler): nothing can be handed to them at start, so the plugins are registered with the
client, reach every worker, and each worker reads what it hosts off its name.

    WorkerEngineHost(roles, cfg, run_dir)   engine-<i> hosts engine i in roles[i]; others nothing. The
                                            engine takes the GPUs its worker was given (its job's
                                            CUDA_VISIBLE_DEVICES, else what NVML finds), not engines.devices:
                                            that list is a local run's machine
    WorkerToolHost(cfg, seed, model_dir)    tools-<j> hosts the toolbox; others nothing

They keep the plugin names of EngineHost and ToolHost, so `engine_here` and the tool tasks find
them as on a LocalCluster.
"""

from __future__ import annotations

from prorsa.cluster.engine_host import EngineHost
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
    def __init__(self, roles: list[Role], cfg, run_dir: str) -> None:
        super().__init__(-1, Role.MIXED, cfg.model_copy(update={"devices": None}), run_dir)
        self.roles = list(roles)
        self.node_slot = (0, 1)  # one engine per job or joined worker

    async def setup(self, worker) -> None:
        index = engine_index(worker.name)
        if index is None or index >= len(self.roles):
            return
        self.index, self.role = index, self.roles[index]
        await super().setup(worker)


class WorkerToolHost(ToolHost):
    async def setup(self, worker) -> None:
        if str(worker.name).startswith(TOOL_PREFIX):
            await super().setup(worker)
