"""Replay environments without Dask: the tool side, the episode, the loop's use of observations."""

import asyncio
import math
from dataclasses import replace

import pytest

from prorsa.agent.datasets import Task, make_dataset
from prorsa.agent.environment import (
    WRAPPER_TOKENS, ApproxTokenizer, ReplayEnvironment, ToolEnvironment, local_scorer, render_call, transcript,
    with_observation,
)
from prorsa.agent.loop import TurnRequest, TurnResult, run_trajectory
from prorsa.agent.tools import ToolCall, Truncation
from prorsa.agent.workload import TrajectorySpec, TurnSpec
from prorsa.config.pipeline import EnvironmentConfig


def env(**kw) -> ToolEnvironment:
    return ToolEnvironment.from_config(EnvironmentConfig(**{"dataset": "math-tir", **kw}))


def spec(turns: int, prompt: int = 0, step: int = 0) -> TrajectorySpec:
    ts = tuple(TurnSpec(50, 7, 0.5, k == turns - 1) for k in range(turns))
    return TrajectorySpec(f"s{step}-p{prompt}", "math-tir", prompt, 0, step, ts, seed=3)


class ToolRunner:
    """A TurnRunner that runs the turn's tool call in process, as the tool task does on a worker."""

    needs_token_ids = False
    vocab_size = 0

    def __init__(self, tools: ToolEnvironment):
        self.tools = tools
        self.requests: list[TurnRequest] = []

    async def run_turn(self, req: TurnRequest) -> TurnResult:
        self.requests.append(req)
        res = TurnResult(req.traj_id, req.turn, "e0", "e1", req.appended_tokens, 0, req.decode_tokens)
        if req.tool_call is None:
            return res
        return with_observation(res, await self.tools.call(req.tool_call))


def test_approx_tokenizer_cuts_by_chunks():
    tok = ApproxTokenizer(4)
    assert tok.encode("abcdefghij") == ["abcd", "efgh", "ij"]
    text, cut = Truncation(2, "tokens", tok).apply("0123456789abcdef")
    assert cut and text.startswith("0123") and text.endswith("cdef")


def test_observation_is_counted_cut_and_given_a_status():
    tools = env(max_observation_tokens=10)
    ok = asyncio.run(tools.call(ToolCall("python", {"code": "print(41 + 1)"})))
    assert (ok.name, ok.status.value, ok.text) == ("python", "ok", "42")
    assert ok.tokens == 1 + WRAPPER_TOKENS and ok.elapsed_s > 0
    flood = asyncio.run(tools.call(ToolCall("python", {"code": "print('y' * 1000)"})))
    assert flood.status.value == "truncated" and "cut" in flood.text
    calc = asyncio.run(tools.call(ToolCall("calculator", {"expression": "1/0"})))
    assert calc.status.value == "error"
    unknown = asyncio.run(tools.call(ToolCall("shell", {"cmd": "ls"})))
    assert unknown.status.value == "error" and "no tool named" in unknown.text


def test_search_tool_reads_the_corpus_of_the_dataset_seed():
    task = make_dataset("search", 1, seed=5)[0]
    tools = env(dataset="search", dataset_seed=5, tools=("search",))
    found = [asyncio.run(tools.call(c)) for c in task.calls]
    assert all(o.status.value == "ok" for o in found)
    assert any(task.answer in o.text for o in found)


def test_episodes_share_a_task_per_prompt_and_cycle_its_calls():
    tasks = make_dataset("search", 3, seed=0)
    scorer = local_scorer(env())
    replay = ReplayEnvironment(tasks, prompts_per_step=2, scorer=scorer)
    assert replay.episode(spec(2, prompt=1)).task is tasks[1]
    assert replay.episode(spec(2, prompt=1, step=1)).task is tasks[0]  # step 1, prompt 1: 3rd prompt % 3
    ep = replay.episode(spec(2, prompt=0))
    n = len(tasks[0].calls)
    assert [ep.tool_call(k) for k in range(n + 1)] == [*tasks[0].calls, tasks[0].calls[0]]
    with pytest.raises(ValueError, match="reference calls"):
        ReplayEnvironment([Task("x", "f", "p", "a")], 1, scorer)


def test_loop_appends_the_real_observation_and_scores_the_trajectory():
    tools = env()
    task = make_dataset("math-tir", 1)[0]
    runner = ToolRunner(tools)
    episode = ReplayEnvironment([task], 1, local_scorer(tools)).episode(spec(3))
    result = asyncio.run(run_trajectory(spec(3), runner, lambda: 0.0, episode=episode))
    assert result.status == "completed" and result.task_id == task.task_id
    first, second, last = runner.requests
    assert first.tool_call == second.tool_call == task.calls[0] and last.tool_call is None
    assert first.appended_tokens == 50  # the prompt comes from the spec
    assert second.appended_tokens == result.turns[0].observation_tokens == math.ceil(len(task.answer) / 4) + WRAPPER_TOKENS
    assert last.context_tokens == 50 + 7 + second.appended_tokens + 7 + last.appended_tokens
    assert [t.tool_status for t in result.turns] == ["ok", "ok", ""]
    assert result.reward == 1.0 and result.reward_error == ""


def test_without_an_episode_the_spec_is_replayed_as_before():
    runner = ToolRunner(env())
    result = asyncio.run(run_trajectory(spec(3), runner, lambda: 0.0))
    assert [r.appended_tokens for r in runner.requests] == [50, 50, 50]
    assert all(r.tool_call is None for r in runner.requests)
    assert math.isnan(result.reward) and result.task_id == ""


def test_transcript_renders_programs_as_code_and_keeps_observations():
    code = ToolCall("python", {"code": "print(2)"})
    query = ToolCall("search", {"query": "river"})
    base = TurnResult("t", 0, "", "e", 1, 0, 1)
    turns = [replace(base, tool_name="python", observation="2"),
             replace(base, tool_name="search", observation="[1] doc"), base]
    assert transcript([code, query, code], turns) == "```python\nprint(2)\n```\n2\n" + render_call(query) + "\n[1] doc"


@pytest.mark.parametrize("dataset,reward,tools", [("math-tir", "exact_match", ("python",)),
                                                  ("swe-lite", "pass_rate", ("python",)),
                                                  ("search", "contains_answer", ("search",))])
def test_reference_calls_earn_the_reward(dataset, reward, tools):
    tools_env = env(dataset=dataset, reward=reward, tools=tools)
    task = make_dataset(dataset, 1)[0]
    turns = len(task.calls) + 1
    result = asyncio.run(run_trajectory(
        spec(turns), ToolRunner(tools_env), lambda: 0.0,
        episode=ReplayEnvironment([task], 1, local_scorer(tools_env)).episode(spec(turns))))
    assert result.reward == 1.0, transcript(task.calls, result.turns)


def test_a_broken_reward_is_recorded_not_raised():
    tools = env()
    tools.reward = lambda task, response: 1 / 0
    result = asyncio.run(run_trajectory(
        spec(2), ToolRunner(tools), lambda: 0.0,
        episode=ReplayEnvironment(make_dataset("math-tir", 1), 1, local_scorer(tools)).episode(spec(2))))
    assert result.status == "completed" and math.isnan(result.reward)
    assert "ZeroDivisionError" in result.reward_error
