"""A real agent framework of the field driving the endpoint: the OpenAI Agents SDK (`openai-agents`),
an Agent with a function tool on its chat-completions model, pointed at the server by its base URL
(and its session named with the SDK's own `extra_headers` setting, so that each agent's run is one
trajectory). The model is scripted (tests/serve/test_serve_endpoint.py Scripted): the emulated
engine's replies are empty and the tiny random model calls no tool, so neither would make the SDK
run its tool loop. The replies the script writes are the Hermes tool calls a tool-using model
writes, parsed by the endpoint like any model's.

Then the run is what `prorsa serve` keeps (trajectories.parquet, as the run's writer writes it),
imported as a trace (`prorsa trace import RUN_DIR --format serve`) and replayed by `prorsa sim`."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

from prorsa.metrics.outputs import write_trajectories
from tests.serve.served_app import ServedApp
from tests.serve.test_serve_endpoint import Scripted, tok  # noqa: F401 (tok: a fixture)

REPO = Path(__file__).resolve().parents[2]
SUMS = [(2, 3), (10, 32), (7, 8)]


class ToolUser(Scripted):
    """Turn 0 calls `add` on the two numbers the user asked about; the turn after the tool's result
    answers with it; so every conversation is a call, a tool result and an answer."""

    def __init__(self, tok) -> None:
        super().__init__(tok, reply=self.write)

    def write(self, req) -> str:
        text = self.tok.decode(req.token_ids)
        if req.turn == 0:
            a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
            return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
        result = re.findall(r"<tool_response>\s*(-?\d+)", text)[-1]
        return f"The sum is {result}."


async def run_agents(base_url: str) -> tuple[list[str], list[tuple[int, int]]]:
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                        set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK's traces go to OpenAI's servers
    called: list[tuple[int, int]] = []

    @function_tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        called.append((a, b))
        await asyncio.sleep(0.2)  # a tool takes time: the trajectory's tool time
        return a + b

    client = AsyncOpenAI(base_url=base_url, api_key="unused")

    async def one(i: int, a: int, b: int) -> str:
        agent = Agent(name="calculator", instructions="Add numbers with the add tool.", tools=[add],
                      model=OpenAIChatCompletionsModel(model="tiny", openai_client=client),
                      model_settings=ModelSettings(extra_headers={"X-Session-Id": f"agent-{i}"}))
        result = await Runner.run(agent, f"What is {a} + {b}?")
        return result.final_output

    answers = await asyncio.gather(*(one(i, a, b) for i, (a, b) in enumerate(SUMS)))
    return list(answers), called


def prorsa(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prorsa.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def test_the_agents_sdk_runs_its_tool_loop_through_the_endpoint_and_the_run_replays(tok, tmp_path):  # noqa: F811
    with ServedApp(tok, ToolUser(tok)) as served:
        answers, called = asyncio.run(run_agents(served.url + "/v1"))
    assert answers == [f"The sum is {a + b}." for a, b in SUMS]
    assert sorted(called) == sorted(SUMS)  # the SDK ran the tool on the calls the endpoint parsed
    done = sorted(served.done, key=lambda r: r.task_id)
    assert [(r.task_id, len(r.turns), r.status.value) for r in done] == [
        (f"agent-{i}", 2, "completed") for i in range(len(SUMS))]  # call, then answer: one trajectory each
    assert all(r.turns[0].tool_s >= 0.2 for r in done)  # the tool's time between the two requests

    run = tmp_path / "run"
    run.mkdir()
    write_trajectories(run / "trajectories.parquet", done)  # as the served run's writer does
    trace = tmp_path / "agents.jsonl"
    imported = prorsa("trace", "import", str(run), "--format", "serve", "--output", str(trace))
    assert imported.returncode == 0, imported.stderr
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len({x["traj"] for x in lines}) == len(SUMS) and len(lines) == 2 * len(SUMS)
    sim = prorsa("sim", str(REPO / "pipelines" / "serve.yaml"), f"workload.trace={trace}",
                 f"workload.prompts={len(SUMS)}", "workload.group_size=1", "--policy", "colocated,static:1:1",
                 "--format", "json")
    assert sim.returncode == 0, sim.stderr
    rows = json.loads(sim.stdout)
    assert {r["policy"] for r in rows} == {"colocated", "static:1:1"}, rows
