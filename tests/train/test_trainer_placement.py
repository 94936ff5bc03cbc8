"""train.placement: worker puts the Trainer on a Dask worker of its own (resource trainer: 1). The
Learner then steps and saves through the actor: the step runs there, the weights land in the run
directory, and they are the driver placement's weights on the same samples and seed."""

import asyncio
import os

import pytest
import torch
from distributed import Client, Scheduler, SpecCluster, Worker
from safetensors.torch import load_file

from prorsa.agent.loop import TrajectoryResult, TurnResult
from prorsa.agent.workload import TrajectorySpec, TurnSpec
from prorsa.cluster.local import TRAINER_NAME, tool_resources, trainer_worker_spec
from prorsa.config.pipeline import TrainConfig
from prorsa.rl.remote_trainer import open_remote_trainer
from prorsa.train.learner import Learner
from prorsa.train.trainer import Trainer, TrainerConfig

CONFIG = TrainerConfig(lr=1e-3, micro_batch=2, threads=1, seed=3)


def _two_turns(i: int, reward: float) -> TrajectoryResult:
    """gen | observation | gen; odd trajectories carry no engine logprobs (the trainer scores them)."""
    spec = TrajectorySpec(f"t{i}", "arith", i // 2, 0, 0, (TurnSpec(4, 3, 0.0, False), TurnSpec(2, 3, 0.0, True)), 5)
    r = TrajectoryResult(spec=spec, status="completed", reward=reward, prompt_ids=(21, 22, 23, 24))
    for k in range(2):
        gen = (200 + 7 * i + k, 201 + k, 202)
        logprobs = (-0.5 - 0.1 * k,) * 3 if i % 2 == 0 else ()
        r.turns.append(TurnResult(f"t{i}", k, "", "e0", 4, 0, 3, token_ids=gen, logprobs=logprobs,
                                  observation_ids=(31, 32) if k == 0 else ()))
    return r


async def _noop_push(path) -> None:
    pass


async def _train(trainer, weights_dir) -> Learner:
    learner = Learner(TrainConfig(keep_checkpoints=3), trainer, weights_dir, _noop_push, batch=4, mode="sync")
    for i, reward in enumerate([0.0, 1.0, 0.3, 0.1]):
        learner.on_done(_two_turns(i, reward))
    await learner.update()
    await learner.update()  # nothing finished since: the weights stay, the version moves
    return learner


async def _on_trainer_worker(tiny_dir, weights_dir):
    workers = {
        # a process of its own (as with runtime.processes): the samples travel by pickle
        TRAINER_NAME: trainer_worker_spec(processes=True),
        # a worker without the resource: the actor must not land here
        "tools-0": {"cls": Worker, "options": {"name": "tools-0", "nthreads": 1, "resources": tool_resources(1),
                                "dashboard": False}},
    }
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False}}
    async with SpecCluster(workers=workers, scheduler=scheduler, asynchronous=True) as cluster, \
            Client(cluster, asynchronous=True) as client:
        trainer = await open_remote_trainer(client, tiny_dir, CONFIG)
        learner = await _train(trainer, weights_dir)
        info = await client.scheduler.identity(n_workers=-1)
        names = {addr: w["name"] for addr, w in info["workers"].items()}
        return learner, await trainer.where(), names


def _weights(model_dir) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def test_the_remote_trainer_steps_on_the_trainer_worker_and_matches_the_driver(tiny_dir, tmp_path):
    remote, where, names = asyncio.run(_on_trainer_worker(tiny_dir, tmp_path / "worker" / "weights"))
    assert where["name"] == TRAINER_NAME and names[where["address"]] == TRAINER_NAME and where["pid"] != os.getpid()
    assert where["steps"] == 1 and where["thread"].startswith(f"{TRAINER_NAME}-Dask-Actor-Threads")
    assert remote.version == 2 and [r.version for r in remote.records] == [1, 2]
    assert remote.records[0].trajectories == 4 and remote.records[1].trajectories == 0

    local = asyncio.run(_train(Trainer(tiny_dir, CONFIG), tmp_path / "driver" / "weights"))
    assert local.version == 2
    for v in ("v1", "v2"):
        mine, theirs = _weights(tmp_path / "worker" / "weights" / v), _weights(tmp_path / "driver" / "weights" / v)
        assert mine.keys() == theirs.keys()
        for name in mine:
            torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-6)
    start, moved = _weights(tiny_dir), _weights(tmp_path / "worker" / "weights" / "v1")
    assert any(not torch.equal(start[n], moved[n]) for n in start)  # the step did change the weights
    for a, b in zip(remote.records, local.records):
        assert (a.loss, a.kl, a.clip_fraction, a.tokens) == pytest.approx((b.loss, b.kl, b.clip_fraction, b.tokens),
                                                                           nan_ok=True, rel=1e-4)
