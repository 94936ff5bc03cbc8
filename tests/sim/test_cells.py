"""Simulated cells (sim/cells.py): one cell is the one-cell simulator; more split the trajectories
and the coordinator moves an engine to the cell whose work outlasts the other's."""

from __future__ import annotations

import pytest

from prorsa.config.pipeline import PipelineConfig
from prorsa.sim.cells import simulate_cells
from prorsa.sim.run import simulate
from prorsa.rollout.context import resolve


def config(engines: int, prompts: int, group: int, seed: int = 0) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": "cells", "seed": seed, "policy": "prorsa",
        "engines": {"backend": "emulated", "count": engines, "slots": 64, "gpu": "h200", "model": "qwen3-8b"},
        "workload": {"family": "swe", "mode": "sync", "prompts": prompts, "group_size": group, "steps": 1,
                     "max_turns": 12}})  # fmt: skip


def test_one_cell_is_the_one_cell_simulator():
    cfg = config(8, 8, 8)
    assert simulate_cells(cfg, 1).makespan_s == pytest.approx(simulate(resolve(cfg)).makespan_s, rel=1e-9)


def test_two_cells_run_every_trajectory_once_and_move_an_engine_to_the_longer_cell():
    # two GRPO groups of 32, one a cell: seed 0's group in cell 0 runs three times as long
    out = simulate_cells(config(4, 2, 32), 2, restart_s=10.0)
    ids = out.trajectory_ids()
    assert len(ids) == len(set(ids)) == 64
    assert [len(r.trajectories) for r in out.recorders] == [32, 32]
    (move,) = out.moves
    assert (move.source, move.target) == (1, 0) and move.engine in ("engine-2", "engine-3")
    assert move.restart_s == pytest.approx(10.0) and move.drain_s >= 0
    engines_used = {s.load.engine_id for s in out.recorders[0].samples}
    assert move.engine in engines_used  # it served its new cell
    assert out.makespan_s == max(out.cell_makespans)


def test_cells_refuse_what_they_do_not_run():
    with pytest.raises(ValueError, match="cells"):
        simulate_cells(config(4, 2, 8), 5)
