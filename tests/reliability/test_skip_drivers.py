"""The drivers on a resumed run: the same slots as a fresh one, the saved ones left out."""

from __future__ import annotations

import asyncio

import pytest

from prorsa.agent.loop import TurnResult
from prorsa.agent.workload import Workload
from prorsa.config.pipeline import WorkloadConfig
from prorsa.rollout.drivers import run_async, run_sync


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
                      lambda r: done.append(r.spec.traj_id), skip=skip))
    return done


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_resumed_run_runs_exactly_the_rest(mode):
    every = _ids(mode, frozenset())
    assert len(every) == len(set(every)) == 12
    saved = frozenset(every[::3]) | {every[-1]}
    rest = _ids(mode, saved)
    assert sorted(rest) == sorted(set(every) - saved) and len(rest) == len(set(rest))
    assert _ids(mode, frozenset(every)) == []
