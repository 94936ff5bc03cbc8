"""Every shipped family pipeline runs on emulated engines (time compressed) with all trajectories."""

import asyncio
import json
from pathlib import Path

import pytest
from rich.console import Console

from prorsa.config.load import load_pipeline
from prorsa.live.run import run_live
from prorsa.rollout.context import resolve
from prorsa.sim.run import lend
from prorsa.rollout.drivers import expected_trajectories

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["swe", "search", "math-tir", "terminal"])
def test_family_pipeline_runs(tmp_path, name):
    cfg = load_pipeline(REPO / "pipelines" / f"{name}.yaml", {
        "engines.backend": "emulated", "engines.time_scale": 0.01,
        "workload.tool_time_scale": 0.001, "runtime.dashboard_address": None,
    })
    summary = asyncio.run(run_live(resolve(cfg), tmp_path, Console(quiet=True), lend=lend))
    assert summary["trajectories_completed"] == expected_trajectories(cfg.workload)
    assert summary["trajectories_failed"] == 0
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written.pop("units")["makespan_s"] == "s" and written == summary  # the file adds the units
