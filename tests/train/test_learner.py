"""The RL loop's learner with the real trainer on the tiny model: what it trains, drops, saves,
pushes and records, and how far it lets an async rollout run ahead."""

import asyncio
import json

import pytest
import torch

from prorsa.agent.loop import TrajectoryResult, TurnResult
from prorsa.agent.workload import TrajectorySpec, TurnSpec
from prorsa.config.pipeline import TrainConfig
from prorsa.train.export import read_batch
from prorsa.train.learner import Learner, LearnerFiles
from prorsa.train.trainer import Trainer, TrainerConfig


def _result(traj_id: str, prompt: int, reward: float, version: int) -> TrajectoryResult:
    spec = TrajectorySpec(traj_id, "arith", prompt, 0, 0, (TurnSpec(5, 4, 0.0, True),), 7)
    r = TrajectoryResult(spec=spec, status="completed", reward=reward, prompt_ids=(11, 12, 13, 14, 15),
                         policy_version=version)
    gen = (100 + prompt, 101, 102, 103)
    r.turns.append(TurnResult(traj_id, 0, "", "e0", 5, 0, len(gen), token_ids=gen, logprobs=(-1.0,) * len(gen)))
    return r


@pytest.fixture
def learner(tiny_dir, tmp_path):
    def make(mode: str, batch: int, max_staleness: int = 1):
        pushed = []

        async def push(path):
            pushed.append(path)

        trainer = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=4, threads=1))
        learner = Learner(TrainConfig(max_staleness=max_staleness, keep_checkpoints=2), trainer,
                          tmp_path / "weights", push, batch, mode,
                          files=LearnerFiles(tmp_path / "train.jsonl", tmp_path / "batches"))
        return learner, pushed
    return make


def test_sync_update_trains_the_step_saves_pushes_and_records(learner, tmp_path):
    lr, pushed = learner("sync", batch=4)
    for i, reward in enumerate([0.0, 1.0, 0.2, 0.2]):
        lr.on_done(_result(f"t{i}", prompt=i // 2, reward=reward, version=0))
    asyncio.run(lr.update())
    assert lr.version == 1 and pushed == [tmp_path / "weights" / "v1"]
    assert (tmp_path / "weights" / "v1" / "config.json").is_file()
    (row,) = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert row["version"] == 1 and row["trajectories"] == 4 and row["max_staleness"] == 0
    assert row["reward_mean"] == pytest.approx(0.35)
    exported = read_batch(tmp_path / "batches" / "v0.parquet")
    # group-normalised: prompt 0 (0.0 vs 1.0) has signal, prompt 1 (0.2, 0.2) none
    assert [round(e.advantage, 3) for e in exported] == [-1.0, 1.0, 0.0, 0.0]


def test_async_learner_drops_what_is_too_stale_and_gates_the_rollout(learner, tmp_path):
    lr, pushed = learner("async", batch=2, max_staleness=1)
    assert [lr.may_start(i) for i in (0, 3, 4)] == [True, True, False]  # versions 0 and 1 may start at 0
    lr.on_done(_result("a", 0, 1.0, version=0))
    lr.on_done(_result("b", 0, 0.0, version=0))
    lr.on_done(_result("c", 1, 1.0, version=0))  # stays queued: not among the first two to finish
    asyncio.run(lr.update())
    assert lr.version == 1 and lr.may_start(4) and not lr.may_start(6)
    lr.on_done(_result("d", 1, 0.0, version=1))
    asyncio.run(lr.update())  # c (1 behind) and d (0 behind) are trained
    lr.on_done(_result("e", 2, 1.0, version=0))  # 2 behind at version 2: dropped
    lr.on_done(_result("f", 2, 0.0, version=2))
    asyncio.run(lr.update())
    rows = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [(r["trajectories"], r["dropped_stale"], r["max_staleness"]) for r in rows] == [(2, 0, 0), (2, 0, 1), (1, 1, 0)]
    assert [v for _, v, _ in lr.trained_versions] == [0, 0, 0, 1, 2]
    assert lr.version == 3 and len(pushed) == 3
    # keep_checkpoints=2: v1 went, the newest two stay
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]
    assert lr.summary()["max_trained_staleness"] == 1 and lr.summary()["dropped_stale"] == 1


def test_sync_learner_trains_a_partial_rollouts_batch_and_counts_its_stale_drops(learner, tmp_path):
    lr, _ = learner("sync", batch=4)
    for i, reward in enumerate([0.0, 1.0, 0.2, 0.9]):
        lr.on_done(_result(f"t{i}", prompt=i // 2, reward=reward, version=0))
    asyncio.run(lr.update())
    # step 1's batch: a group carried from step 0 (started under version 0), one of its own, and a
    # group the driver dropped as stale (untrainable, counted)
    for i, (reward, version) in enumerate([(0.0, 0), (1.0, 0), (0.3, 1), (0.6, 1)]):
        lr.on_done(_result(f"u{i}", prompt=i // 2, reward=reward, version=version))
    for i in range(2):
        stale = _result(f"x{i}", prompt=9, reward=1.0, version=0)
        stale.status = "stale"
        lr.on_done(stale)
    asyncio.run(lr.update())
    rows = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [(r["trajectories"], r["dropped_stale"], r["max_staleness"]) for r in rows] == [(4, 0, 0), (4, 2, 1)]
    assert {t for t, _, _ in lr.trained_versions} == {"t0", "t1", "t2", "t3", "u0", "u1", "u2", "u3"}


def test_memory_sync_publishes_into_the_region_and_pushes_its_manifest(tiny_dir, tmp_path):
    """train.weight_sync: memory: no weights/v<N> on disk; the engines get a manifest of the shared
    region, which holds the trained weights, and weights/shared names it for a restarted engine."""
    from prorsa.shared_weights import SharedRegion, WeightManifest, read_tensors
    from prorsa.train.handle import LocalTrainer
    from prorsa.train.weights import shared_manifest

    pushed = []

    async def push(weights):
        pushed.append(weights)

    trainer = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=4, threads=1))
    region = SharedRegion(tmp_path / "region")
    lr = Learner(TrainConfig(weight_sync="memory"), LocalTrainer(trainer, region), tmp_path / "weights", push, 4,
                 "sync")
    for i, reward in enumerate([0.0, 1.0, 0.2, 0.2]):
        lr.on_done(_result(f"t{i}", prompt=i // 2, reward=reward, version=0))
    asyncio.run(lr.update())
    (m,) = pushed
    assert isinstance(m, WeightManifest) and m.load is None and m.written_bytes == m.total_bytes
    assert not (tmp_path / "weights" / "v1").exists()
    held = dict(read_tensors(m))
    assert all(torch.equal(held[k], t) for k, t in trainer.named_weights())
    assert WeightManifest.from_json(shared_manifest(tmp_path)) == m.whole()
    # a step that changes nothing (every trajectory failed) moves no bytes
    asyncio.run(lr.update())
    assert pushed[-1].load == () and pushed[-1].written_bytes == 0
    lr.close()
    assert not (tmp_path / "region").exists()


def test_memory_sync_needs_the_trainer_in_the_driver():
    with pytest.raises(ValueError, match="placement: driver"):
        TrainConfig(weight_sync="memory", placement="worker")
