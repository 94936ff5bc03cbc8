"""The supervised warm-up: teach the tool-call format from demonstrations, with the RL trainer's
own code (Trainer.sft_step), and stop while the model still only sometimes uses it.

    DEMONSTRATIONS                              datasets with a known solution: name -> task -> Demo
    demonstration_sample(task, demo, fmt, schemas) -> Sample   the episode a live rollout would
                                                               record for a model that solved it
    run_sft(trainer, tasks, fmt, schemas, SftPlan, on_step) -> SftResult

A demonstration is built the way a live episode builds its context, segment by segment, each
tokenized on its own (the model's tokens are its own, observations are encoded by ChatFormat):

    prompt (chat template + tool schemas) | call text + EOS | observation_ids | answer text + EOS
                   0                      |       1         |        0        |        1

The point of stopping early (`target_call_rate`): GRPO learns from differences within a group.
A model that never writes a call gives every member the same reward; one that always writes it
has nothing left to learn about the format.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prorsa.agent.datasets import arith
from prorsa.agent.datasets.base import Task
from prorsa.train.evaluate import EvalDraws, FirstTurnEval, first_turn_eval
from prorsa.train.samples import Sample

if TYPE_CHECKING:
    from prorsa.agent.live_episode import ChatFormat
    from prorsa.train.trainer import StepStats, Trainer


@dataclass(frozen=True)
class Demo:
    call: str  # the assistant's first turn: the tool call as the chat template writes it
    observation: str  # what the tool returns
    answer: str  # the assistant's last turn, with the \boxed{} answer


def _arith_demo(task: Task) -> Demo:
    call, answer = arith.demonstration(task)
    return Demo(call, task.answer, answer)  # the calculator prints an integer result as its repr


DEMONSTRATIONS: dict[str, Callable[[Task], Demo]] = {"arith": _arith_demo, "arith-digits": _arith_demo}


@dataclass(frozen=True)
class SftPlan:
    steps: int = 50  # at most this many updates
    batch_size: int = 8  # demonstrations per update
    eval_every: int = 5  # steps between measurements of the call rate; 0: never measure
    target_call_rate: float | None = 0.4  # stop once the sampled call rate reaches it; None: run all steps
    eval_tasks: int = 8  # held-out tasks the rate is measured on
    samples_per_task: int = 4
    seed: int = 0


@dataclass(frozen=True)
class SftResult:
    steps: int  # updates made
    stats: tuple[StepStats, ...]
    evals: tuple[tuple[int, FirstTurnEval], ...]  # (step, measurement); step 0 is before training
    stopped_early: bool  # the target call rate was reached before `steps`


def demonstration_sample(task: Task, demo: Demo, fmt: ChatFormat, schemas: list[dict]) -> Sample:
    enc = fmt.tokenizer.encode
    prompt = fmt.prompt_ids(task.prompt, schemas)
    call = enc(demo.call, add_special_tokens=False) + [fmt.eos_id]
    observation = fmt.observation_ids(demo.observation, ended=True)
    answer = enc(demo.answer, add_special_tokens=False) + [fmt.eos_id]
    ids = [*prompt, *call, *observation, *answer]
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(observation) + [1] * len(answer)
    return Sample(tuple(ids), tuple(mask), (0.0,) * len(ids), 1.0, task.task_id, 0, task.task_id)


def run_sft(trainer: Trainer, tasks: Sequence[Task], eval_tasks: Sequence[Task], demo: Callable[[Task], Demo],
            fmt: ChatFormat, schemas: list[dict], plan: SftPlan,
            on_step: Callable[[StepStats, FirstTurnEval | None], None] | None = None) -> SftResult:
    """Batches are drawn from `tasks` with the plan's seed; the call rate is measured on
    `eval_tasks` (keep them apart from `tasks`, or the rate measures memory)."""
    pool = [demonstration_sample(t, demo(t), fmt, schemas) for t in tasks]
    rng = random.Random(f"sft:{plan.seed}")

    def measure(step: int) -> FirstTurnEval:
        return first_turn_eval(trainer.model, fmt, eval_tasks, schemas,
                               EvalDraws(plan.samples_per_task, seed=plan.seed + step))

    evals = [(0, measure(0))] if plan.eval_every else []
    stats: list[StepStats] = []
    for step in range(1, plan.steps + 1):
        st = trainer.sft_step(rng.sample(pool, min(plan.batch_size, len(pool))))
        stats.append(st)
        ev = measure(step) if plan.eval_every and (step % plan.eval_every == 0 or step == plan.steps) else None
        if ev is not None:
            evals.append((step, ev))
        if on_step is not None:
            on_step(st, ev)
        if ev is not None and plan.target_call_rate is not None and ev.call_rate >= plan.target_call_rate:
            return SftResult(step, tuple(stats), tuple(evals), step < plan.steps)
    return SftResult(len(stats), tuple(stats), tuple(evals), False)
