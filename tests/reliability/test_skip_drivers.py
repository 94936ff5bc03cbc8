"""The drivers on a resumed run: the same slots as a fresh one, the saved ones left out. And under
the RL loop: every result tagged with the version it started under, and the async gate holding
starts back until weight updates catch up, without a deadlock."""

from __future__ import annotations

import asyncio

import pytest

from prorsa.agent.loop import TurnResult
from prorsa.agent.workload import Workload
from prorsa.config.pipeline import WorkloadConfig
from prorsa.rollout.drivers import Hooks, run_async, run_sync


class InstantRunner:
    needs_token_ids = False
    vocab_size = 0

    async def run_turn(self, req):
        await asyncio.sleep(0)
        return TurnResult(req.traj_id, req.turn, "e0", "e1", req.appended_tokens, 0, req.decode_tokens)


def _ids(mode: str, skip: frozenset) -> list[str]:
    cfg = WorkloadConfig(family="search", mode=mode, prompts=3, group_size=2, steps=2, concurrency=3,
                         trajectories=12, max_turns=2)
    done: list[str] = []
    drive = run_sync if mode == "sync" else run_async
    asyncio.run(drive(Workload.from_config(cfg, 7), cfg, InstantRunner(), lambda: 0.0,
                      Hooks(lambda r: done.append(r.spec.traj_id), skip=skip)))
    return done


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_resumed_run_runs_exactly_the_rest(mode):
    every = _ids(mode, frozenset())
    assert len(every) == len(set(every)) == 12
    saved = frozenset(every[::3]) | {every[-1]}
    rest = _ids(mode, saved)
    assert sorted(rest) == sorted(set(every) - saved) and len(rest) == len(set(rest))
    assert _ids(mode, frozenset(every)) == []


def _cfg(mode: str) -> WorkloadConfig:
    return WorkloadConfig(family="search", mode=mode, prompts=2, group_size=2, steps=3, concurrency=8,
                          trajectories=16, max_turns=2)


def test_async_gate_keeps_rollout_within_max_staleness_of_the_updates():
    cfg, version, batch, max_staleness = _cfg("async"), [0], 4, 1
    refused = []

    async def update() -> None:
        await asyncio.sleep(0.02)  # longer than a trajectory: without the gate rollout would run ahead
        version[0] += 1

    def gate(started: int) -> bool:
        ok = version[0] >= started // batch - max_staleness
        if not ok:
            refused.append(started)
        return ok

    results = asyncio.run(run_async(Workload.from_config(cfg, 3), cfg, InstantRunner(), lambda: 0.0,
                                    Hooks(lambda r: None, update_weights=update, version=lambda: version[0],
                                          gate=gate)))
    assert len(results) == 16 and len({r.spec.traj_id for r in results}) == 16
    for r in results:
        index = int(r.spec.traj_id[1:])
        assert r.policy_version >= index // batch - max_staleness, (r.spec.traj_id, r.policy_version)
    assert max(r.policy_version for r in results) >= 2
    assert refused  # the gate held starts back, and the updates let them go on


def test_sync_results_carry_the_version_of_their_step():
    cfg, version = _cfg("sync"), [0]

    async def update() -> None:
        version[0] += 1

    results = asyncio.run(run_sync(Workload.from_config(cfg, 3), cfg, InstantRunner(), lambda: 0.0,
                                   Hooks(lambda r: None, update_weights=update, version=lambda: version[0])))
    assert [(r.spec.step, r.policy_version) for r in results] == [(s, s) for s in range(3) for _ in range(4)]
