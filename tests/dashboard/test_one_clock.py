"""The dashboard, metrics.nc and the report put a role switch at one time: wall seconds since the
rollout began, whatever the engines' time scale."""

import json

import pytest
import xarray as xr

from prorsa.config.pipeline import PipelineConfig
from prorsa.dashboard.feed import DashboardFeed
from prorsa.dashboard.state import LiveState
from prorsa.report.figures import switches
from prorsa.metrics.outputs import metrics_dataset, summarise, write_dataset, write_summary, write_trajectories
from prorsa.report.document import write_report
from prorsa.report.rundata import load_run
from prorsa.sim.run import simulate
from prorsa.rollout.context import resolve
from tests.sim_output import SWITCHING

SCALE = 0.5  # wall seconds per body second: the controller stamps its records at twice the wall time
CFG = SWITCHING | {"name": "clock"}


def test_a_switch_has_one_time_on_the_page_in_metrics_nc_and_in_the_report(tmp_path):
    rec = simulate(resolve(PipelineConfig.model_validate(CFG))).recorder
    assert rec.role_changes  # stamped in body seconds, as a live controller stamps them
    state = LiveState({"name": "clock", "policy": "prorsa", "engines": rec.engines, "slots": 128,
                       "kv_capacity": 1000, "time_unit": SCALE, "expected": 64})
    feed = DashboardFeed(rec, lambda: rec.controls[-1].t)
    state.fold(rec.controls[-1].t * SCALE, [], {}, feed.report())
    page = json.loads(json.dumps(state.to_json(), allow_nan=False))
    assert page["run"]["clock"].startswith("wall seconds")

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "pipeline.json").write_text(json.dumps({"engines": {"backend": "emulated", "time_scale": SCALE}}))
    write_trajectories(run_dir / "trajectories.parquet", rec.trajectories)
    write_dataset(run_dir / "metrics.nc", metrics_dataset(rec, {"name": "clock", "policy": "prorsa"}, SCALE))
    write_summary(run_dir / "summary.json", summarise(rec, 10.0, "prorsa", "0" * 16, "clock"))
    ds = xr.load_dataset(run_dir / "metrics.nc")
    reported = switches(load_run(run_dir))

    expected = [c.t * SCALE for c in rec.role_changes]
    assert [c["t"] for c in page["switches"]] == expected
    assert list(ds.switch_time_s.values) == expected
    assert [s.t for s in reported] == pytest.approx(expected)
    assert [c["drain_s"] for c in page["switches"]] == pytest.approx([s.drain_s for s in reported])
    assert page["decision"]["t"] == pytest.approx(float(ds.control_t.values[-1]))

    md = write_report([run_dir], [], tmp_path / "report").read_text()
    rows = md.split("| t (wall s) |", 1)[1].splitlines()[2:2 + len(expected)]
    assert [float(r.split("|")[1]) for r in rows] == pytest.approx(expected, rel=1e-3)
