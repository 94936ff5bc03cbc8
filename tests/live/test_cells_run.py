"""`prorsa run` of a pipeline with runtime.cells: 2: the run folder a one-cell run writes, every
trajectory once in it from both cells, and the summary saying how the cells split and what moved."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import xarray as xr
import yaml
from click.testing import CliRunner

from prorsa.cli import main

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
    assert len(ids) == len(set(ids)) == 128 == summary["trajectories_completed"]
    assert summary["cells"]["trajectories"] == [64, 64]
    assert len(summary["moves"]) >= 1  # the first group runs longer: its cell takes an engine
    move = summary["moves"][0]
    assert move["engine"] in summary["cells"]["engines"][move["source"]]
    assert move["engine"] in summary["cells"]["engines_at_end"][move["target"]]
    assert engines == {f"engine-{i}" for i in range(6)}
