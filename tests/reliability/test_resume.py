"""SIGKILL the driver mid-run, then `prorsa run --resume`: every trajectory exactly once."""

from __future__ import annotations

import json
import signal
import time

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.metrics.journal import MANIFEST

from runs import (assert_exactly_once, expected_specs, finish, kill_group, prorsa, start, wait_for,
                  write_pipeline)


def _committed(run_dir) -> int:
    try:
        return json.loads((run_dir / MANIFEST).read_text())["trajectories"]
    except (OSError, ValueError, KeyError):
        return 0


def test_sigkilled_driver_resumes_to_every_trajectory_exactly_once(tmp_path):
    pipeline = write_pipeline(tmp_path / "p.yaml")
    specs = expected_specs(pipeline)
    out = tmp_path / "runs"
    proc = start("run", str(pipeline), f"output_dir={out}")
    run_dir = wait_for(lambda: next(iter(out.glob("rel-*")), None), 60, proc)
    t0 = time.monotonic()
    wait_for(lambda: _committed(run_dir) >= 3, 120, proc)
    kill_group(proc)
    print(f"killed {time.monotonic() - t0:.1f} s after the run directory appeared")

    saved = _committed(run_dir)
    assert 3 <= saved < len(specs), "killed too late to leave work for the resume"
    assert not (run_dir / "trajectories.parquet").exists()
    # the parts the manifest lists: one written but not yet listed when the kill landed is not
    # saved, and the resume runs its trajectories again
    listed = [run_dir / part["file"] for part in json.loads((run_dir / MANIFEST).read_text())["parts"]]
    before = {r["traj_id"]: r for p in listed for r in pq.read_table(p).to_pylist()}

    t0 = time.monotonic()
    resumed = prorsa("run", "--resume", str(run_dir))
    print(f"resumed in {time.monotonic() - t0:.1f} s")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{saved} trajectories saved earlier" in resumed.stdout

    rows = assert_exactly_once(run_dir, specs)
    # what the killed session saved is kept as it was, not run again
    kept = {r["traj_id"]: r for r in rows if r["traj_id"] in before}
    assert len(kept) >= saved
    assert json.dumps(kept, sort_keys=True) == json.dumps({k: before[k] for k in kept}, sort_keys=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_resumed"] == saved
    assert summary["trajectories_completed"] == len(specs) and summary["trajectories_failed"] == 0
    manifest = json.loads((run_dir / MANIFEST).read_text())
    assert manifest["complete"] is True
    # every figure covers both sessions: the turns of every trajectory, once; the time of both
    assert summary["turns"] == sum(len(r["turns"]) for r in rows) == sum(len(s.turns) for s in specs.values())
    assert summary["decode_tokens"] == sum(t["decode_tokens"] for r in rows for t in r["turns"])
    killed, this = manifest["sessions"]
    assert killed > 0 and killed < summary["makespan_s"] <= killed + this + 1e-3
    assert summary["trajectories_per_s"] == pytest.approx(len(specs) / summary["makespan_s"], rel=1e-3)

    again = CliRunner().invoke(main, ["run", "--resume", str(run_dir)])
    assert again.exit_code == 0 and "nothing left to run" in again.output


# what the workload fixes (the tokens each turn appends and decodes), not what placement or a
# cold cache after the resume changes (cached and recomputed tokens)
COUNTS = ("trajectories_completed", "trajectories_failed", "turns", "prefill_tokens", "decode_tokens")


def test_an_interrupted_and_resumed_run_counts_what_an_uninterrupted_one_does(tmp_path):
    pipeline = write_pipeline(tmp_path / "p.yaml")
    whole = prorsa("run", str(pipeline), f"output_dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    expected = json.loads(next((tmp_path / "whole").glob("rel-*/summary.json")).read_text())

    out = tmp_path / "parts"
    proc = start("run", str(pipeline), f"output_dir={out}")
    run_dir = wait_for(lambda: next(iter(out.glob("rel-*")), None), 60, proc)
    wait_for(lambda: _committed(run_dir) >= 3, 120, proc)
    proc.send_signal(signal.SIGINT)  # Ctrl-C this time: the session flushes what finished and stops
    text = finish(proc, timeout=60)
    assert proc.returncode == 2 and "error: interrupted; finished trajectories kept in" in text, text
    saved = _committed(run_dir)
    assert 3 <= saved < expected["trajectories_completed"], "interrupted too late to leave work for the resume"

    resumed = prorsa("run", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_resumed"] == saved
    assert {k: summary[k] for k in COUNTS} == {k: expected[k] for k in COUNTS}
