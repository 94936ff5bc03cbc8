"""benchmarks/partial_rollout.py on recorded traces: a recorded trajectory's samples make one GRPO
group when the pipeline replays them, the recorded model's time comes out of start-to-start gaps,
bad trace files stop with one line naming them, and tables.py renders the results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prorsa.agent.importers import import_trace
from prorsa.agent.trace import read_trace
from prorsa.agent.workload import Workload
from prorsa.config.pipeline import WorkloadConfig
from tests.benchmark_scripts import load_script

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "benchmarks" / "traces"


@pytest.fixture(scope="module")
def pr():
    return load_script("partial_rollout.py")


def _turn(traj: int, turn: int, decode: int, gap: float, done: bool, **extra) -> str:
    return json.dumps({"traj": traj, "turn": turn, "appended_tokens": 100, "decode_tokens": decode,
                       "tool_latency_s": gap, "done": done, **extra})


def test_a_recorded_trajectory_is_one_group_of_its_own_lengths(pr, tmp_path):
    name, cell, grouped = pr._import(str(TRACES / "lmcache_miniswe.jsonl"), 0.0, tmp_path)
    _, recorded = import_trace(TRACES / "lmcache_miniswe.jsonl")  # gaps as recorded, as asked above
    assert (name, cell["recorded"], cell["turns"], cell["decode_tps"]) == ("lmcache_miniswe", 20, 402, 0.0)
    cfg = WorkloadConfig(trace=grouped, prompts=32, group_size=pr.GROUP, steps=2)
    w = Workload.from_config(cfg, 0)
    for step in (0, 1):
        specs = w.trajectories_for_step(step)
        for p in range(32):
            group = specs[p * pr.GROUP:(p + 1) * pr.GROUP]
            source = recorded[(step * 32 + p) % 20]  # prompts cycle through the recorded tasks
            assert all(s.turns == source.turns and s.start_s is None for s in group)
            assert len({s.seed for s in group}) == pr.GROUP  # token ids of their own
    # the async driver's groups (G consecutive indices) line up the same way
    a = Workload.from_config(cfg.model_copy(update={"mode": "async", "trajectories": 64}), 0)
    assert all(a.trajectory(i).turns == recorded[i // pr.GROUP].turns for i in range(64))


def test_fastest_takes_out_the_model_time_the_record_allows(pr, tmp_path):
    src = tmp_path / "calls.jsonl"
    # 100 tokens in a 1 s gap and 300 in 2 s: the fastest is 150 tokens/s; the person's wait is its own time
    src.write_text("\n".join([_turn(0, 0, 100, 1.0, False), _turn(0, 1, 300, 2.0, False),
                              _turn(0, 2, 50, 9.0, False, gap_kind="human_or_other"), _turn(0, 3, 10, 0.0, True)]))
    _, cell, grouped = pr._import(str(src), None, tmp_path)
    assert cell["decode_tps"] == 150.0
    tools = [t.tool_latency_s for t in read_trace(grouped)[0].turns]
    assert tools == pytest.approx([1.0 - 100 / 150, 0.0, 9.0, 0.0])


@pytest.mark.parametrize("content", [None, _turn(0, 0, 10, 1.0, False) + "\n{not json\n"])
def test_a_missing_or_malformed_trace_stops_with_one_line_naming_it(pr, tmp_path, content):
    src = tmp_path / "bad.jsonl"
    if content is not None:
        src.write_text(content)
    with pytest.raises(SystemExit) as exit_:
        pr._import(str(src), None, tmp_path)
    message = str(exit_.value.code)
    assert message.startswith("error: --trace: ") and str(src) in message and "\n" not in message


def test_the_traces_table_renders_each_trace_and_cell(pr):
    import tables

    point = {"trace": "t", "model": "moe", "prompts": 32, "steps": 4, "seed": 0, "makespan_s": 100.0,
             "trained_per_s": 1.0, "dropped": 0, "trained_tokens": 1000, "older_token_share": 0.0,
             "largest_lag": 0, "step_end_s": [50.0, 100.0]}
    doc = {"command": "python benchmarks/partial_rollout.py --trace benchmarks/traces/t.jsonl",
           "cells": [{"trace": "t", "source": "benchmarks/traces/t.jsonl", "recorded": 3, "turns": 9,
                      "decode_tps": 120.0, "tool_s_mean": 0.5, "model": "moe", "step_bound_s": [40.0, 40.0],
                      "vs_sync": {"sync": 1.0, "async": 1.5}, "tokens_vs_sync": {"sync": 1.0, "async": 1.2}}],
           "points": [point | {"mode": "sync"}, point | {"mode": "async", "makespan_s": 66.7, "dropped": 4}]}
    lines = tables.t_partial_rollout_traces({"partial-rollout-traces.json": doc})
    assert "| t | MoE | async | 67 s | 1.000 | 1.50 | 1.20 | 4 | 0.0% | 0 | 50 / 100 |  |" in lines
    assert any("t: 3 recorded trajectories, 9 turns" in line and "120 tokens/s" in line for line in lines)
