"""How the model does on a tool-use task's first turn, measured with transformers' `generate`.

    first_turn_eval(model, fmt, tasks, schemas, draws) -> FirstTurnEval   draws: EvalDraws (samples, sampling, seed)

The first turn is where the tool-call format is won or lost: a live episode parses it for a call
(agent/tools/parser.py) and runs it. A generation counts as a call when the hermes parser finds a
call to the task's reference tool in it, and as a correct call when `tool_use` gives it the call
credit (the reference call's numbers) or full marks. Sampling draws from a forked generator, so
measuring never moves the caller's random stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from prorsa.agent.datasets.base import Task
from prorsa.agent.rewards import TOOL_CALL_CREDIT, tool_use_reward
from prorsa.agent.tools.parser import ToolCallParser

if TYPE_CHECKING:
    from prorsa.agent.live_episode import ChatFormat


@dataclass(frozen=True)
class FirstTurnEval:
    generations: int
    call_rate: float  # a parsed call to the task's reference tool
    correct_call_rate: float  # ... with the reference call's numbers (or the right answer outright)
    mean_reward: float  # tool_use on the first turn alone
    texts: tuple[str, ...]  # the generations, in task order


@dataclass(frozen=True)
class EvalDraws:
    """How the generations are drawn."""

    samples_per_task: int = 4
    max_new_tokens: int = 48
    do_sample: bool = True  # False: one greedy generation a task
    temperature: float = 1.0
    seed: int = 0


@torch.no_grad()
def first_turn_eval(model: torch.nn.Module, fmt: ChatFormat, tasks: Sequence[Task], schemas: list[dict],
                    draws: EvalDraws = EvalDraws()) -> FirstTurnEval:
    samples_per_task, max_new_tokens, do_sample = draws.samples_per_task, draws.max_new_tokens, draws.do_sample
    temperature, seed = draws.temperature, draws.seed
    parser = ToolCallParser(formats=("hermes",))
    texts, calls, correct, rewards = [], 0, 0, 0.0
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for task in tasks:
                prompt = torch.tensor([fmt.prompt_ids(task.prompt, schemas)], dtype=torch.long)
                # One prompt per call, its samples as return sequences: no padding to get wrong.
                out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                                     do_sample=do_sample, temperature=temperature if do_sample else None,
                                     top_p=None, top_k=None, num_return_sequences=samples_per_task if do_sample else 1,
                                     eos_token_id=fmt.eos_id, pad_token_id=fmt.eos_id)
                for row in out[:, prompt.shape[1]:].tolist():
                    if fmt.eos_id in row:
                        row = row[:row.index(fmt.eos_id) + 1]
                    text = fmt.text(row)
                    texts.append(text)
                    reward = tool_use_reward(task, text)
                    rewards += reward
                    correct += reward >= TOOL_CALL_CREDIT
                    calls += any(c.name == task.calls[0].name for c in parser.parse(text).calls) if task.calls else 0
    finally:
        model.train(was_training)
    n = max(len(texts), 1)
    return FirstTurnEval(len(texts), calls / n, correct / n, rewards / n, tuple(texts))
