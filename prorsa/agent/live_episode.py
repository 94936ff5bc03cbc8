"""Live mode: the model's generated text drives the trajectory.

    ChatFormat.load(model_dir)           the model's tokenizer and how turns are written in tokens
    ChatFormat.prompt_ids(prompt, tools) the first turn: the chat template with the tool schemas
    ChatFormat.observation_ids(text, ended)   a tool response as the template writes it, plus the
                                         cue for the next assistant turn
    Responder(tools, fmt, parser)        the tool worker's side of a turn
    await Responder.respond(generated_ids) -> LiveStep   parse calls, run them, the observation
    with_step(result, step) -> TurnResult  a turn's result with what the tool worker made of it
    LiveEnvironment(tasks, prompts_per_step, fmt, schemas, ..., scorer).episode(spec) -> LiveEpisode
    await LiveEpisode.drive(spec, runner, now, on_turn) -> TrajectoryResult

A turn: decode until the model's end-of-turn token (or max_response_tokens); the tool worker
decodes the text and parses it (agent/tools/parser.py). Calls found: each runs, their
observations are joined, the status is the first that is not ok. No call but a final answer
(`\\boxed{...}`): the trajectory ends. Neither, or a malformed call: an error observation that
tells the model how to call a tool, status "error", and the loop goes on. The trajectory ends at
the answer, at `max_turns` or when the context is full. The reward reads the model's own text.

With no chat template on the tokenizer, a plain format is used: the prompt as is, and each
observation as "\\n<tool_response>\\n{text}\\n</tool_response>\\n".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from prorsa.agent.datasets.base import Task
from prorsa.agent.loop import (TrajectoryResult, TrajectoryStatus, TurnListener, TurnRequest, TurnResult, TurnRunner,
                               play_turn)
from prorsa.agent.tools import ToolCallParser, ToolStatus

if TYPE_CHECKING:
    from prorsa.agent.environment import Scorer, ToolEnvironment
    from prorsa.agent.trace import TrajectorySpec

NO_CALL = ("Error: no tool call and no final answer. Call a tool as <tool_call>{\"name\": ..., "
           "\"arguments\": {...}}</tool_call>, or give the answer as \\boxed{...}.")
_MARK = "\x00OBSERVATION\x00"


class ChatFormat:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self._before, self._after = self._wrapper()

    @classmethod
    def load(cls, model_dir: str | Path) -> ChatFormat:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

    def _wrapper(self) -> tuple[str, str]:
        """The text the template puts around one tool response after an assistant turn, from
        the assistant's last character on; found by rendering a marker in a two-turn chat."""
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return "\n<tool_response>\n", "\n</tool_response>\n"
        chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        head = tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True) + "a"
        full = tok.apply_chat_template(chat + [{"role": "tool", "content": _MARK}], tokenize=False,
                                       add_generation_prompt=True)
        before, _, after = full[len(head):].partition(_MARK)
        return before, after

    def prompt_ids(self, prompt: str, tools: list[dict]) -> list[int]:
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return tok.encode(prompt, add_special_tokens=False)
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tools=tools, tokenize=False,
                                       add_generation_prompt=True)
        return tok.encode(text, add_special_tokens=False)

    def observation_ids(self, text: str, ended: bool) -> list[int]:
        """`ended`: the model closed its turn itself (its EOS is already in the context)."""
        before = self._before
        eos = self.tokenizer.eos_token or ""
        if ended and eos and before.startswith(eos):
            before = before[len(eos):]
        return self.tokenizer.encode(before + text + self._after, add_special_tokens=False)

    def text(self, ids: Sequence[int]) -> str:
        """Special tokens are kept: tool-call tags are special tokens in Hermes-style vocabularies."""
        ids = list(ids)
        if ids and ids[-1] == self.eos_id:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)


@dataclass(frozen=True)
class LiveStep:
    tool_name: str  # the calls' names, comma-separated; "" when none parsed
    status: ToolStatus
    observation: str
    observation_ids: tuple[int, ...]  # () when the model answered
    final: bool  # the model gave its answer: the trajectory ends


def with_step(res: TurnResult, step: LiveStep) -> TurnResult:
    status = "" if step.final else step.status.value  # an answer is no tool call
    return replace(res, tool_name=step.tool_name, tool_status=status, observation=step.observation,
                   observation_tokens=len(step.observation_ids), observation_ids=step.observation_ids,
                   final=step.final)


class Responder:
    def __init__(self, tools: ToolEnvironment, fmt: ChatFormat, parser: ToolCallParser) -> None:
        self.tools, self.fmt, self.parser = tools, fmt, parser

    async def respond(self, generated: Sequence[int]) -> LiveStep:
        text = self.fmt.text(generated)
        parsed = self.parser.parse(text)
        if parsed.calls:
            results = [await self.tools.call(c) for c in parsed.calls]
            status = next((r.status for r in results if r.status is not ToolStatus.OK), ToolStatus.OK)
            name, observation = ",".join(r.name for r in results), "\n".join(r.text for r in results)
        elif parsed.errors:
            name, status = "", ToolStatus.ERROR
            observation = "Error: " + "; ".join(e.message for e in parsed.errors)
        elif "\\boxed{" in parsed.content:
            return LiveStep("", ToolStatus.OK, "", (), True)
        else:
            name, status, observation = "", ToolStatus.ERROR, NO_CALL
        ended = bool(generated) and generated[-1] == self.fmt.eos_id
        return LiveStep(name, status, observation, tuple(self.fmt.observation_ids(observation, ended)), False)


@dataclass
class LiveEpisode:
    task: Task
    prompt_ids: tuple[int, ...]
    fmt: ChatFormat
    max_turns: int
    max_response_tokens: int
    max_context: int
    scorer: Scorer

    async def drive(self, spec: TrajectorySpec, runner: TurnRunner, now: Callable[[], float],
                    on_turn: TurnListener | None) -> TrajectoryResult:
        result = TrajectoryResult(spec=spec, start_s=now(), prompt_ids=self.prompt_ids, task_id=self.task.task_id)
        ids, appended = list(self.prompt_ids), len(self.prompt_ids)
        for k in range(self.max_turns):
            room = self.max_context - len(ids)
            if room < 1:
                break
            req = TurnRequest(spec.traj_id, k, spec.family, appended, len(ids), min(self.max_response_tokens, room),
                              0.0, k == self.max_turns - 1, spec.seed + k, tuple(ids), live=True,
                              group=f"{spec.step}-{spec.prompt_index}")
            res = await play_turn(runner, req, result, on_turn)
            if res is None:
                break
            ids += [*res.token_ids, *res.observation_ids]
            appended = len(res.observation_ids)
            if res.final:
                break
        if result.status == TrajectoryStatus.RUNNING:
            result.status = TrajectoryStatus.COMPLETED
            response = "\n".join(self.fmt.text(t.token_ids) for t in result.turns)
            s = await self.scorer(spec.traj_id, self.task, response)
            result.reward, result.reward_error = s.value, s.error
        result.end_s = now()
        return result

    def tool_call(self, turn: int) -> None:
        return None  # the model chooses; see drive

    async def finish(self, result: TrajectoryResult) -> None:
        return None  # scored in drive


class LiveEnvironment:
    def __init__(self, tasks: Sequence[Task], prompts_per_step: int, fmt: ChatFormat, schemas: list[dict],
                 max_turns: int, max_response_tokens: int, max_context: int, scorer: Scorer) -> None:
        self.tasks, self.prompts_per_step, self.fmt = list(tasks), prompts_per_step, fmt
        self.limits = (max_turns, max_response_tokens, max_context)
        self.scorer = scorer
        self._prompts = {t.task_id: tuple(fmt.prompt_ids(t.prompt, schemas)) for t in self.tasks}

    def episode(self, spec: TrajectorySpec) -> LiveEpisode:
        task = self.tasks[(spec.step * self.prompts_per_step + spec.prompt_index) % len(self.tasks)]
        return LiveEpisode(task, self._prompts[task.task_id], self.fmt, *self.limits, self.scorer)
