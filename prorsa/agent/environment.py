"""Environments: real tool calls and rewards around the trajectory loop (replay mode).

A pipeline's `environment` section names a task dataset, the tools and the reward. In replay the
turn structure still comes from the workload (family profile or trace), but the tool call after
each decode is a real one, the task's reference calls cycled over the turns, run on a tool
worker; its observation's length (plus the chat template's wrapper) becomes the next turn's
append, so tool latency and observation length are real.

The tool worker's side:
    ToolEnvironment.from_config(cfg)           the toolbox, the observation budget and the reward
    await ToolEnvironment.call(call) -> Observation   one call, cut to the budget; never raises
    await ToolEnvironment.score(task, response) -> Score   the reward; never raises
    ApproxTokenizer(chars_per_token)           counts and cuts observations without a model's
                                               tokenizer (encode/decode, as Truncation needs)
The driver's side:
    ReplayEnvironment(tasks, prompts_per_step, scorer)   which task each trajectory replays;
                                               scorer(traj_id, task, response) -> Score
    local_scorer(env)                          a scorer that runs the reward in this process
    ReplayEnvironment.episode(spec) -> Episode           one per trajectory (agent/loop.py)
    Episode.tool_call(turn) -> ToolCall                  the call after that turn's decode
    await Episode.finish(result)                         sets result.reward (and reward_error)
    transcript(calls, turns) -> str                      what the reward reads in replay

What the reward compares in replay: the task's reference answer (and tests) against the
transcript of the calls the trajectory really made: every call (python code in a ```python block,
other tools as `name {json arguments}`) followed by its observation. So `exact_match` reads the
last line the last program printed, `contains_answer` whether retrieval surfaced the answer, and
`pass_rate` re-runs the task's tests against the last program. A trajectory of one turn made no
call and scores on an empty transcript.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from prorsa.agent.datasets.base import Task, make_dataset, read_jsonl
from prorsa.agent.rewards import Reward, Score, make_reward, score
from prorsa.agent.tools import SandboxLimits, Toolbox, ToolCall, ToolStatus, Truncation, make_tool

if TYPE_CHECKING:
    from prorsa.agent.loop import TrajectoryResult, TurnResult
    from prorsa.agent.trace import TrajectorySpec
    from prorsa.config.environment import EnvironmentConfig

# The Hermes/Qwen chat template's tokens around one tool response (<|im_start|>user <tool_response>
# ... </tool_response><|im_end|> <|im_start|>assistant): appended even when the tool printed nothing.
WRAPPER_TOKENS = 12


class ApproxTokenizer:
    """Text in chunks of `chars_per_token` characters: the usual rule of thumb for BPE tokenizers
    on English and code, for runs whose engines have no tokenizer (emulated)."""

    def __init__(self, chars_per_token: int = 4) -> None:
        self.n = chars_per_token

    def encode(self, text: str) -> list[str]:
        return [text[i:i + self.n] for i in range(0, len(text), self.n)]

    def decode(self, chunks: Sequence[str]) -> str:
        return "".join(chunks)


@dataclass(frozen=True)
class Observation:
    name: str  # the tool called
    status: ToolStatus
    text: str  # what the model sees, cut to the budget
    tokens: int  # appended to the context before the next decode, template wrapper included
    elapsed_s: float  # the call's wall time


def dataset_tasks(cfg: EnvironmentConfig, seed: int) -> list[Task]:
    if cfg.columns is not None:  # a Hugging Face dataset on disk
        from prorsa.agent.datasets.hf import hf_tasks

        return hf_tasks(cfg.dataset, cfg.columns, cfg.split)
    if cfg.dataset.endswith(".jsonl"):
        tasks = read_jsonl(cfg.dataset)
        if not tasks:
            raise ValueError(f"{cfg.dataset}: no tasks")
        return tasks
    return make_dataset(cfg.dataset, cfg.tasks, cfg.dataset_seed if cfg.dataset_seed is not None else seed)


class ToolEnvironment:
    def __init__(self, toolbox: Toolbox, truncation: Truncation, reward: Reward) -> None:
        self.toolbox = toolbox
        self.truncation = truncation
        self.reward = reward

    @classmethod
    def from_config(cls, cfg: EnvironmentConfig, seed: int = 0) -> ToolEnvironment:
        s = cfg.sandbox
        limits = SandboxLimits(**s.model_dump())
        # Built-ins cut nothing themselves (their own cut would be cut again here, mangled).
        uncut = Truncation(limit=s.output_bytes)
        options: dict[str, dict[str, Any]] = {"python": {"limits": limits, "truncation": uncut},
                                              "search": {"truncation": uncut}}
        if cfg.dataset == "search":  # the questions are about the corpus of the same seed
            from prorsa.agent.datasets.search import make_corpus

            options["search"]["corpus"] = make_corpus(cfg.dataset_seed if cfg.dataset_seed is not None else seed)
        tools = [make_tool(spec, **options.get(spec, {})) for spec in cfg.tools]
        truncation = Truncation(cfg.max_observation_tokens, "tokens", ApproxTokenizer(cfg.chars_per_token))
        return cls(Toolbox(tools, timeout_s=cfg.tool_timeout_s), truncation, make_reward(cfg.reward))

    async def call(self, call: ToolCall) -> Observation:
        res = await self.toolbox.run(call)
        text, cut = self.truncation.apply(res.observation)
        status = ToolStatus.TRUNCATED if cut and res.status is ToolStatus.OK else res.status
        tokens = len(self.truncation.tokenizer.encode(text)) + WRAPPER_TOKENS
        return Observation(call.name, status, text, tokens, res.elapsed_s)

    async def score(self, task: Task, response: str) -> Score:
        return await score(self.reward, task, response)


def render_call(call: ToolCall) -> str:
    code = call.arguments.get("code")
    if call.name == "python" and isinstance(code, str):
        return f"```python\n{code.rstrip()}\n```"
    return f"{call.name} {json.dumps(dict(call.arguments), sort_keys=True)}"


def transcript(calls: Sequence[ToolCall], turns: Sequence[TurnResult]) -> str:
    """The calls made (turn k's call is calls[k]) and what each returned, in order."""
    parts = []
    for call, turn in zip(calls, turns):
        if turn.tool_name:
            parts += [render_call(call), turn.observation]
    return "\n".join(parts)


Scorer = Callable[[str, Task, str], Awaitable[Score]]  # (traj_id, task, response)


def local_scorer(env: ToolEnvironment) -> Scorer:
    """Rewards computed in the caller's process (tests, single-process runs)."""
    async def scorer(traj_id: str, task: Task, response: str) -> Score:
        return await env.score(task, response)

    return scorer


@dataclass
class Episode:
    traj_id: str
    task: Task
    scorer: Scorer

    def tool_call(self, turn: int) -> ToolCall:
        calls = self.task.calls
        return calls[turn % len(calls)]

    async def finish(self, result: TrajectoryResult) -> None:
        calls = [self.tool_call(k) for k in range(len(result.turns))]
        s = await self.scorer(self.traj_id, self.task, transcript(calls, result.turns))
        result.reward, result.reward_error = s.value, s.error
        result.task_id = self.task.task_id


class ReplayEnvironment:
    """Trajectories of one prompt (a GRPO group) replay one task; prompts cycle over the tasks."""

    def __init__(self, tasks: Sequence[Task], prompts_per_step: int, scorer: Scorer) -> None:
        if not tasks:
            raise ValueError("a replay environment needs at least one task")
        missing = [t.task_id for t in tasks if not t.calls]
        if missing:
            raise ValueError(f"tasks without reference calls cannot be replayed: {missing[:3]}")
        self.tasks = list(tasks)
        self.prompts_per_step = prompts_per_step
        self.scorer = scorer

    def episode(self, spec: TrajectorySpec) -> Episode:
        index = spec.step * self.prompts_per_step + spec.prompt_index
        return Episode(spec.traj_id, self.tasks[index % len(self.tasks)], self.scorer)


def with_observation(res: TurnResult, obs: Observation) -> TurnResult:
    """A turn's result with the real tool call's outcome in place of the replayed latency."""
    return replace(res, tool_name=obs.name, tool_status=obs.status.value, observation=obs.text,
                   observation_tokens=obs.tokens)
