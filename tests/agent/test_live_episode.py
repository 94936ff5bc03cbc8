"""Live mode without engines: the tiny model's tokenizer and chat template, a scripted 'model'."""

import asyncio
from pathlib import Path

import pytest

from prorsa.agent.datasets import make_dataset
from prorsa.agent.environment import ToolEnvironment, local_scorer
from prorsa.agent.live_episode import NO_CALL, ChatFormat, LiveEnvironment, Responder, with_step
from prorsa.agent.loop import TurnRequest, TurnResult, run_trajectory
from prorsa.agent.tools import ToolCallParser
from prorsa.agent.workload import TrajectorySpec, TurnSpec
from prorsa.config.pipeline import EnvironmentConfig
from prorsa.engine.tiny_model import ensure_tiny_model

CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'


@pytest.fixture(scope="module")
def fmt(tmp_path_factory):
    cache = Path(".prorsa/models") if Path(".prorsa/models").is_dir() else tmp_path_factory.mktemp("models")
    return ChatFormat.load(ensure_tiny_model(cache))


@pytest.fixture(scope="module")
def tools():
    return ToolEnvironment.from_config(EnvironmentConfig(dataset="math-tir", tools=("python",)))


def ids(fmt, text):
    return fmt.tokenizer.encode(text, add_special_tokens=False)


def test_prompt_and_observation_follow_the_chat_template(fmt, tools):
    prompt = fmt.tokenizer.decode(fmt.prompt_ids("What is 6 x 7?", tools.toolbox.schemas()))
    assert "<tools>" in prompt and '"name": "python"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    ended = fmt.tokenizer.decode(fmt.observation_ids("42", ended=True))
    assert ended == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    cut = fmt.tokenizer.decode(fmt.observation_ids("42", ended=False))
    assert cut == "<|im_end|>" + ended  # a turn cut at max tokens is closed first


@pytest.mark.parametrize("text,status,final,observation", [
    ("Let me compute. " + CALL + "<|im_end|>", "ok", False, "42"),
    ('<tool_call>{"name": "python", "arguments": {"code": ', "error", False, "partial call"),
    ("I think \\boxed{42}<|im_end|>", "ok", True, ""),
    ("zq blorp vek", "error", False, NO_CALL),
])
def test_responder_turns_text_into_a_status(fmt, tools, text, status, final, observation):
    step = asyncio.run(Responder(tools, fmt, ToolCallParser()).respond(ids(fmt, text)))
    assert (step.status.value, step.final) == (status, final) and observation in step.observation
    assert bool(step.observation_ids) != final


class ScriptedModel:
    """A TurnRunner whose 'model' says the same thing every turn; the responder runs in process."""

    needs_token_ids = True
    vocab_size = 0

    def __init__(self, fmt, tools, text):
        self.responder = Responder(tools, fmt, ToolCallParser())
        self.out = tuple(ids(fmt, text))
        self.requests: list[TurnRequest] = []

    async def run_turn(self, req: TurnRequest) -> TurnResult:
        self.requests.append(req)
        res = TurnResult(req.traj_id, req.turn, "", "e0", req.appended_tokens, 0, len(self.out), self.out)
        return with_step(res, await self.responder.respond(self.out))


def drive(fmt, tools, text, max_turns=3):
    env = LiveEnvironment(make_dataset("math-tir", 2), 1, fmt, tools.toolbox.schemas(), max_turns, 32, 2048,
                          local_scorer(tools))
    spec = TrajectorySpec("a0", "math-tir", 0, 0, 0, (TurnSpec(10, 10, 0.0, True),), seed=1)
    model = ScriptedModel(fmt, tools, text)
    return asyncio.run(run_trajectory(spec, model, lambda: 0.0, episode=env.episode(spec))), model


def test_no_valid_call_runs_to_the_turn_cap_with_error_statuses(fmt, tools):
    result, model = drive(fmt, tools, "zq blorp vek<|im_end|>")
    assert result.status == "completed" and len(result.turns) == 3
    assert [t.tool_status for t in result.turns] == ["error"] * 3
    assert all(r.live and r.decode_tokens == 32 for r in model.requests)
    first, second = model.requests[:2]
    # the context grows by the generated tokens and the observation, nothing else
    assert second.token_ids == first.token_ids + model.out + result.turns[0].observation_ids
    assert second.appended_tokens == len(result.turns[0].observation_ids)
    assert result.reward == 0.0 and result.task_id == "math-tir-0-0"


def test_an_answer_ends_the_trajectory_and_is_scored(fmt, tools):
    task = make_dataset("math-tir", 1)[0]
    result, _ = drive(fmt, tools, f"\\boxed{{{task.answer}}}<|im_end|>")
    assert len(result.turns) == 1 and result.turns[0].final and result.reward == 1.0
    assert result.turns[0].tool_status == ""  # an answer is not a tool call
