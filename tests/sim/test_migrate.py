"""scheduling.migrate in the simulator: a trajectory moves while its tool runs, and its next turn
finds its context cached where it went."""

from __future__ import annotations

from prorsa.config.pipeline import PipelineConfig
from prorsa.sim.run import simulate
from prorsa.rollout.context import resolve

# 32 trajectories on 4 engines of 4 slots: turns queue, and the engines' queues differ
CONTENDED = {"name": "migrate", "seed": 3, "policy": "colocated",
             "engines": {"backend": "emulated", "count": 4, "slots": 4, "model": "qwen3-8b"},
             "workload": {"family": "swe", "mode": "sync", "prompts": 8, "group_size": 4, "max_turns": 6,
                          "tool_time_scale": 0.25},
             "runtime": {"sticky_overload": "cost"}}


def _moves(run) -> tuple[int, int]:
    """(turns on another engine than the trajectory's last turn, those that recomputed nothing)."""
    moved = free = 0
    for traj in run.recorder.trajectories:
        for last, turn in zip(traj.turns, traj.turns[1:]):
            if turn.decode_engine != last.decode_engine:
                moved += 1
                free += turn.recomputed_tokens == 0
    return moved, free


def test_a_migrated_trajectory_recomputes_nothing_where_it_went():
    off, on = (simulate(resolve(PipelineConfig.model_validate(CONTENDED | {"scheduling": {"migrate": m}})), "colocated")
               for m in (False, True))
    for run in (off, on):
        assert run.summary["trajectories_completed"] == 32 and run.summary["trajectories_failed"] == 0
    moved, free = _moves(off)
    assert off.summary["turns_migrated"] == 0 and moved > 0 and free == 0  # a move at routing recomputes
    moved, free = _moves(on)
    assert on.summary["turns_migrated"] > 0
    assert 0 < free <= on.summary["turns_migrated"]  # warmed while the tool ran: the context was there


def test_migrate_needs_the_cost_rule_and_the_driver_shape():
    import pytest

    with pytest.raises(ValueError, match="scheduling.migrate prices moves"):
        PipelineConfig.model_validate(CONTENDED | {"runtime": {"sticky_overload": 2.0}, "scheduling": {"migrate": True}})
    with pytest.raises(ValueError, match="turn_shape driver"):
        PipelineConfig.model_validate(CONTENDED | {"runtime": {"sticky_overload": "cost", "turn_shape": "in_task"},
                                                   "scheduling": {"migrate": True}})
