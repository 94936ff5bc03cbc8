"""`prorsa run` of a pipeline with runtime.cells: 2: the run folder a one-cell run writes, every
trajectory once in it from both cells, and the summary saying how the cells split and what moved."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import xarray as xr
import yaml
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.config.pipeline import PipelineConfig

REPO = Path(__file__).resolve().parents[2]
TINY = {
    "name": "tiny-cells", "policy": "colocated",
    "engines": {"backend": "emulated", "count": 2, "slots": 4, "time_scale": 0.0},
    "workload": {"family": "search", "prompts": 2, "group_size": 2, "max_turns": 2, "tool_time_scale": 0.0},
    "runtime": {"dashboard_address": None, "cells": 2},
}  # fmt: skip


def _run(pipeline: Path, out: Path) -> dict:
    r = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(out)])
    assert r.exit_code == 0, (r.output, r.exception)
    for name in ("pipeline.json", "manifest.json", "trajectories.parquet", "metrics.nc", "summary.json"):
        assert (out / name).is_file(), name
    return json.loads((out / "summary.json").read_text())


def _served_by(out: Path) -> tuple[list[str], set[str]]:
    rows = pq.read_table(out / "trajectories.parquet").to_pylist()
    engines = {t[k] for r in rows for t in r["turns"] for k in ("prefill_engine", "decode_engine")} - {""}  # "": no leg of that kind
    return [r["traj_id"] for r in rows], engines


def test_run_writes_one_folder_from_both_cells(tmp_path):
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(TINY))
    summary = _run(f, tmp_path / "out")
    ids, engines = _served_by(tmp_path / "out")
    assert len(ids) == len(set(ids)) == 4 == summary["trajectories_completed"]
    assert engines == {"engine-0", "engine-1"}  # one a cell
    assert summary["cells"]["count"] == 2 and summary["cells"]["trajectories"] == [2, 2]
    assert summary["cells"]["engines"] == [["engine-0"], ["engine-1"]] and summary["moves"] == []
    with xr.open_dataset(tmp_path / "out" / "metrics.nc") as ds:
        assert sorted(ds.engine.values) == ["engine-0", "engine-1"] and ds.sizes["trajectory"] == 4


@pytest.mark.slow
def test_the_cells_pipeline_moves_an_engine(tmp_path):
    summary = _run(REPO / "pipelines" / "cells.yaml", tmp_path / "out")
    ids, engines = _served_by(tmp_path / "out")
    assert len(ids) == len(set(ids)) == 192 == summary["trajectories_completed"]
    assert summary["cells"]["trajectories"] == [128, 64]
    assert len(summary["moves"]) >= 1  # cell 0 has twice the work: it takes an engine
    move = summary["moves"][0]
    assert move["engine"] in summary["cells"]["engines"][move["source"]]
    assert move["engine"] in summary["cells"]["engines_at_end"][move["target"]]
    assert engines == {f"engine-{i}" for i in range(6)}


def _stealing(dask_scheduler=None) -> bool:
    return "stealing" in dask_scheduler.extensions


@pytest.mark.parametrize("processes", [False, True])
def test_a_cells_scheduler_runs_in_its_own_process_with_processes(tmp_path, processes):
    from prorsa.live.cells import LiveCell
    from prorsa.rollout.cells import plan_cells
    from prorsa.rollout.context import resolve

    cfg = PipelineConfig.model_validate({**TINY, "runtime": {**TINY["runtime"], "processes": processes}})
    plan = plan_cells(cfg, 2)

    async def look():
        cell = LiveCell(0, cfg, resolve(plan.configs[0]), plan.names[0], plan.placed[0], tmp_path, 0.0)
        async with cell.up():
            return (await cell.client.run_on_scheduler(os.getpid), await cell.client.run_on_scheduler(_stealing),
                    sorted(cell.addresses))

    pid, stealing, engines = asyncio.run(asyncio.wait_for(look(), 120))
    assert (pid != os.getpid()) == processes
    assert not stealing and engines == ["engine-0"]  # the driver's scheduler config, in its process too
