"""How the Learner reaches its trainer, wherever that lives (train.placement).

    TrainerHandle            the protocol: version, await step(samples, advantages) -> StepStats,
                             await skip(), await save(out_dir) -> Path,
                             await save_state(out_dir), await load_state(in_dir)
    LocalTrainer(trainer, region=None)   a PolicyTrainer (protocol.py: the built-in Trainer or a
                             plug-in) in this process; its calls in a thread, so the event loop keeps
                             driving the rollout meanwhile. With a SharedRegion, share(changed_only)
                             publishes its named_weights() there (train.weight_sync: memory) and
                             close() removes the region
    RemoteTrainer            the Trainer on the trainer worker (rl/remote_trainer.py, dask)

No dask here: the Learner imports this module.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from prorsa.shared_weights import SharedRegion, WeightManifest
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
    def __init__(self, trainer: PolicyTrainer, region: SharedRegion | None = None) -> None:
        self.trainer = trainer
        self.region = region

    async def share(self, changed_only: bool) -> WeightManifest:
        """The trainer's weights into the shared region: what the engines load (WeightManifest)."""
        named = getattr(self.trainer, "named_weights", None)
        if self.region is None or named is None:
            raise RuntimeError(f"train.weight_sync: memory needs a trainer with named_weights() and a shared "
                               f"region; {type(self.trainer).__name__} has "
                               f"{'no named_weights()' if named is None else 'no region'}")
        return await asyncio.to_thread(self.region.publish, named(), changed_only)

    def close(self) -> None:
        if self.region is not None:
            self.region.unlink()

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
