"""The RL loop's learner: finished trajectories in, a GRPO step, the new weights out to every engine.

    Learner(train_cfg, trainer, weights_dir, push, batch, mode)   trainer: a TrainerHandle
                                   (train/handle.py), or a Trainer to run in this process
    learner.on_done(result)        the driver's callback: keep a finished trajectory for training
    learner.version                weight updates pushed so far: what a trajectory starting now is
                                   tagged with (TrajectoryResult.policy_version)
    learner.may_start(started)     async: may trajectory number `started` start now (staleness gate)
    await learner.update()         train on the next batch, save weights/v<N>, push them, record
    learner.records                one UpdateRecord per update (also appended to train.jsonl)
    batches_dir/v<N>.parquet       each trained batch in the trainer-neutral format (train/export.py):
                                   token ids, loss masks, rollout logprobs, rewards, advantages, version

Sync: an update trains on everything the step finished. Async: on the first `batch` trajectories
to finish that have not been trained; one started under version v and trained while the trainer
is at version t is t - v versions stale, and is dropped (counted, never trained) past
max_staleness. The gate keeps rollout from running further ahead than that: trajectory i starts
only once version >= i // batch - max_staleness.

The trainer's step runs in a thread or on the trainer worker: the event loop keeps driving the
rollout meanwhile (async). No dask here: `push(model_dir)` is the body's way of loading weights
into its engines, and the handle its way of reaching a trainer elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from prorsa.agent.loop import TrajectoryResult
from prorsa.config.pipeline import TrainConfig
from prorsa.train.export import write_batch
from prorsa.train.grpo import group_advantages
from prorsa.train.handle import LocalTrainer, TrainerHandle
from prorsa.train.samples import samples_from_results
from prorsa.train.trainer import Trainer

Push = Callable[[Path], Awaitable[None]]


@dataclass(frozen=True)
class UpdateRecord:
    version: int  # the weights this update made (1 = first update)
    at_s: float  # seconds since the rollout began, when the new weights were in every engine
    trajectories: int  # trained
    dropped_stale: int  # finished but too stale to train (async)
    max_staleness: int  # of the trained ones: trainer version - version they started under
    reward_mean: float  # of the trained trajectories (NaN rewards left out)
    loss: float
    kl: float
    clip_fraction: float
    tokens: int  # generated tokens trained
    train_s: float
    save_s: float
    push_s: float


class Learner:
    def __init__(self, cfg: TrainConfig, trainer: TrainerHandle | Trainer, weights_dir: Path, push: Push,
                 batch: int, mode: str, now: Callable[[], float] = time.monotonic, log_path: Path | None = None,
                 batches_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.trainer = LocalTrainer(trainer) if isinstance(trainer, Trainer) else trainer
        self.weights_dir = Path(weights_dir)
        self.push = push
        self.batch = batch
        self.mode = mode
        self.now = now
        self.log_path = log_path
        self.batches_dir = batches_dir
        if batches_dir is not None:
            batches_dir.mkdir(parents=True, exist_ok=True)
        self.version = 0
        self.records: list[UpdateRecord] = []
        self.trained_versions: list[tuple[str, int, int]] = []  # (traj_id, started under, trained at)
        self._finished: list[TrajectoryResult] = []
        self._lock = asyncio.Lock()  # async: updates started back to back train one after another

    def on_done(self, result: TrajectoryResult) -> None:
        self._finished.append(result)

    def may_start(self, started: int) -> bool:
        return self.version >= started // self.batch - self.cfg.max_staleness

    async def update(self) -> None:
        async with self._lock:
            await self._update()

    def _take(self) -> tuple[list[TrajectoryResult], int]:
        if self.mode == "sync":
            taken, self._finished = self._finished, []
            return taken, 0
        taken, self._finished = self._finished[:self.batch], self._finished[self.batch:]
        fresh = [r for r in taken if self.version - r.policy_version <= self.cfg.max_staleness]
        return fresh, len(taken) - len(fresh)

    async def _update(self) -> None:
        results, dropped = self._take()
        samples = samples_from_results(results)
        t0 = time.monotonic()
        if samples:
            advantages = group_advantages([s.reward for s in samples], [s.group for s in samples])
            if self.batches_dir is not None:  # what an external trainer would have been given
                await asyncio.to_thread(write_batch, self.batches_dir / f"v{self.version}.parquet",
                                        samples, advantages)
            stats = await self.trainer.step(samples, advantages)
        else:  # nothing trainable (every trajectory failed or was stale): the weights stay, the version moves
            stats = None
            await self.trainer.skip()
        t1 = time.monotonic()
        target = self.weights_dir / f"v{self.trainer.version}"
        await self.trainer.save(target)
        t2 = time.monotonic()
        await self.push(target)
        t3 = time.monotonic()
        trained_at = self.version
        self.version = self.trainer.version
        self.trained_versions += [(s.traj_id, s.policy_version, trained_at) for s in samples]
        rewards = [s.reward for s in samples if not math.isnan(s.reward)]
        record = UpdateRecord(
            version=self.version, at_s=round(self.now(), 3), trajectories=len(samples), dropped_stale=dropped,
            max_staleness=max((trained_at - s.policy_version for s in samples), default=0),
            reward_mean=round(sum(rewards) / len(rewards), 4) if rewards else math.nan,
            loss=round(stats.loss, 6) if stats else math.nan, kl=round(stats.kl, 6) if stats else math.nan,
            clip_fraction=round(stats.clip_fraction, 4) if stats else math.nan,
            tokens=stats.tokens if stats else 0,
            train_s=round(t1 - t0, 3), save_s=round(t2 - t1, 3), push_s=round(t3 - t2, 3))
        self.records.append(record)
        if self.log_path is not None:
            with self.log_path.open("a") as f:
                f.write(json.dumps(asdict(record)) + "\n")
        self._prune()

    def _prune(self) -> None:
        """Keep the newest keep_checkpoints versions (a restarted engine reloads the newest)."""
        versions = sorted((int(p.name[1:]), p) for p in self.weights_dir.glob("v*") if p.name[1:].isdigit())
        for v, path in versions[:-self.cfg.keep_checkpoints]:
            if v > 0:  # v0 is the warm-up's model, the path every engine was started from
                shutil.rmtree(path, ignore_errors=True)

    def summary(self) -> dict:
        """What summary.json adds for a training run."""
        rewards = [r.reward_mean for r in self.records if not math.isnan(r.reward_mean)]
        k = max(1, len(rewards) // 4)
        return {
            "policy_versions": self.version,
            "trained_trajectories": sum(r.trajectories for r in self.records),
            "dropped_stale": sum(r.dropped_stale for r in self.records),
            "max_trained_staleness": max((r.max_staleness for r in self.records), default=0),
            "reward_first": round(sum(rewards[:k]) / k, 4) if rewards else None,
            "reward_last": round(sum(rewards[-k:]) / k, 4) if rewards else None,
            "train_s_median": _median([r.train_s for r in self.records]),
            "push_s_median": _median([r.push_s for r in self.records]),
        }


def _median(xs: list[float]) -> float | None:
    return sorted(xs)[len(xs) // 2] if xs else None
