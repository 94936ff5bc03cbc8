"""Partial rollouts in the simulator: the same driver as live, on emulated engines whose weight
updates stall them and drop every cached prefix, carried trajectories' too."""

from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq

from prorsa.config.pipeline import PipelineConfig
from prorsa.sim.run import simulate, write_run
from prorsa.rollout.context import resolve

BASE = {
    "name": "partial", "seed": 3, "policy": "colocated",
    "engines": {"backend": "emulated", "count": 4, "slots": 32, "model": "qwen3-8b"},
    "workload": {"family": "coding-agent", "mode": "sync", "prompts": 4, "group_size": 4, "steps": 3,
                 "max_turns": 24, "weight_update_s": 2.0},
}


def cfg(partial: dict | None) -> PipelineConfig:
    return PipelineConfig.model_validate(BASE | ({} if partial is None else {"partial_rollout": partial}))


def test_a_partial_rollout_trains_whole_batches_sooner_than_plain_steps(tmp_path):
    plain, partial = simulate(resolve(cfg(None))), simulate(resolve(cfg({"over_sample": 0.5, "carry": True})))
    rs = partial.recorder.trajectories
    trained = [r for r in rs if r.trained_step is not None]
    assert Counter(r.trained_step for r in trained) == {0: 16, 1: 16, 2: 16}
    assert len({r.spec.traj_id for r in rs}) == len(rs)  # each reported once
    assert partial.makespan_s < plain.makespan_s  # the point of it: no waiting for the tail
    # untrained ones are dropped, not failed; completed ones are the trained ones
    s = partial.summary
    assert s["trajectories_completed"] == 48 and s["trajectories_failed"] == 0
    assert s["trajectories_dropped"] == len(rs) - 48 > 0
    carried = [r for r in trained if r.trained_step > r.spec.step]
    assert carried
    # a carried trajectory's first turn under the new weights re-prefills its context, which the
    # update dropped (one decoding through the update may leave its KV cached as it ends: the
    # emulated engine's model of an update, engine/emulated.py)
    crossed = [b for r in carried for a, b in zip(r.turns, r.turns[1:]) if b.policy_version > a.policy_version]
    assert crossed and any(t.cached_tokens == 0 and t.recomputed_tokens > 0 for t in crossed)
    write_run(partial, tmp_path)
    table = pq.read_table(tmp_path / "trajectories.parquet").to_pylist()
    by_id = {row["traj_id"]: row for row in table}
    for r in carried:
        row = by_id[r.spec.traj_id]
        assert row["trained_step"] == r.trained_step
        assert [t["policy_version"] for t in row["turns"]] == [t.policy_version for t in r.turns]


def test_without_carry_the_simulated_engines_end_each_step_empty():
    sim = simulate(resolve(cfg({"over_sample": 0.5, "carry": False})))
    rs = sim.recorder.trajectories
    assert Counter(r.trained_step for r in rs if r.trained_step is not None) == {0: 16, 1: 16, 2: 16}
    assert all(r.trained_step in (None, r.spec.step) for r in rs)
    assert {r.status for r in rs if r.trained_step is None} == {"cancelled"}
