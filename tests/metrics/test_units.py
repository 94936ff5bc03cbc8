"""Every number a run directory stores says its unit, and every time says its clock."""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from prorsa.config.pipeline import PipelineConfig
from prorsa.metrics.outputs import metrics_dataset
from prorsa.sim.run import simulate, write_run
from prorsa.rollout.context import resolve
from tests.sim_output import SWITCHING

CFG = {"name": "units", "policy": "prorsa",
       "engines": {"backend": "emulated", "count": 3, "slots": 8, "model": "qwen3-30b-a3b", "ep": 4},
       "workload": {"family": "swe", "prompts": 4, "group_size": 4, "max_turns": 4}}


def test_every_variable_of_metrics_nc_has_a_long_name_and_every_number_units(tmp_path):
    sim = simulate(resolve(PipelineConfig.model_validate(CFG)))
    write_run(sim, tmp_path)
    ds = xr.load_dataset(tmp_path / "metrics.nc")
    assert ds.sizes["control"] > 0 and ds.sizes["trajectory"] == 16
    numeric = [v for v in ds.variables if np.issubdtype(ds[v].dtype, np.number) or ds[v].dtype == bool]
    assert {"time", "role", "traj_end_s", "control_t", "forecast_mape"} <= set(numeric)
    assert [v for v in numeric if not ds[v].attrs.get("units") or not ds[v].attrs.get("long_name")] == []
    assert [v for v in ds.variables if not ds[v].attrs.get("long_name")] == []  # text too (CF: no units)
    # simulated: one clock, the cost model's
    assert "body seconds" in ds.time.attrs["long_name"] and ds.attrs["time_scale"] == 1.0
    assert ds.role.attrs["flag_meanings"] == "prefill decode mixed" and list(ds.role.attrs["flag_values"]) == [0, 1, 2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["clock"] == "body" and summary["backend"] == "emulated"


def test_a_live_run_stores_every_time_on_the_wall_clock(tmp_path):
    sim = simulate(resolve(PipelineConfig.model_validate(SWITCHING)))
    rec = sim.recorder
    assert rec.role_changes and rec.controls  # the controller's records are stamped in body seconds
    ds = metrics_dataset(rec, {}, time_scale=0.5)
    assert ds.attrs["clock"] == "wall" and ds.attrs["time_scale"] == 0.5
    for name in ("time", "traj_end_s", "control_t", "switch_time_s"):
        assert "wall seconds since the rollout began" in ds[name].attrs["long_name"], name
    assert "body" not in ds.control_t.attrs["long_name"] + ds.switch_time_s.attrs["long_name"]
    assert list(ds.control_t.values) == [c.t * 0.5 for c in rec.controls]
    assert list(ds.switch_time_s.values) == [c.t * 0.5 for c in rec.role_changes]
    assert list(ds.switch_drain_s.values) == [c.drain_s * 0.5 for c in rec.role_changes]
    assert list(ds.time.values) == sorted({s.t for s in rec.samples})  # the sampler's stamps: already wall


def test_summary_json_names_the_unit_of_every_figure_and_parquet_its_columns(tmp_path):
    import pyarrow.parquet as pq

    sim = simulate(resolve(PipelineConfig.model_validate(CFG)))
    write_run(sim, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    units = summary["units"]
    assert summary["time_scale"] == 1.0 and "body seconds" in units["clock"]
    numbers = [k for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and k not in ("config_hash",)]
    assert [k for k in numbers if k not in units] == []
    assert units["tokens_per_s"] == "tokens/s" and units["makespan_s"] == "s"
    schema = pq.read_schema(tmp_path / "trajectories.parquet")
    turn = schema.field("turns").type.value_type
    fields = [schema.field(n) for n in schema.names] + [turn.field(i) for i in range(turn.num_fields)]
    assert [f.name for f in fields if not (f.metadata or {}).get(b"description")] == []
    assert schema.field("end_s").metadata[b"unit"] == b"s" and turn.field("decode_tokens").metadata[b"unit"] == b"tokens"
