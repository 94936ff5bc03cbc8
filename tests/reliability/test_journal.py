"""The run journal alone: what a killed session leaves is either listed whole or dropped."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from prorsa.agent.loop import TrajectoryResult, TurnResult
from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.cli import main
from prorsa.metrics.journal import MANIFEST, JournalError, RunJournal


def result(i: int, status: str = "completed") -> TrajectoryResult:
    spec = TrajectorySpec(f"t{i}", "swe", i, 0, 0, (TurnSpec(10, 5, 0.0, True),), seed=i)
    return TrajectoryResult(spec, [TurnResult(f"t{i}", 0, "engine-0", "engine-1", 10, 0, 5)], status=status)


def test_parts_listed_in_the_manifest_survive_a_new_session(tmp_path):
    j = RunJournal.open(tmp_path, "h", batch=2, flush_s=60)
    for i in range(5):
        j.add(result(i, "failed" if i == 4 else "completed"))
    assert j.committed == 4  # two full batches; the fifth waits in the buffer
    j.close()  # a kill: the buffered one is not saved
    j = RunJournal.open(tmp_path, "h", batch=2, flush_s=60)
    assert j.done_ids == {"t0", "t1", "t2", "t3"} and j.completed_before == 4
    j.add(result(4, "failed"))
    out = j.finish()
    assert [r["traj_id"] for r in pq.read_table(out).to_pylist()] == ["t0", "t1", "t2", "t3", "t4"]
    # not complete until the run's other files are written: a kill here leaves a run to resume
    assert json.loads((tmp_path / MANIFEST).read_text())["complete"] is False
    j.close()
    j = RunJournal.open(tmp_path, "h", batch=2, flush_s=60)
    assert not j.complete and j.done_ids == {f"t{i}" for i in range(5)}
    j.finish()
    j.seal()
    assert json.loads((tmp_path / MANIFEST).read_text())["complete"] is True


def test_a_part_written_before_the_manifest_update_is_dropped(tmp_path):
    j = RunJournal.open(tmp_path, "h", batch=1, flush_s=60)
    j.add(result(0))
    manifest = (tmp_path / MANIFEST).read_text()
    j.add(result(1))
    j.close()
    (tmp_path / MANIFEST).write_text(manifest)  # as if killed between the part and the manifest
    j = RunJournal.open(tmp_path, "h", batch=1, flush_s=60)
    assert j.done_ids == {"t0"}
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["part-000000.parquet"]
    j.add(result(1))  # runs again, into the part name the dropped one had
    assert [r["traj_id"] for r in pq.read_table(j.finish()).to_pylist()] == ["t0", "t1"]


def test_a_trajectory_is_journaled_once(tmp_path):
    j = RunJournal.open(tmp_path, "h")
    j.add(result(0))
    with pytest.raises(ValueError, match="finished twice"):
        j.add(result(0))


def test_one_session_per_run_directory(tmp_path):
    j = RunJournal.open(tmp_path, "h")
    with pytest.raises(JournalError, match="another prorsa run"):
        RunJournal.open(tmp_path, "h")
    j.close()
    RunJournal.open(tmp_path, "h").close()


@pytest.mark.parametrize("damage,needle", [
    (lambda d: (d / MANIFEST).write_text("{not json"), "unreadable"),
    (lambda d: (d / MANIFEST).write_text('{"version": 1, "config_hash": "h", "complete": false, '
                                         '"parts": [{"file": "../../etc/passwd", "rows": 1}]}'), "not a prorsa manifest"),
    (lambda d: (d / "parts" / "part-000000.parquet").write_bytes(b"PAR1 garbage"), "unreadable"),
    (lambda d: (d / MANIFEST).write_text((d / MANIFEST).read_text().replace('"rows": 1', '"rows": 2')), "says 2"),
])
def test_a_damaged_run_directory_is_refused(tmp_path, damage, needle):
    j = RunJournal.open(tmp_path, "h", batch=1)
    j.add(result(0))
    j.close()
    damage(tmp_path)
    with pytest.raises(JournalError, match=needle):
        RunJournal.open(tmp_path, "h")


def test_another_pipeline_is_refused(tmp_path):
    j = RunJournal.open(tmp_path, "h", batch=1)
    j.add(result(0))
    j.close()
    with pytest.raises(JournalError, match="no longer matches"):
        RunJournal.open(tmp_path, "other")


def _run(*args):
    r = CliRunner().invoke(main, ["run", *args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def test_resume_refuses_bad_input_in_one_line(tmp_path):
    assert "give a PIPELINE" in _run().output
    r = _run("--resume", str(tmp_path / "absent"))
    assert r.exit_code == 2 and r.output.startswith("error: ") and "no such run directory" in r.output
    r = _run("--resume", str(tmp_path))
    assert r.exit_code == 2 and "pipeline.json: cannot read" in r.output
    (tmp_path / "pipeline.json").write_text('{"name": "x", "engines": {"count": "many"}}')
    r = _run("--resume", str(tmp_path))
    assert r.exit_code == 2 and "engines.count" in r.output and r.output.count("\n") == 1
    r = _run("--resume", str(tmp_path), "--policy", "colocated")
    assert r.exit_code == 2 and "drop --engine" in r.output
    (tmp_path / "pipeline.json").write_text('{"name": "x", "workload": {"mode": "async", "duration_s": 5}}')
    r = _run("--resume", str(tmp_path))
    assert r.exit_code == 2 and "cannot be resumed" in r.output
