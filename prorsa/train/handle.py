"""How the Learner reaches its trainer, wherever that lives (train.placement).

    TrainerHandle            the protocol: version, await step(samples, advantages) -> StepStats,
                             await skip(), await save(out_dir) -> Path,
                             await save_state(out_dir), await load_state(in_dir)
    LocalTrainer(trainer)    a PolicyTrainer (protocol.py: the built-in Trainer or a plug-in) in
                             this process; its calls in a thread, so the event loop keeps driving
                             the rollout meanwhile
    RemoteTrainer            the Trainer on the trainer worker (live/remote_trainer.py, dask)

No dask here: the Learner imports this module.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from prorsa.train.protocol import PolicyTrainer, step_stats
from prorsa.train.samples import Sample
from prorsa.train.trainer import StepStats


class TrainerHandle(Protocol):
    @property
    def version(self) -> int:
        """The policy version of the trainer's weights (what the next save is tagged with)."""

    async def step(self, samples: Sequence[Sample], advantages: Sequence[float]) -> StepStats: ...

    async def skip(self) -> None:
        """Nothing trainable: the weights stay, the version moves (the engines' version follows it)."""

    async def save(self, out_dir: Path) -> Path: ...

    async def save_state(self, out_dir: Path) -> None: ...

    async def load_state(self, in_dir: Path) -> None: ...


class LocalTrainer:
    def __init__(self, trainer: PolicyTrainer) -> None:
        self.trainer = trainer

    @property
    def version(self) -> int:
        return self.trainer.version

    async def step(self, samples: Sequence[Sample], advantages: Sequence[float]) -> StepStats:
        before, start = self.trainer.version, time.perf_counter()
        result = await asyncio.to_thread(self.trainer.step, samples, advantages)
        if self.trainer.version != before + 1:  # the engines' versions and weights/v<N> follow it
            raise RuntimeError(f"{type(self.trainer).__name__}.step moved version {before} -> "
                               f"{self.trainer.version}; a step must add one")
        return step_stats(result, self.trainer.version, samples, time.perf_counter() - start)

    async def skip(self) -> None:
        self.trainer.version += 1

    async def save(self, out_dir: Path) -> Path:
        return Path(await asyncio.to_thread(self.trainer.save, out_dir))

    async def save_state(self, out_dir: Path) -> None:
        await asyncio.to_thread(self.trainer.save_state, out_dir)

    async def load_state(self, in_dir: Path) -> None:
        await asyncio.to_thread(self.trainer.load_state, in_dir)
