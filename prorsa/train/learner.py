"""The RL loop's learner: finished trajectories in, a trainer's step, new weights out to every engine.

    Learner(train_cfg, trainer, weights_dir, push, batch, mode, now, files)   trainer: a TrainerHandle
                                   (train/handle.py), or a PolicyTrainer (train/protocol.py: the
                                   GRPO Trainer or a plug-in) to run in this process
    learner.on_done(result)        the driver's callback: keep a finished trajectory for training
    learner.restore(entries)       finished in an earlier session, not trained yet (resume)
    await learner.load_state() -> set of trajectory ids   resume: the trainer, version, records
                                   and the engines' weights as the last update left them; the ids
                                   every saved update took (trained, dropped or untrainable)
    learner.version                weight updates pushed so far: what a trajectory starting now is
                                   tagged with (TrajectoryResult.policy_version)
    learner.may_start(started)     async: may trajectory number `started` start now (staleness gate)
    await learner.update()         train on the next batch, save weights/v<N> (or publish them in
                                   shared memory: train.weight_sync), push them, record
    learner.records                one UpdateRecord per update (also appended to train.jsonl)
    learner.close()                the run is over: drop what the trainer holds for the engines
    batches_dir/v<N>.parquet       each trained batch in the trainer-neutral format (train/export.py):
                                   token ids, loss masks, rollout logprobs, rewards, advantages, version

State (state_dir, when given): after every update, before the new version is handed out, the
trainer's save_state and learner.json (version, records, the ids taken so far) are written as one
directory swapped in whole (weights.py written_whole), after `durable()` made every finished
trajectory durable (the run's journal): a state never names a trajectory the journal lacks, so
a resumed run neither trains one twice nor loses one. A session killed mid-update resumes from
the update before, and does that update again.

Sync: an update trains on everything the step finished (with partial_rollout, the driver hands
over a step's batch of whole groups just before the update, and reports the trajectories it cut
or dropped as stale untrainable; rollout/partial.py). Async: on the first `batch` trajectories
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
import inspect
import json
import math
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

from prorsa.agent.loop import TrajectoryResult
from prorsa.config.training import TrainConfig
from prorsa.shared_weights import WeightManifest
from prorsa.train.export import write_batch
from prorsa.train.grpo import group_advantages
from prorsa.train.handle import LocalTrainer, TrainerHandle
from prorsa.train.samples import Sample, trainable_sample
from prorsa.train.weights import SHARED, SHARED_MANIFEST, written_whole

# a model directory (weight_sync disk) or a shared-memory region's manifest (memory) into every engine
Push = Callable[[Path | WeightManifest], Awaitable[None]]
STATE = "learner.json"  # in state_dir, beside the trainer's own state under TRAINER_STATE
TRAINER_STATE = "trainer"


class Finished(NamedTuple):
    traj_id: str
    policy_version: int  # the version it started under
    sample: Sample | None  # None: failed or without a reward; taken, never trained
    stale: bool = False  # a partial rollout dropped it past max_staleness (sample None)


@dataclass(frozen=True)
class UpdateRecord:
    version: int  # the weights this update made (1 = first update)
    at_s: float  # seconds since the rollout began, when the new weights were in every engine
    trajectories: int  # trained
    dropped_stale: int  # too stale to train (async; sync: a partial rollout's carried groups past the bound)
    max_staleness: int  # of the trained ones: trainer version - version they started under
    reward_mean: float  # of the trained trajectories (NaN rewards left out)
    loss: float
    kl: float
    clip_fraction: float
    tokens: int  # generated tokens trained
    train_s: float
    save_s: float
    push_s: float


@dataclass(frozen=True)
class LearnerFiles:
    """What a learner keeps beside its weights, each optional (the module docstring)."""

    log_path: Path | None = None  # train.jsonl: one UpdateRecord a line
    batches_dir: Path | None = None  # each trained batch, v<N>.parquet
    state_dir: Path | None = None  # what a resume starts from
    durable: Callable[[], None] | None = None  # makes every finished trajectory durable before a state names it


class Learner:
    def __init__(self, cfg: TrainConfig, trainer, weights_dir: Path, push: Push,
                 batch: int, mode: str, now: Callable[[], float] = time.monotonic,
                 files: LearnerFiles = LearnerFiles()) -> None:
        """`trainer`: a TrainerHandle (async methods), or a PolicyTrainer to wrap in LocalTrainer."""
        self.cfg = cfg
        self.trainer: TrainerHandle = trainer if inspect.iscoroutinefunction(getattr(trainer, "step", None)) \
            else LocalTrainer(trainer)
        self.weights_dir = Path(weights_dir)
        self.push = push
        self.batch = batch
        self.mode = mode
        self.now = now
        self.log_path = files.log_path
        self.batches_dir = files.batches_dir
        self.state_dir = files.state_dir
        self.durable = files.durable
        if self.batches_dir is not None:
            self.batches_dir.mkdir(parents=True, exist_ok=True)
        self.version = 0
        self.records: list[UpdateRecord] = []
        self.trained_versions: list[tuple[str, int, int]] = []  # (traj_id, started under, trained at)
        self._finished: list[Finished] = []
        self._taken: list[str] = []  # trajectory ids every update so far took, in order
        self._lock = asyncio.Lock()  # async: updates started back to back train one after another

    def on_done(self, result: TrajectoryResult) -> None:
        self._finished.append(Finished(result.spec.traj_id, result.policy_version, trainable_sample(result),
                                       stale=result.status == "stale"))

    def restore(self, entries: Iterable[Finished]) -> None:
        """Ahead of anything this session finishes: they finished first."""
        self._finished[:0] = list(entries)

    def may_start(self, started: int) -> bool:
        return self.version >= started // self.batch - self.cfg.max_staleness

    async def update(self) -> None:
        async with self._lock:
            await self._update()

    def _take(self) -> tuple[list[Finished], int]:
        if self.mode == "sync":
            taken, self._finished = self._finished, []
        else:
            taken, self._finished = self._finished[:self.batch], self._finished[self.batch:]
        self._taken += [f.traj_id for f in taken]
        if self.mode == "sync":  # the driver judged staleness already (a partial rollout's)
            return taken, sum(f.stale for f in taken)
        fresh = [f for f in taken if self.version - f.policy_version <= self.cfg.max_staleness]
        return fresh, len(taken) - len(fresh)

    async def _update(self) -> None:
        taken, dropped = self._take()
        samples = [f.sample for f in taken if f.sample is not None]
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
        target = await self._publish(self.cfg.sync_changed_only)
        t2 = time.monotonic()
        await self.push(target)
        t3 = time.monotonic()
        trained_at = self.version
        self.trained_versions += [(s.traj_id, s.policy_version, trained_at) for s in samples]
        rewards = [s.reward for s in samples if not math.isnan(s.reward)]
        record = UpdateRecord(
            version=self.trainer.version, at_s=round(self.now(), 3), trajectories=len(samples), dropped_stale=dropped,
            max_staleness=max((trained_at - s.policy_version for s in samples), default=0),
            reward_mean=round(sum(rewards) / len(rewards), 4) if rewards else math.nan,
            loss=round(stats.loss, 6) if stats else math.nan, kl=round(stats.kl, 6) if stats else math.nan,
            clip_fraction=round(stats.clip_fraction, 4) if stats else math.nan,
            tokens=stats.tokens if stats else 0,
            train_s=round(t1 - t0, 3), save_s=round(t2 - t1, 3), push_s=round(t3 - t2, 3))
        self.records.append(record)
        await self._save_state()  # before the version moves: nothing starts under one a resume lacks
        self.version = self.trainer.version
        if self.log_path is not None:
            with self.log_path.open("a") as f:
                f.write(json.dumps(asdict(record)) + "\n")
        self._prune()

    async def _publish(self, changed_only: bool) -> Path | WeightManifest:
        """The new weights where the engines load them from: weights/v<N> on disk, or the trainer's
        shared-memory region (train.weight_sync: memory; its manifest also goes to weights/SHARED,
        which an engine restarted by its worker loads: train/weights.py)."""
        if self.cfg.weight_sync == "disk":
            target = self.weights_dir / f"v{self.trainer.version}"
            await self.trainer.save(target)
            return target
        manifest = await self.trainer.share(changed_only)
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        with written_whole(self.weights_dir / SHARED) as tmp:
            (tmp / SHARED_MANIFEST).write_text(manifest.whole().to_json())
        return manifest

    async def _save_state(self) -> None:
        if self.state_dir is None:
            return
        if self.durable is not None:
            self.durable()
        with written_whole(self.state_dir) as tmp:
            (tmp / TRAINER_STATE).mkdir()
            await self.trainer.save_state(tmp / TRAINER_STATE)
            (tmp / STATE).write_text(json.dumps({"version": self.trainer.version, "taken": self._taken,
                                                 "records": [asdict(r) for r in self.records]}) + "\n")

    async def load_state(self) -> set[str]:
        """Nothing saved: a fresh start, an empty set. Else the trainer continues from the saved
        state, weight versions past it (a session killed before its state) go, train.jsonl is
        rewritten to the saved records, and the engines load the saved version's weights."""
        if self.state_dir is None or not (self.state_dir / STATE).is_file():
            return set()
        state = json.loads((self.state_dir / STATE).read_text())
        await self.trainer.load_state(self.state_dir / TRAINER_STATE)
        if self.trainer.version != state["version"]:
            raise RuntimeError(f"{self.state_dir}: the trainer's state is at version {self.trainer.version}, "
                               f"{STATE} says {state['version']}")
        self.version = state["version"]
        self.records = [UpdateRecord(**r) for r in state["records"]]
        self._taken = list(state["taken"])
        for path in self.weights_dir.glob("v*"):
            if path.name[1:].isdigit() and int(path.name[1:]) > self.version:
                shutil.rmtree(path, ignore_errors=True)
        if self.log_path is not None:
            self.log_path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in self.records))
        if self.version > 0:
            await self.push(self.weights_dir / f"v{self.version}" if self.cfg.weight_sync == "disk"
                            else await self._publish(changed_only=False))
        return set(self._taken)

    def close(self) -> None:
        """The run is over: a trainer's shared region (weight_sync memory) goes."""
        close = getattr(self.trainer, "close", None)
        if close is not None:
            close()

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
