"""`prorsa sft` wired up: a model directory and a task with demonstrations in, a warm-up job out
(sft.py is the warm-up itself).

    WarmupSettings                       what the command line sets: task, plan, optimiser, threads
    warmup_job(model_dir, settings) -> WarmupJob   the trainer loaded, the tasks and held-out tasks
                                                    drawn, the tool schemas of the task's prompts
    job.run(on_step) -> SftResult        train until the plan's target call rate or its last step
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prorsa.agent.datasets import Task, make_dataset
from prorsa.agent.live_episode import ChatFormat
from prorsa.agent.tools.registry import make_tool
from prorsa.agent.tools.toolbox import Toolbox
from prorsa.train.sft import DEMONSTRATIONS, SftPlan, SftResult, run_sft

if TYPE_CHECKING:  # torch loads with the trainer, not with the settings the command line makes
    from prorsa.train.evaluate import FirstTurnEval
    from prorsa.train.trainer import StepStats, Trainer

HELD_OUT = 8  # tasks the call rate is measured on, drawn apart from the training ones


@dataclass(frozen=True)
class WarmupSettings:
    task: str  # a dataset with demonstrations (sft.DEMONSTRATIONS)
    steps: int  # at most this many updates
    batch_size: int  # demonstrations per update
    lr: float
    n_tasks: int  # demonstrations to draw batches from
    target_rate: float  # stop once this share of sampled first turns is a tool call; 1: run every step
    eval_every: int  # updates between evaluations of the call rate
    seed: int  # of the tasks, the batches and the sampling
    threads: int  # torch threads


@dataclass(frozen=True)
class WarmupJob:
    trainer: Trainer
    fmt: ChatFormat
    tasks: list[Task]
    held_out: list[Task]
    schemas: list[dict]
    settings: WarmupSettings

    def run(self, on_step: Callable[[StepStats, FirstTurnEval | None], None] | None = None) -> SftResult:
        s = self.settings
        plan = SftPlan(steps=s.steps, batch_size=s.batch_size, eval_every=s.eval_every,
                       target_call_rate=s.target_rate if s.target_rate < 1 else None, seed=s.seed)
        return run_sft(self.trainer, self.tasks, self.held_out, DEMONSTRATIONS[s.task], self.fmt, self.schemas,
                       plan, on_step)


def warmup_job(model_dir: Path, settings: WarmupSettings) -> WarmupJob:
    from prorsa.train.trainer import Trainer, TrainerConfig

    s = settings
    trainer = Trainer(model_dir, TrainerConfig(lr=s.lr, micro_batch=s.batch_size, seed=s.seed, threads=s.threads))
    tasks = make_dataset(s.task, s.n_tasks, s.seed)
    held_out = make_dataset(s.task, HELD_OUT, s.seed + 1)
    schemas = Toolbox([make_tool(t.calls[0].name) for t in tasks[:1]]).schemas()
    return WarmupJob(trainer, ChatFormat(trainer.tokenizer), tasks, held_out, schemas, settings)
