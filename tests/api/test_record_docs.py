"""Records that document themselves: help() on Trajectory, Turn and RunSummary says what every
field means, Rollout has a class docstring, and a trajectory's status is an enum whose values
survive trajectories.parquet and summary.json."""

from __future__ import annotations

import dataclasses
import json
import pydoc
import re

import pyarrow.parquet as pq
import pytest

from prorsa.agent.loop import TrajectoryResult, TrajectoryStatus
from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.api import Rollout, Trajectory, Turn
from prorsa.api.records import trajectory_of
from prorsa.metrics.outputs import write_trajectories
from prorsa.metrics.summary import RunSummary
from tests.sim_output import sim_output

PIPELINE = ("name: docs\nengines: {backend: emulated, count: 2, slots: 8}\npolicy: static:1:1\n"
            "workload: {family: swe, prompts: 2, group_size: 2, max_turns: 3}\n")


def help_text(obj) -> str:
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


@pytest.mark.parametrize("record", [Trajectory, Turn, RunSummary])
def test_help_says_what_every_field_means(record):
    text = help_text(record)
    for field in dataclasses.fields(record):
        line = re.search(rf"^ \|\s+{field.name}: (.+)$", text, re.M)
        assert line and len(line.group(1).split()) >= 2, f"{record.__name__}.{field.name} has no doc in help()"


def test_rollout_has_a_class_docstring():
    doc = Rollout.__doc__ or ""
    assert "generate" in doc and "update_weights" in doc and "stream" in doc
    assert doc.strip().splitlines()[0] in help_text(Rollout)


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    (run_dir,) = (sim_output(tmp_path_factory.mktemp("sim"), PIPELINE, "static:1:1") / "runs").iterdir()
    return run_dir


def test_status_values_round_trip_through_parquet(sim_run, tmp_path):
    stored = pq.read_table(sim_run / "trajectories.parquet", columns=["status"]).column("status").to_pylist()
    assert stored and {TrajectoryStatus(s) for s in stored} == {TrajectoryStatus.COMPLETED}
    spec = TrajectorySpec("s0-p0-g0", "swe", 0, 0, 0, (TurnSpec(5, 2, 0.0, True),), 1)
    results = [TrajectoryResult(spec, status=s) for s in TrajectoryStatus]
    write_trajectories(tmp_path / "t.parquet", results)
    back = pq.read_table(tmp_path / "t.parquet", columns=["status"]).column("status").to_pylist()
    assert back == [s.value for s in TrajectoryStatus] and [TrajectoryStatus(b) for b in back] == list(TrajectoryStatus)
    assert all(b == s for b, s in zip(back, TrajectoryStatus))  # a str: compares with the plain word


def test_the_api_record_carries_the_enum(sim_run):
    spec = TrajectorySpec("s0-p0-g0", "swe", 0, 0, 0, (TurnSpec(5, 2, 0.0, True),), 1)
    t = trajectory_of(TrajectoryResult(spec, status="failed", error="engine gone"))
    assert t.status is TrajectoryStatus.FAILED and t.status == "failed" and f"{t.status}" == "failed"
    assert json.dumps({"status": t.status}) == '{"status": "failed"}'


def test_run_summary_round_trips_through_summary_json(sim_run):
    data = json.loads((sim_run / "summary.json").read_text())
    summary = RunSummary.of(data)
    assert summary.trajectories_completed == 4 and summary.policy == "static:1:1"
    assert {k: data[k] for k in summary.as_dict()} == summary.as_dict()
    assert RunSummary.of(json.loads(json.dumps(summary.as_dict()))) == summary
