"""Every number a run directory stores says its unit, and every time says its clock."""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from prorsa.config.pipeline import PipelineConfig
from prorsa.metrics.outputs import metrics_dataset
from prorsa.sim.run import simulate, write_run

CFG = {"name": "units", "policy": "prorsa",
       "engines": {"backend": "emulated", "count": 3, "slots": 8, "model": "qwen3-30b-a3b", "ep": 4},
       "workload": {"family": "swe", "prompts": 4, "group_size": 4, "max_turns": 4}}


def test_every_numeric_variable_of_metrics_nc_has_units_and_a_long_name(tmp_path):
    sim = simulate(PipelineConfig.model_validate(CFG))
    write_run(sim, tmp_path)
    ds = xr.load_dataset(tmp_path / "metrics.nc")
    assert ds.sizes["control"] > 0 and ds.sizes["trajectory"] == 16
    numeric = [v for v in ds.variables if np.issubdtype(ds[v].dtype, np.number) or ds[v].dtype == bool]
    assert {"time", "role", "traj_end_s", "control_t", "forecast_mape"} <= set(numeric)
    assert [v for v in numeric if not ds[v].attrs.get("units") or not ds[v].attrs.get("long_name")] == []
    # simulated: one clock, the cost model's
    assert "body seconds" in ds.time.attrs["long_name"] and ds.attrs["time_scale"] == 1.0
    assert ds.role.attrs["flag_meanings"] == "prefill decode mixed" and list(ds.role.attrs["flag_values"]) == [0, 1, 2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["clock"] == "body" and summary["backend"] == "emulated"


def test_a_live_run_names_its_two_clocks(tmp_path):
    sim = simulate(PipelineConfig.model_validate(CFG))
    ds = metrics_dataset(sim.recorder, {}, time_scale=0.5)
    assert ds.time.attrs["long_name"].startswith("when the engines were sampled: wall seconds")
    assert "wall seconds / time_scale" in ds.control_t.attrs["long_name"] and ds.attrs["time_scale"] == 0.5
