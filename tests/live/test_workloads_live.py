"""A trace's releases and a shifting family mix in a live run (Dask, emulated engines time-scaled):
the drivers are the simulator's, on the wall clock."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pyarrow.parquet as pq
from rich.console import Console

from prorsa.agent.trace import write_trace
from prorsa.agent.workload import Workload
from prorsa.config.pipeline import PipelineConfig, WorkloadConfig
from prorsa.live.run import run_live
from prorsa.rollout.context import resolve
from prorsa.sim.run import lend

ENGINES = {"backend": "emulated", "count": 2, "slots": 16, "gpu": "h200", "model": "qwen3-8b", "time_scale": 0.01}
RUNTIME = {"dashboard_address": None, "control_interval_s": 0.05, "metrics_interval_s": 0.2}
RELEASES = [0.0, 0.0, 1.0, 2.5]  # wall seconds: the drivers' clock live


def _run(tmp_path, workload: dict) -> list[dict]:
    cfg = PipelineConfig.model_validate({"name": "w", "policy": "colocated", "engines": ENGINES,
                                         "workload": workload, "runtime": RUNTIME})
    (tmp_path / "run").mkdir(parents=True)
    summary = asyncio.run(run_live(resolve(cfg), tmp_path / "run", Console(quiet=True), lend=lend))
    assert summary["trajectories_failed"] == 0
    return pq.read_table(tmp_path / "run" / "trajectories.parquet").to_pylist()


def test_releases_and_a_mix_run_live(tmp_path):
    specs = Workload.from_config(WorkloadConfig(family="search", prompts=4, group_size=1, max_turns=2,
                                                tool_time_scale=0.01), 1).trajectories_for_step(0)
    write_trace(tmp_path / "t.jsonl", [replace(s, start_s=r) for s, r in zip(specs, RELEASES)])
    rows = _run(tmp_path, {"trace": str(tmp_path / "t.jsonl"), "prompts": 4, "group_size": 1})
    starts = {r["prompt_index"]: r["start_s"] for r in rows}
    # none before its release, and in the order released (how late is the host's load, not the driver)
    assert all(RELEASES[i] <= starts[i] for i in range(4)), starts
    assert max(starts[0], starts[1]) < starts[2] < starts[3], starts
    assert max(r["end_s"] for r in rows) >= 2.5

    mix = {"mix": {"swe": 1}, "mix_end": {"search": 1}, "steps": 2, "prompts": 2, "group_size": 2, "max_turns": 2,
           "tool_time_scale": 0.01}
    rows = _run(tmp_path / "mix", mix)
    assert sorted((r["step"], r["family"]) for r in rows) == [(0, "swe")] * 4 + [(1, "search")] * 4
