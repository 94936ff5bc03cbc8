"""A tool worker's environment: the tools and the reward live as long as the worker.

    ToolHost(cfg, seed)           WorkerPlugin for tool workers: builds the ToolEnvironment once
                                  (a search index, loaded user tools) at worker start
    run_tool(call) -> Observation       in a task on a tool worker: one real call
    reward_task(task, response) -> Score   a task on a tool worker
    DaskScorer(client)            the driver's Scorer: each trajectory's reward as that task,
                                  key reward-<traj>
    replay_environment(cfg, client)   the driver's ReplayEnvironment, or None without one

Tool tasks are plain functions run in the worker's threads; each call runs on an event loop of
its own thread, so a tool that blocks (a sync user function, a BM25 lookup) holds one thread,
never the worker's event loop that the scheduler, the engines and the driver share in-process.
"""

from __future__ import annotations

import asyncio

from distributed import WorkerPlugin, get_worker

from prorsa.agent.datasets.base import Task
from prorsa.agent.environment import Observation, ReplayEnvironment, ToolEnvironment, dataset_tasks
from prorsa.agent.rewards import Score
from prorsa.agent.tools.base import ToolCall
from prorsa.config.pipeline import EnvironmentConfig, PipelineConfig

PLUGIN_NAME = "prorsa-tools"


class ToolHost(WorkerPlugin):
    name = PLUGIN_NAME

    def __init__(self, cfg: EnvironmentConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.env: ToolEnvironment | None = None

    def setup(self, worker) -> None:
        self.env = ToolEnvironment.from_config(self.cfg, self.seed)


def _env() -> ToolEnvironment:
    worker = get_worker()
    host = worker.plugins.get(PLUGIN_NAME)
    if host is None or host.env is None:
        raise RuntimeError(f"worker {worker.name} hosts no tool environment")
    return host.env


def run_tool(call: ToolCall) -> Observation:
    return asyncio.run(_env().call(call))


def reward_task(task: Task, response: str) -> Score:
    return asyncio.run(_env().score(task, response))


class DaskScorer:
    """Rewards run where the tools do: a test-running reward starts sandboxes, which belong on
    tool workers, not in the driver."""

    def __init__(self, client) -> None:
        self.client = client

    async def __call__(self, traj_id: str, task: Task, response: str) -> Score:
        fut = self.client.submit(reward_task, task, response, key=f"reward-{traj_id}",
                                 resources={"env": 1}, pure=False)
        return await fut


def replay_environment(cfg: PipelineConfig, client) -> ReplayEnvironment | None:
    """The driver's side of the pipeline's environment (None without one)."""
    env = cfg.environment
    if env is None:
        return None
    return ReplayEnvironment(dataset_tasks(env, cfg.seed), cfg.workload.prompts, DaskScorer(client))
