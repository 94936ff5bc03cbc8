"""A training run's state after every update, and a resume from it, with the real trainer on the
tiny model: stopped after update k, a new learner and trainer pick up at version k with the saved
AdamW moments, and the updates after it are the ones an uninterrupted run makes."""

import asyncio
import json

import pytest
import torch

from prorsa.config.pipeline import TrainConfig
from prorsa.train.learner import STATE, TRAINER_STATE, Finished, Learner, LearnerFiles
from prorsa.train.samples import sample_of
from prorsa.train.trainer import Trainer, TrainerConfig

from step_results import BATCH, step_result as _result

STEPS = 4


class Run:
    """A sync run's learner over a run directory; `durable` records when the journal was flushed."""

    def __init__(self, tiny_dir, run_dir) -> None:
        self.pushed, self.flushes = [], 0

        async def push(path):
            self.pushed.append(path.name)

        def durable():
            self.flushes += 1

        self.trainer = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=2, threads=1, seed=5))
        self.learner = Learner(TrainConfig(keep_checkpoints=2), self.trainer, run_dir / "weights", push, BATCH,
                               "sync", files=LearnerFiles(run_dir / "train.jsonl", run_dir / "batches",
                                                          run_dir / "trainer-state", durable))

    def steps(self, first: int, last: int) -> None:
        async def go():
            for step in range(first, last):
                for i in range(BATCH):
                    self.learner.on_done(_result(step, i, self.learner.version))
                await self.learner.update()
        asyncio.run(go())


def _moments(trainer: Trainer) -> list[torch.Tensor]:
    return [s[k] for s in trainer.optimizer.state_dict()["state"].values() for k in ("exp_avg", "exp_avg_sq")]


def test_a_run_stopped_after_step_k_resumes_where_it_stopped_and_matches_an_uninterrupted_one(tiny_dir, tmp_path):
    whole = Run(tiny_dir, tmp_path / "whole")
    whole.steps(0, STEPS)

    k = 2
    first = Run(tiny_dir, tmp_path / "parts")
    first.steps(0, k)
    assert first.flushes == k  # the journal made durable before each state named what it took
    saved = _moments(first.trainer)
    state = json.loads((tmp_path / "parts" / "trainer-state" / STATE).read_text())
    assert state["version"] == k and len(state["records"]) == k
    assert state["taken"] == [f"s{s}-t{i}" for s in range(k) for i in range(BATCH)]
    # a session killed mid-update: its weights went out, its state never did
    (tmp_path / "parts" / "weights" / f"v{k + 1}").mkdir()
    (tmp_path / "parts" / "weights" / f"v{k + 1}" / "config.json").write_text("{}")
    with (tmp_path / "parts" / "train.jsonl").open("a") as f:
        f.write('{"version": 99}\n')
    del first

    resumed = Run(tiny_dir, tmp_path / "parts")
    assert resumed.trainer.version == 0 and all(m.abs().sum() == 0 for m in _moments(resumed.trainer))
    taken = asyncio.run(resumed.learner.load_state())
    assert taken == {f"s{s}-t{i}" for s in range(k) for i in range(BATCH)}
    assert resumed.learner.version == resumed.trainer.version == k
    assert resumed.pushed == [f"v{k}"]  # the engines reload the saved version's weights
    moments = _moments(resumed.trainer)
    assert moments and all(m.abs().sum() > 0 for m in moments)
    for mine, theirs in zip(moments, saved):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    assert not (tmp_path / "parts" / "weights" / f"v{k + 1}").exists()
    assert len((tmp_path / "parts" / "train.jsonl").read_text().splitlines()) == k

    resumed.steps(k, STEPS)
    rows = [json.loads(x) for x in (tmp_path / "parts" / "train.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == list(range(1, STEPS + 1))  # each step once, none repeated
    assert [r.version for r in resumed.learner.records] == list(range(1, STEPS + 1))
    assert resumed.learner.summary()["policy_versions"] == STEPS
    assert resumed.learner.summary()["trained_trajectories"] == STEPS * BATCH
    # the same losses and weights as the run that was never stopped
    assert [r.loss for r in resumed.learner.records] == pytest.approx([r.loss for r in whole.learner.records],
                                                                       rel=1e-5, abs=1e-7)
    assert [r.loss for r in resumed.learner.records][k - 1] != [r.loss for r in resumed.learner.records][k]
    for (name, a), (_, b) in zip(whole.trainer.named_weights(), resumed.trainer.named_weights()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert sorted(p.name for p in (tmp_path / "parts" / "weights").iterdir()) == [f"v{STEPS - 1}", f"v{STEPS}"]
    assert sorted(p.name for p in (tmp_path / "parts" / "batches").iterdir()) == [f"v{v}.parquet" for v in range(STEPS)]
    assert (tmp_path / "parts" / "trainer-state" / TRAINER_STATE / "trainer.pt").is_file()


def test_what_finished_before_the_stop_and_no_update_took_is_trained_first(tiny_dir, tmp_path):
    run = Run(tiny_dir, tmp_path)
    run.steps(0, 1)
    asyncio.run(run.learner.load_state())  # as a new session would (the same objects will do here)
    earlier = [_result(1, i, 1) for i in range(2)]  # half of step 1 finished before the stop
    run.learner.restore(Finished(r.spec.traj_id, 1, sample_of(r)) for r in earlier)
    run.learner.restore([Finished("s1-failed", 1, None)])  # taken with them, nothing to train
    for i in range(2, BATCH):
        run.learner.on_done(_result(1, i, 1))
    asyncio.run(run.learner.update())
    record = run.learner.records[-1]
    assert record.version == 2 and record.trajectories == BATCH
    state = json.loads((tmp_path / "trainer-state" / STATE).read_text())
    assert state["taken"][BATCH:] == ["s1-failed", "s1-t0", "s1-t1", "s1-t2", "s1-t3"]


def test_the_journal_gives_back_what_no_saved_update_took_in_the_order_it_finished(tiny_dir, tmp_path):
    """rl/training.py unfinished: rows of the run's journal become the learner's entries again,
    the same samples the trajectories made when they finished (the tokenizer rebuilds the rest)."""
    from prorsa.agent.live_episode import ChatFormat
    from prorsa.rl.training import unfinished
    from prorsa.metrics.journal import RunJournal

    results = [_result(0, i, 0) for i in range(BATCH)] + [_result(1, i, 1) for i in range(3)]
    failed = _result(1, 3, 1)
    failed.status = "failed"
    journal = RunJournal.open(tmp_path, "hash", batch=3)
    for r in results + [failed]:
        journal.add(r)
    journal.flush()
    journal.close()

    again = RunJournal.open(tmp_path, "hash")  # a new session's
    entries = unfinished(again, {f"s0-t{i}" for i in range(BATCH)}, ChatFormat.load(tiny_dir))
    again.close()
    assert [e.traj_id for e in entries] == ["s1-t0", "s1-t1", "s1-t2", "s1-t3"]
    assert [e.policy_version for e in entries] == [1, 1, 1, 1]
    assert [e.sample for e in entries] == [sample_of(r) for r in results[BATCH:]] + [None]
