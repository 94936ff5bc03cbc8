"""A tool worker's environment: the tools and the reward live as long as the worker.

    ToolHost(cfg, seed, model_dir, run_dir)   WorkerPlugin for tool workers: builds the ToolEnvironment
                                  once (a search index, loaded user tools) at worker start, and
                                  in live mode the model's tokenizer and the call parser; logs
                                  what the sandbox goes without when a tool runs in it
    run_tool(call) -> Observation       in a task on a tool worker: one real call
    respond(generated_ids) -> LiveStep  live mode, in a task on a tool worker: the turn's text
                                        parsed, its calls run, the observation in tokens
    reward_task(task, response) -> Score   a task on a tool worker
    DaskScorer(client)            the driver's Scorer: each trajectory's reward as that task,
                                  key reward-<traj>
    driver_environment(cfg, client)   the driver's Replay- or LiveEnvironment, or None

Tool tasks are plain functions run in the worker's threads; each call runs on an event loop of
its own thread, so a tool that blocks (a sync user function, a BM25 lookup) holds one thread,
never the worker's event loop that the scheduler, the engines and the driver share in-process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from distributed import WorkerPlugin, get_worker

from prorsa.agent.datasets.base import Task
from prorsa.agent.environment import Observation, ReplayEnvironment, ToolEnvironment, dataset_tasks
from prorsa.agent.live_episode import ChatFormat, LiveEnvironment, LiveStep, Responder
from prorsa.agent.rewards import Score
from prorsa.agent.tools import CommandTool, ToolCall, ToolCallParser
from prorsa.agent.tools.python_tool import PythonTool
from prorsa.agent.tools.sandbox import probe
from prorsa.cluster.pid_files import write_pid
from prorsa.cluster.worker_logs import quiet_survived_faults
from prorsa.config.environment import EnvironmentConfig
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.registry import resolve_model_dir

PLUGIN_NAME = "prorsa-tools"
logger = logging.getLogger("prorsa.tools")


class ToolHost(WorkerPlugin):
    name = PLUGIN_NAME

    def __init__(self, cfg: EnvironmentConfig, seed: int, model_dir: str | None = None,
                 run_dir: str | None = None) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.seed = seed
        self.model_dir = model_dir  # live mode: whose tokenizer reads and writes the turns
        self.env: ToolEnvironment | None = None
        self.responder: Responder | None = None

    async def setup(self, worker) -> None:
        quiet_survived_faults()  # a tool worker fetches decode results from engine workers
        if self.run_dir is not None:
            write_pid(Path(self.run_dir) / "tools" / f"{worker.name}.pid")
        self.env = ToolEnvironment.from_config(self.cfg, self.seed)
        if self.cfg.mode == "live":
            self.responder = Responder(self.env, ChatFormat.load(self.model_dir),
                                       ToolCallParser(formats=tuple(self.cfg.parser)))
        if any(isinstance(t, (PythonTool, CommandTool)) for t in self.env.toolbox.tools.values()):
            await log_sandbox(worker.name, self.cfg.sandbox.cgroup)


async def log_sandbox(where: str, cgroup: str | None = None) -> None:
    """Say at start, not in every call's output, what the sandbox here cannot give: a run whose
    sandbox cannot start at all would otherwise show it only as CRASH observations."""
    found = await probe(cgroup)
    if found.error is not None:
        logger.warning("%s: the tool sandbox cannot start here; sandboxed tool calls will crash: %s",
                       where, found.error)
    for note in found.notes:
        logger.warning("%s: tool sandbox: %s", where, note)
    if found.error is None:
        logger.info("%s: tool sandbox: %s", where, found.limits)


def _host() -> ToolHost:
    worker = get_worker()
    host = worker.plugins.get(PLUGIN_NAME)
    if host is None or host.env is None:
        raise RuntimeError(f"worker {worker.name} hosts no tool environment")
    return host


def run_tool(call: ToolCall) -> Observation:
    return asyncio.run(_host().env.call(call))


def respond(generated: tuple[int, ...]) -> LiveStep:
    return asyncio.run(_host().responder.respond(generated))


def reward_task(task: Task, response: str) -> Score:
    return asyncio.run(_host().env.score(task, response))


class DaskScorer:
    """Rewards run where the tools do: a test-running reward starts sandboxes, which belong on
    tool workers, not in the driver."""

    def __init__(self, client) -> None:
        self.client = client

    async def __call__(self, traj_id: str, task: Task, response: str) -> Score:
        fut = self.client.submit(reward_task, task, response, key=f"reward-{traj_id}",
                                 resources={"env": 1}, pure=False)
        return await fut


def driver_environment(cfg: PipelineConfig, client, tasks: Sequence[Task] | None = None,
                       prompts: int | None = None) -> ReplayEnvironment | LiveEnvironment | None:
    """The driver's side of the pipeline's environment (None without one). `tasks`: these instead
    of the dataset's; `prompts`: a step's prompts, when not the workload's (the Python API)."""
    env = cfg.environment
    if env is None:
        return None
    tasks = dataset_tasks(env, cfg.seed) if tasks is None else tasks
    prompts = cfg.workload.prompts if prompts is None else prompts
    if env.mode == "replay":
        return ReplayEnvironment(tasks, prompts, DaskScorer(client))
    fmt = ChatFormat.load(resolve_model_dir(cfg.engines))
    schemas = ToolEnvironment.from_config(env, cfg.seed).toolbox.schemas()
    return LiveEnvironment(tasks, prompts, fmt, schemas, env.max_turns, env.max_response_tokens,
                           cfg.engines.vllm.max_model_len, DaskScorer(client))
