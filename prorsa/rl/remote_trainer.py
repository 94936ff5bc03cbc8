"""The Trainer on a worker of its own (train.placement: worker): a Dask Actor on the worker that
declares the resource `trainer: 1`.

    await open_remote_trainer(client, model_dir, config, plugin=None, train_cfg=None) -> RemoteTrainer
                                 a TrainerHandle; plugin: train.trainer's "module:Class", built
                                 there instead of the GRPO Trainer
    await handle.where() -> {"name", "address", "pid", "steps", "thread"}  where it lives and steps

Why an Actor rather than state in a worker plugin reached by tasks: the model and optimizer must
stay put between steps, which is what an Actor is, and its calls go straight to the worker, not
through the scheduler, so no trainer task ever meets the lifecycle plugin, the router's
placement or the engines' resources. Synchronous actor methods run one at a time in the worker's
single actor thread, so a step never blocks the worker's event loop (heartbeats go on) and two
steps never overlap. Samples are frozen dataclasses: they travel by pickle; the weights do not
travel at all, the worker writes them into the run directory (a shared filesystem) and the
engines load them from there as in the driver placement.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from distributed import Client, get_worker

from prorsa.cluster.local import TRAINER_RESOURCE
from prorsa.train.protocol import make_trainer, step_stats
from prorsa.train.samples import Sample
from prorsa.train.trainer import StepStats, Trainer, TrainerConfig


class TrainerActor:
    def __init__(self, model_dir: str, config: TrainerConfig, plugin: str | None = None, train_cfg=None) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        worker = get_worker()
        self._where = {"name": str(worker.name), "address": worker.address, "pid": os.getpid()}
        # torch's threads follow the cores the worker was given (one locally, where the engines
        # hold the cores; a batch job's booked cpus elsewhere)
        config = dataclasses.replace(config, threads=worker.state.nthreads)
        self.trainer = make_trainer(plugin, Path(model_dir), train_cfg, lambda: Trainer(model_dir, config))
        self.steps, self.thread = 0, ""

    def version(self) -> int:
        return self.trainer.version

    def step(self, samples: Sequence[Sample], advantages: Sequence[float]) -> StepStats:
        before, start = self.trainer.version, time.perf_counter()
        stats = self.trainer.step(samples, advantages)
        if self.trainer.version != before + 1:
            raise RuntimeError(f"{type(self.trainer).__name__}.step moved version {before} -> "
                               f"{self.trainer.version}; a step must add one")
        stats = step_stats(stats, self.trainer.version, samples, time.perf_counter() - start)
        self.steps, self.thread = self.steps + 1, threading.current_thread().name
        return stats

    def skip(self) -> int:
        self.trainer.version += 1
        return self.trainer.version

    def save(self, out_dir: str) -> str:
        return str(self.trainer.save(out_dir))

    def save_state(self, out_dir: str) -> None:
        self.trainer.save_state(Path(out_dir))

    def load_state(self, in_dir: str) -> int:
        self.trainer.load_state(Path(in_dir))
        return self.trainer.version

    def where(self) -> dict:
        return {**self._where, "steps": self.steps, "thread": self.thread}


class RemoteTrainer:
    """The Learner's TrainerHandle for the actor. `version` is kept here, from what each call
    returns, so reading it costs no round trip."""

    def __init__(self, future, actor, version: int) -> None:
        self._future = future  # the actor lives as long as this future is held
        self._actor = actor
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    async def step(self, samples: Sequence[Sample], advantages: Sequence[float]) -> StepStats:
        stats = await self._actor.step(list(samples), list(advantages))
        self._version = stats.version
        return stats

    async def skip(self) -> None:
        self._version = await self._actor.skip()

    async def save(self, out_dir: Path) -> Path:
        return Path(await self._actor.save(str(out_dir)))

    async def save_state(self, out_dir: Path) -> None:
        await self._actor.save_state(str(out_dir))

    async def load_state(self, in_dir: Path) -> None:
        self._version = await self._actor.load_state(str(in_dir))

    async def where(self) -> dict:
        return await self._actor.where()


async def open_remote_trainer(client: Client, model_dir: Path, config: TrainerConfig, plugin: str | None = None,
                              train_cfg=None) -> RemoteTrainer:
    """`client` asynchronous; the model is loaded on the trainer worker before this returns."""
    future = client.submit(TrainerActor, str(Path(model_dir).resolve()), config, plugin, train_cfg, actor=True,
                           resources={TRAINER_RESOURCE: 1}, pure=False)
    actor = await future
    return RemoteTrainer(future, actor, await actor.version())
