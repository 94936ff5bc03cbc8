"""How the Learner reaches its Trainer, wherever that lives (train.placement).

    TrainerHandle            the protocol: version, await step(samples, advantages) -> StepStats,
                             await skip(), await save(out_dir) -> Path
    LocalTrainer(trainer)    the Trainer in this process; step and save in a thread, so the event
                             loop keeps driving the rollout meanwhile
    RemoteTrainer            the Trainer on the trainer worker (live/remote_trainer.py, dask)

No dask here: the Learner imports this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from prorsa.train.samples import Sample
from prorsa.train.trainer import StepStats, Trainer


class TrainerHandle(Protocol):
    @property
    def version(self) -> int:
        """The policy version of the trainer's weights (what the next save is tagged with)."""

    async def step(self, samples: Sequence[Sample], advantages: Sequence[float]) -> StepStats: ...

    async def skip(self) -> None:
        """Nothing trainable: the weights stay, the version moves (the engines' version follows it)."""

    async def save(self, out_dir: Path) -> Path: ...


class LocalTrainer:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    @property
    def version(self) -> int:
        return self.trainer.version

    async def step(self, samples: Sequence[Sample], advantages: Sequence[float]) -> StepStats:
        return await asyncio.to_thread(self.trainer.step, samples, advantages)

    async def skip(self) -> None:
        self.trainer.version += 1

    async def save(self, out_dir: Path) -> Path:
        return await asyncio.to_thread(self.trainer.save, out_dir)
